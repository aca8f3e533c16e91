"""SweepPlan: where a sweep's trials would run and what the sweep would cost, decided by the placement engine without running anything.

The sweep runs ``parallelism`` trials at a time. The plan places those concurrent trial slots one
after another with the trials' job class (``sweep.job_class``, opportunistic by default: spot
allowed), each slot seeing the ones placed before it as running in its site's pool — so a full
on-prem pool sends the next slot to the cloud. Every later trial takes the slot of one that ended.
The cost is an upper bound: every trial runs all its epochs for the engine's run-time estimate
(pruned trials cost less); the wall time is ``ceil(n_trials / parallelism)`` rounds of one trial.

``TrialDurations`` is that estimate while the sweep runs: learnt from the trials that ended.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from pydantic import BaseModel

from hybridtrain.placement.duration_estimator import PLAN_QUANTILE, HistoryQuantile
from hybridtrain.placement.queue_state import QueueState
from hybridtrain.specs.job import JobSpec


def trial_job(name: str) -> str:
    """The job the trials of every sweep of job ``name`` are runs of (their MLflow tag ``hybridtrain.job``)."""
    return f"{name}-trial"


class TrialDurations:
    """The hours the engine plans each of a sweep's trials with, learnt as trials end (thread-safe).

    A trial is not a run of the job's full lifecycle: it trains other values, and a pruned one stops
    after a few epochs, so the job's history can be far off for it (the simulator's sweep: the
    trace's class used half its limit, full trials all of it, and trials queued on-prem reached the
    cloud too late). Once three trials have ended — of earlier sweeps of the job (``earlier``, from
    MLflow) and of this one (``observe``) — the estimate is the planning quantile of theirs, as
    ``stages.estimate_run_hours`` is of a job's runs; before that, the job's own estimate
    (``job_hours``; None: its declared limit).

    Example: declared 2 h, job estimate 1 h; trials end after 2 h, 0.7 h (pruned) and 2 h → 2 h.
    """

    def __init__(self, declared_hours: float, job_hours: float | None = None, earlier: Sequence[float] = ()):
        self.declared_hours, self.job_hours = declared_hours, job_hours
        self._history = HistoryQuantile(quantile=PLAN_QUANTILE)
        self._ended = 0
        self._lock = threading.Lock()
        for hours in earlier:
            self.observe(hours)

    def observe(self, hours: float) -> None:
        """One trial ended (complete or pruned) after training ``hours``."""
        with self._lock:
            self._history.observe(self.declared_hours, hours, family="trials")
            self._ended += 1

    def run_hours(self) -> float | None:
        with self._lock:
            if self._ended < self._history.family_min_samples:
                return self.job_hours
            return self._history.estimate(self.declared_hours, family="trials")


class SlotPlan(BaseModel):
    slot: int
    site: str
    capacity_class: str
    trials: int
    cost_per_trial_usd: float
    reasons: list[str]


class SweepPlan(BaseModel):
    """The plan ``hybridtrain sweep --plan`` prints."""

    job: str
    study: str
    n_trials: int
    parallelism: int
    job_class: str
    run_hours: float
    slots: list[SlotPlan]
    rejected: dict[str, str]

    @property
    def cost_usd(self) -> float:
        return math.fsum(s.trials * s.cost_per_trial_usd for s in self.slots)

    @property
    def hours(self) -> float:
        return math.ceil(self.n_trials / self.parallelism) * self.run_hours

    def by_site(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.slots:
            key = f"{s.site} ({s.capacity_class})"
            out[key] = out.get(key, 0) + s.trials
        return out


def trial_placement_spec(spec: JobSpec) -> JobSpec:
    """The spec as the engine sees each trial: the sweep's job class."""
    if spec.sweep is None:
        raise ValueError(f"job {spec.name} has no sweep section")
    return spec.model_copy(update={"placement": spec.placement.model_copy(update={"job_class": spec.sweep.job_class})})


def plan_sweep(spec: JobSpec, sites, policy, *, dataset_bytes: int, now: datetime,
               queues: dict[str, QueueState] | None = None, run_hours: float | None = None,
               study: str | None = None) -> SweepPlan:
    """Place the sweep's concurrent trial slots (pure: queues, clock and estimate passed in)."""
    from hybridtrain.placement.engine import Placement
    from hybridtrain.placement.request import request_from_spec

    if spec.sweep is None:
        raise ValueError(f"job {spec.name} has no sweep section")
    sweep = spec.sweep
    tspec = trial_placement_spec(spec)
    engine = Placement(sites, policy)
    queues = dict(queues or {})
    for site in sites.sites:
        queues.setdefault(site.name, QueueState(site.name, site.gpu_count))
    request = request_from_spec(tspec, dataset_bytes=dataset_bytes, now=now, run_hours=run_hours,
                                job_class=sweep.job_class)
    width = min(sweep.parallelism, sweep.n_trials)
    rounds, extra = divmod(sweep.n_trials, width)
    slots: list[SlotPlan] = []
    rejected: dict[str, str] = {}
    for i in range(width):
        decision = engine.decide(request, now=now.timestamp(), queues=queues)
        rejected.update(decision.rejected)
        q = queues[decision.site]
        gpus = max(1, tspec.resources.gpus)
        queues[decision.site] = replace(q, gpus_in_use=q.gpus_in_use + gpus, running=q.running + 1,
                                        expected_wait_s=None, _waits={})
        slots.append(SlotPlan(slot=i + 1, site=decision.site, capacity_class=decision.capacity_class.value,
                              trials=rounds + (1 if i < extra else 0), cost_per_trial_usd=decision.cost_usd,
                              reasons=decision.reasons))
    return SweepPlan(job=spec.name, study=study or sweep.study_name or f"{spec.name}-sweep", n_trials=sweep.n_trials,
                     parallelism=width, job_class=sweep.job_class, run_hours=request.run_hours, slots=slots,
                     rejected=rejected)
