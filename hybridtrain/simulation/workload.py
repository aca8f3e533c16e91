"""Workload: the training jobs the simulator replays, made from the Alibaba GPU pod trace with fixed, seeded draws.

From pods to jobs:

- every pod that asked for a GPU and was scheduled becomes one job (Pending pods never ran);
  Running, Succeeded and Failed pods all used their GPUs, so all are kept;
- arrival = the pod's creation time; true run time = deletion − scheduled time; GPUs =
  ``num_gpu`` (a fractional, shared GPU counts as one — sites here hand out whole GPUs);
- pods cut off by the end of observation (deletion at the last timestamp) and pods that ran
  longer than ``max_run_hours`` (long-lived services, not training) are dropped;
- job class from the pod's QoS: ``LS``/``Guaranteed`` → production, ``Burstable`` → standard,
  ``BE`` (best effort) → opportunistic (may use spot).

Drawn per job, from ``numpy.random.default_rng(seed)`` in pod order:

- the user's declared limit (``resources.max_hours``): true hours × U(1, ``declare_max``),
  rounded up to the next of ``HOUR_GRID`` — users round up and over-ask, never under-ask (the
  limit is enforced);
- sensitivity: restricted / confidential / internal / public with ``sensitivity_shares``
  (10 / 30 / 45 / 15 %);
- deadline (``deadline_regime="loose"``, the default): per class, a share of jobs get one at
  arrival + max(``min_deadline_h``, U(lo, hi) × declared hours); the rest rely on the policy's
  wait SLO. ``"tight"``: the same jobs get one at arrival + U(``tight_slack``) × their *true*
  hours (e.g. 1.2–3×), so a job that waits in a queue for long misses it;
- dataset size: log-normal (median ``dataset_median_gb``, σ ``dataset_sigma``), clipped to
  [``dataset_min_gb``, ``dataset_max_gb``]; checkpoints ``checkpoint_gb`` every 30 min.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hybridtrain.simulation.traces import Pod
from hybridtrain.specs.job import Sensitivity

HOUR_GRID = (0.25, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 72, 96, 120)
QOS_CLASS = {"LS": "production", "Guaranteed": "production", "Burstable": "standard", "BE": "opportunistic"}


@dataclass(frozen=True)
class WorkloadParams:
    """The fixed parameters of the pod → job conversion (change them and the results change)."""

    seed: int = 2024
    max_run_hours: float = 72.0
    declare_max: float = 3.0
    #: shares of restricted, confidential, internal, public (in that order)
    sensitivity_shares: tuple[float, float, float, float] = (0.10, 0.30, 0.45, 0.15)
    #: class → (share with a deadline, slack low, slack high) — slack multiplies declared hours
    deadlines: dict[str, tuple[float, float, float]] = field(default_factory=lambda: {
        "production": (1.0, 1.5, 3.0),
        "standard": (0.7, 2.0, 6.0),
        "opportunistic": (0.5, 3.0, 10.0),
    })
    min_deadline_h: float = 1.0
    #: "loose" (slack × declared hours) or "tight" (slack drawn from ``tight_slack`` × true hours)
    deadline_regime: str = "loose"
    tight_slack: tuple[float, float] = (1.2, 3.0)
    dataset_median_gb: float = 20.0
    dataset_sigma: float = 1.0
    dataset_min_gb: float = 0.5
    dataset_max_gb: float = 500.0
    checkpoint_gb: float = 2.0
    checkpoint_interval_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class SimJob:
    """One replayed job: what the trace says (arrival, GPUs, true hours) and what was drawn."""

    id: str
    arrival: float
    gpus: int
    true_hours: float
    declared_hours: float
    job_class: str
    sensitivity: Sensitivity
    deadline: float | None
    dataset_bytes: int
    checkpoint_bytes: int
    checkpoint_interval_s: float
    #: the job this is a run of (a sweep's trials share one), whose finished runs the engine's
    #: estimate learns from first (``HistoryQuantile``); None: a one-off, estimated from its class
    family: str | None = None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.true_hours


def round_up(hours: float) -> float:
    for h in HOUR_GRID:
        if hours <= h:
            return float(h)
    return float(HOUR_GRID[-1])


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What a trace says about one job before the seeded draws; a field given here is not drawn."""

    id: str
    arrival: float
    gpus: int
    true_hours: float
    job_class: str
    declared_hours: float | None = None
    sensitivity: Sensitivity | None = None
    deadline: float | None = None  # absolute, seconds on the trace's clock
    has_deadline: bool | None = None  # None: drawn by the class's share
    dataset_gb: float | None = None


