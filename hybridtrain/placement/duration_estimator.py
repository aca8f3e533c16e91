"""DurationEstimator: the engine's own guess of a job's run time, from what the user declared and what past runs took.

Placement never sees a job's true duration — only the hard limit the user declared
(``resources.max_hours``) and what finished runs of the same class actually used. Two estimators:

- ``DeclaredLimit`` — the declared limit itself (an upper bound: safe, but it makes queues
  look longer than they are).
- ``HistoryQuantile`` — the declared limit scaled by a quantile of ``actual / declared`` over the
  last finished runs of the same job (its *family*: the live engine keys history by the job
  spec's name, and every trial of a sweep is the same job) once ``family_min_samples`` of them
  have finished, else of its job class; with few samples of either it falls back to the limit.

Example: five finished "standard" runs used 20%, 30%, 40%, 50% and 90% of their limits; with
``quantile=0.75`` and ``min_samples=5`` a new run declaring 8 h is estimated at 8 × 0.5 = 4 h.
Once three runs of its own job have finished, using 100%, 35% and 100%, the same run is
estimated from those: 8 × 1.0 = 8 h — the class says little about a job that always runs to
its limit.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

#: The quantile of its history the live engine plans a run with (``stages.estimate_run_hours``).
PLAN_QUANTILE = 0.9


class DurationEstimator(Protocol):
    def estimate(self, declared_hours: float, job_class: str | None = None, *, family: str | None = None) -> float:
        """Expected run hours of a job that declared ``declared_hours`` as its limit (``family``: the
        job it is a run of, when known)."""
        ...


@dataclass(frozen=True)
class DeclaredLimit:
    """Estimate = the declared hard limit (times ``factor``, at most the limit)."""

    factor: float = 1.0

    def estimate(self, declared_hours: float, job_class: str | None = None, *, family: str | None = None) -> float:
        return declared_hours * min(self.factor, 1.0)


@dataclass
class _Window:
    """The last ``size`` ratios, kept sorted for quantiles."""

    size: int
    ordered: list[float] = field(default_factory=list)
    arrivals: deque[float] = field(default_factory=deque)

    def add(self, ratio: float) -> None:
        bisect.insort(self.ordered, ratio)
        self.arrivals.append(ratio)
        if len(self.arrivals) > self.size:
            del self.ordered[bisect.bisect_left(self.ordered, self.arrivals.popleft())]

    def at(self, q: float) -> float:
        return self.ordered[min(len(self.ordered) - 1, int(q * len(self.ordered)))]


@dataclass
class HistoryQuantile:
    """Estimate = declared limit × the ``quantile`` of actual/declared over recent runs of the job's
    family (from ``family_min_samples`` of them on), else of its class (from ``min_samples`` on)."""

    quantile: float = 0.75
    min_samples: int = 20
    window: int = 500
    family_min_samples: int = 3  # as the live engine's per-job estimate (``stages.estimate_run_hours``)
    _classes: dict[str | None, _Window] = field(default_factory=dict, repr=False)
    _families: dict[str, _Window] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")

    def observe(self, declared_hours: float, actual_hours: float, job_class: str | None = None, *,
                family: str | None = None) -> None:
        """Record one finished run (its declared limit and the hours it actually ran)."""
        ratio = min(max(actual_hours / declared_hours, 1e-4), 1.0) if declared_hours > 0 else 1.0
        self._classes.setdefault(job_class, _Window(self.window)).add(ratio)
        if family is not None:
            self._families.setdefault(family, _Window(self.window)).add(ratio)

    def ratio(self, job_class: str | None = None, quantile: float | None = None, *, family: str | None = None) -> float:
        """The actual/declared ratio at ``quantile`` (default: this estimator's) for the family once
        ``family_min_samples`` of its runs have finished, else for the class once ``min_samples``
        have; 1.0 before that."""
        q = self.quantile if quantile is None else quantile
        own = self._families.get(family) if family is not None else None
        if own is not None and len(own.ordered) >= self.family_min_samples:
            return own.at(q)
        peers = self._classes.get(job_class)
        if peers is None or len(peers.ordered) < self.min_samples:
            return 1.0
        return peers.at(q)

    def estimate(self, declared_hours: float, job_class: str | None = None, quantile: float | None = None, *,
                 family: str | None = None) -> float:
        return declared_hours * self.ratio(job_class, quantile, family=family)


def plan_hours(estimate_h: float, declared_h: float, time_left_h: float | None = None) -> float:
    """The hours to plan a run with: the estimate, never above the declared limit nor — with a
    deadline — above the time left until it.

    A deadline nearer than the estimate says the run is shorter than its class's history suggests
    (whoever set the deadline expects it to be met) or that it is late wherever it goes; either
    way planning with the time left gives it its only chance, an immediate on-prem start, instead
    of writing it off as late everywhere. Never below a second, so every run takes some time.

    Example: declared 4 h, history says 2 h, deadline in 30 minutes → plan 0.5 h.
    """
    hours = min(estimate_h, declared_h)
    if time_left_h is not None:
        hours = min(hours, time_left_h)
    return max(hours, 1.0 / 3600.0)
