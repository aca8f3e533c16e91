"""DurationEstimator: the engine's own guess of a job's run time, from what the user declared and what past runs took.

Placement never sees a job's true duration — only the hard limit the user declared
(``resources.max_hours``) and what finished runs of the same class actually used. Two estimators:

- ``DeclaredLimit`` — the declared limit itself (an upper bound: safe, but it makes queues
  look longer than they are).
- ``HistoryQuantile`` — the declared limit scaled by a quantile of ``actual / declared`` over the
  last finished runs of the same job class. With few samples it falls back to the limit.

Example: five finished "standard" runs used 20%, 30%, 40%, 50% and 90% of their limits; with
``quantile=0.75`` and ``min_samples=5`` a new run declaring 8 h is estimated at 8 × 0.5 = 4 h.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class DurationEstimator(Protocol):
    def estimate(self, declared_hours: float, job_class: str | None = None) -> float:
        """Expected run hours of a job that declared ``declared_hours`` as its limit."""
        ...


@dataclass(frozen=True)
class DeclaredLimit:
    """Estimate = the declared hard limit (times ``factor``, at most the limit)."""

    factor: float = 1.0

    def estimate(self, declared_hours: float, job_class: str | None = None) -> float:
        return declared_hours * min(self.factor, 1.0)


@dataclass
class HistoryQuantile:
    """Estimate = declared limit × the ``quantile`` of actual/declared over recent runs of the class."""

    quantile: float = 0.75
    min_samples: int = 20
    window: int = 500
    _ratios: dict[str | None, list[float]] = field(default_factory=dict, repr=False)
    _order: dict[str | None, deque[float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")

    def observe(self, declared_hours: float, actual_hours: float, job_class: str | None = None) -> None:
        """Record one finished run (its declared limit and the hours it actually ran)."""
        ratio = min(max(actual_hours / declared_hours, 1e-4), 1.0) if declared_hours > 0 else 1.0
        ratios = self._ratios.setdefault(job_class, [])
        order = self._order.setdefault(job_class, deque())
        bisect.insort(ratios, ratio)
        order.append(ratio)
        if len(order) > self.window:
            old = order.popleft()
            del ratios[bisect.bisect_left(ratios, old)]

    def ratio(self, job_class: str | None = None, quantile: float | None = None) -> float:
        """The actual/declared ratio at ``quantile`` (default: this estimator's) for the class;
        1.0 until ``min_samples`` runs of the class have finished."""
        ratios = self._ratios.get(job_class)
        if not ratios or len(ratios) < self.min_samples:
            return 1.0
        q = self.quantile if quantile is None else quantile
        return ratios[min(len(ratios) - 1, int(q * len(ratios)))]

    def estimate(self, declared_hours: float, job_class: str | None = None, quantile: float | None = None) -> float:
        return declared_hours * self.ratio(job_class, quantile)


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