def jobs_from_pods(pods: list[Pod], params: WorkloadParams = WorkloadParams()) -> list[SimJob]:
    """The simulator's jobs, sorted by arrival (see the module docstring for every rule)."""
    end = max(p.deletion for p in pods)
    records = []
    for pod in pods:
        if pod.num_gpu < 1 or pod.scheduled is None or pod.deletion >= end:
            continue
        hours = (pod.deletion - pod.scheduled) / 3600.0
        if hours <= 0 or hours > params.max_run_hours:
            continue
        records.append(JobRecord(pod.name, pod.creation, pod.num_gpu, hours, QOS_CLASS.get(pod.qos, "standard")))
    return jobs_from_records(records, params)


def jobs_from_records(records: list[JobRecord], params: WorkloadParams = WorkloadParams()) -> list[SimJob]:
    """Jobs from trace records, drawing what a record leaves open (see the module docstring), sorted by arrival."""
    rng = np.random.default_rng(params.seed)
    sens = [Sensitivity.restricted, Sensitivity.confidential, Sensitivity.internal, Sensitivity.public]
    shares = np.asarray(params.sensitivity_shares) / sum(params.sensitivity_shares)
    jobs = []
    for r in records:
        hours = r.true_hours
        # Draw every number for every record, in a fixed order, so one change does not shift the rest.
        u_declare, u_sens, u_has_deadline, u_slack = rng.random(4)
        gb = rng.lognormal(np.log(params.dataset_median_gb), params.dataset_sigma)
        declared = r.declared_hours if r.declared_hours is not None else \
            round_up(hours * (1.0 + u_declare * (params.declare_max - 1.0)))
        share, lo, hi = params.deadlines.get(r.job_class, params.deadlines["standard"])
        deadline = r.deadline
        has = r.has_deadline if r.has_deadline is not None else (deadline is not None or u_has_deadline < share)
        if has and deadline is None:
            if params.deadline_regime == "tight":
                t_lo, t_hi = params.tight_slack
                window_h = (t_lo + u_slack * (t_hi - t_lo)) * hours
            else:
                window_h = max(params.min_deadline_h, (lo + u_slack * (hi - lo)) * declared)
            deadline = r.arrival + window_h * 3600.0
        if r.dataset_gb is not None:
            gb = r.dataset_gb
        else:
            gb = min(max(gb, params.dataset_min_gb), params.dataset_max_gb)
        jobs.append(SimJob(
            id=r.id,
            arrival=r.arrival,
            gpus=r.gpus,
            true_hours=hours,
            declared_hours=declared,
            job_class=r.job_class,
            sensitivity=r.sensitivity or sens[int(np.searchsorted(np.cumsum(shares), u_sens, side="right"))],
            deadline=deadline if has else None,
            dataset_bytes=int(gb * 1e9),
            checkpoint_bytes=int(params.checkpoint_gb * 1e9),
            checkpoint_interval_s=params.checkpoint_interval_s,
        ))
    jobs.sort(key=lambda j: (j.arrival, j.id))
    return jobs


def demand_gpus(jobs: list[SimJob]) -> float:
    """Mean GPUs the jobs ask for over their arrival span (GPU-hours ÷ span hours)."""
    if len(jobs) < 2:
        return float(sum(j.gpu_hours for j in jobs))
    span_h = (jobs[-1].arrival - jobs[0].arrival) / 3600.0
    return sum(j.gpu_hours for j in jobs) / max(span_h, 1e-9)
