"""ResourceRequest: what one job needs from a site — GPUs, time, data, limits — independent of where it runs.

The request is the placement engine's only view of a job. It is frozen and holds plain values
(times are POSIX seconds, durations hours), so a decision can be replayed from it exactly.
``request_from_spec`` builds it from a ``JobSpec`` plus the facts the spec does not hold:
the dataset's size, the submission time and the engine's own run-time estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.duration_estimator import plan_hours
from hybridtrain.specs.job import JobSpec, Sensitivity

GB = 1_000_000_000


class DataTier(StrEnum):
    """How far the data has been treated: raw as collected, curated (validated), approved (anonymized)."""

    raw = "raw"
    curated = "curated"
    approved = "approved"


def to_epoch(t: datetime | float) -> float:
    """POSIX seconds for an aware datetime (or a number passed through)."""
    if isinstance(t, datetime):
        if t.tzinfo is None:
            raise ValueError("give a timezone-aware datetime (e.g. datetime.now(UTC))")
        return t.timestamp()
    return float(t)


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """One job's needs. ``run_hours`` is the engine's estimate; ``max_run_hours`` the hard limit.

    ``gpus`` counts every node's GPUs (``nodes × resources.gpus``): the nodes are priced together.
    """

    job: str
    gpus: int
    run_hours: float
    max_run_hours: float
    submitted_at: float
    data_site: str
    dataset_bytes: int = 0
    gpu_type: str | None = None
    sensitivity: Sensitivity = Sensitivity.confidential
    tier: DataTier = DataTier.approved
    residency: tuple[str, ...] = ()
    deadline: float | None = None
    budget_usd: float | None = None
    team: str = "default"
    job_class: str | None = None
    checkpoint_bytes: int = 0
    checkpoint_interval_s: float = 1800.0
    pinned_site: str | None = None
    strategy: str | None = None
    nodes: int = 1
    # Everything the policy's site rules look at; the engine caches rule verdicts under this key.
    policy_key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.gpus < 0:
            problems.append(Problem("gpus", "must be >= 0"))
        if self.nodes < 1:
            problems.append(Problem("nodes", "must be >= 1"))
        if not self.run_hours > 0:
            problems.append(Problem("run_hours", f"must be > 0, got {self.run_hours}"))
        if self.max_run_hours < self.run_hours:
            problems.append(Problem("max_run_hours", "must be >= run_hours (it is the hard limit)"))
        if self.dataset_bytes < 0 or self.checkpoint_bytes < 0:
            problems.append(Problem("dataset_bytes", "byte counts must be >= 0"))
        if problems:
            raise SpecError(f"placement request for job {self.job!r}", problems)
        object.__setattr__(
            self,
            "policy_key",
            (
                self.sensitivity,
                self.tier,
                self.residency,
                self.gpu_type,
                self.gpus,
                self.job_class,
                self.team,
                self.data_site,
                self.pinned_site,
                self.nodes,
            ),
        )

    @property
    def gpu_hours(self) -> float:
        """Estimated GPU-hours at the reference GPU."""
        return self.gpus * self.run_hours

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def dataset_gb(self) -> float:
        return self.dataset_bytes / GB


def request_from_spec(
    spec: JobSpec,
    *,
    dataset_bytes: int,
    now: datetime | float,
    run_hours: float | None = None,
    tier: DataTier = DataTier.approved,
    job_class: str | None = None,
    checkpoint_bytes: int = 0,
    checkpoint_interval_s: float | None = None,
) -> ResourceRequest:
    """Build the placement request for ``spec`` submitted at ``now``.

    ``dataset_bytes`` is the size of the dataset that sync would send (the approved version);
    the request carries ``sync.sample_fraction`` of it. ``run_hours`` is the engine's own
    estimate (see ``DurationEstimator``); without one the spec's ``resources.max_hours`` — the
    hard limit, so an upper bound — is used; either way the run is planned with at most the time
    from submission to its deadline (``plan_hours``, as the simulator plans it). ``tier`` is the
    tier of the data that would be moved: the lifecycle only ever syncs approved data.
    """
    submitted = to_epoch(now)
    limit = spec.resources.max_hours
    deadline_at = spec.deadline_at(datetime.fromtimestamp(submitted, UTC)) if spec.deadline else None
    left_h = (deadline_at.timestamp() - submitted) / 3600.0 if deadline_at is not None else None
    estimate = plan_hours(limit if run_hours is None else run_hours, limit, left_h)
    interval = checkpoint_interval_s
    if interval is None:
        interval = spec.checkpoint.interval_minutes * 60 if spec.checkpoint.interval_minutes else 1800.0
    return ResourceRequest(
        job=spec.name,
        gpus=spec.resources.total_gpus,
        nodes=spec.resources.nodes,
        gpu_type=spec.resources.gpu_type,
        run_hours=estimate,
        max_run_hours=limit,
        submitted_at=submitted,
        data_site=spec.dataset.site,
        dataset_bytes=int(dataset_bytes * spec.sync.sample_fraction),
        sensitivity=spec.data_policy.sensitivity,
        tier=tier,
        residency=tuple(spec.data_policy.residency),
        deadline=deadline_at.timestamp() if deadline_at is not None else None,
        budget_usd=spec.budget_usd,
        team=spec.metadata.team,
        job_class=job_class if job_class is not None else spec.placement.job_class,
        checkpoint_bytes=checkpoint_bytes,
        checkpoint_interval_s=interval,
        pinned_site=spec.placement.site,
        strategy=spec.placement.strategy,
    )
