"""PrefectQueues: each site's training queue as the Prefect server sees it — waiting and running runs, GPUs in use.

The adapter the placement engine's live inputs come from. It reads flow runs in each site's work
pool with ordinary filtered reads (``read_flow_runs``) and never calls the worker-poll endpoints,
which would mark a queue READY as if a worker had polled it. Each run's parameters carry its job
spec, so the backlog is known in GPUs (``gpus × nodes``) and hours, not just in counts.

``snapshot`` (what placement sees) counts every run that trains on the site's GPUs: a job's
``train-stage``, a sweep's ``sweep-trial`` and a federated site's ``federated-round``, so a sweep
or a federation that fills a pool makes the next job wait or burst as a full pool of train runs
would. ``runs`` (what the burst controller may move) stays the ``train-stage`` runs: a sweep places
its own trials. Prefect is imported inside the methods: importing the core stays Prefect-free.

It also names a GPU pool's work queues (``pool_queues``: one per ``QueueTier``, ``tier_queue``, plus
Prefect's ``default``): ``deployments/bootstrap.py`` creates them with ascending priorities, the train
dispatch queues a run into its tier's, and the pool's workers start waiting runs in that order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hybridtrain.errors import SpecError
from hybridtrain.placement.burst import RunningRun, WaitingRun
from hybridtrain.placement.queue_state import QueuedRun, QueueState, QueueTier, remaining_hours
from hybridtrain.placement.request import ResourceRequest, request_from_spec
from hybridtrain.specs.job import JobSpec, parse_spec
from hybridtrain.specs.sites import SitesCatalog

TRAIN_FLOW = "train-stage"
#: The flows whose runs train on a site's GPUs (``flows/training.py``, ``flows/sweep.py``, ``flows/federated.py``).
GPU_FLOWS = (TRAIN_FLOW, "sweep-trial", "federated-round")
PAGE = 200
#: Tags that carry the placement decision with a queued train run, so the burst controller and every
#: queue snapshot see the run as the engine planned it (hours, work queue, due time), as the simulator does.
RUN_HOURS_TAG = "hybridtrain.run_hours:"
QUEUE_TIER_TAG = "hybridtrain.queue_tier:"
DUE_TAG = "hybridtrain.due_at:"


def decision_tags(run_hours: float, queue_tier: str, due_at: datetime | None = None) -> list[str]:
    """The tags a train run is created with: the hours the engine planned it with, its work queue and,
    when known, when it is due (its place in that queue, POSIX seconds)."""
    tags = [f"{RUN_HOURS_TAG}{run_hours:.6g}", f"{QUEUE_TIER_TAG}{queue_tier}"]
    if due_at is not None:
        tags.append(f"{DUE_TAG}{due_at.timestamp():.0f}")
    return tags


#: The pool's work queue of runs that carry no tier (sweep trials, federated rounds, the lifecycle and
#: data stages, a run queued by hand): Prefect's own, which every pool has.
DEFAULT_QUEUE = "default"


def tier_queue(tier: QueueTier | str) -> str:
    """The name of the work queue a GPU pool keeps for ``tier`` (a ``QueueTier`` or its name, e.g. ``"spot"``):
    ``tier-<rank>-<name>``, so the Prefect UI lists a pool's queues in the order they are served."""
    t = tier if isinstance(tier, QueueTier) else QueueTier[tier]
    return f"tier-{int(t)}-{t.name.replace('_', '-')}"


def pool_queues() -> list[tuple[str, int]]:
    """A GPU pool's work queues and their Prefect priorities (1 is served first), in that order: one per
    ``QueueTier``, and ``DEFAULT_QUEUE`` right after ``on_demand`` — the tier an untagged run counts in
    for the simulator, the controller's replay and every wait estimate (``PoolRun.tier``)."""
    names = [tier_queue(t) for t in sorted(QueueTier)]
    at = names.index(tier_queue(QueueTier.on_demand)) + 1
    names.insert(at, DEFAULT_QUEUE)
    return [(name, priority) for priority, name in enumerate(names, start=1)]


def is_gpu_pool(sites: SitesCatalog, pool: str) -> bool:
    """Whether ``pool`` hands out GPU slots (its sites have GPUs): such a pool has the tier queues."""
    return sum(s.gpu_count for s in sites.by_pool(pool)) > 0


@dataclass(frozen=True)
class PoolRun:
    """One train-stage flow run in a pool: its id, state, job spec and times."""

    run_id: str
    state: str  # SCHEDULED, PENDING or RUNNING (state type); "Late" shows in state_name
    state_name: str
    spec: JobSpec | None
    parameters: dict[str, Any]
    expected_start: datetime | None
    started: datetime | None
    deployment_id: str | None
    created: datetime | None = None
    tags: tuple[str, ...] = ()

    def _tag(self, prefix: str) -> str | None:
        return next((t.removeprefix(prefix) for t in self.tags if t.startswith(prefix)), None)

    @property
    def run_hours(self) -> float | None:
        """The hours the engine planned this run with (its placement's tag), None if it has none."""
        raw = self._tag(RUN_HOURS_TAG)
        try:
            return float(raw) if raw is not None else None
        except ValueError:
            return None

    @property
    def due(self) -> float | None:
        """When it is due (POSIX s: its deadline, or the end of its wait SLO), as its placement tagged
        it; None without the tag (a run queued before the tag existed, or by hand)."""
        raw = self._tag(DUE_TAG)
        try:
            value = float(raw) if raw is not None else None
        except ValueError:
            return None
        return value if value is not None and math.isfinite(value) else None

    @property
    def tier(self) -> QueueTier:
        """The pool work queue its placement put it in (default ``on_demand``)."""
        raw = self._tag(QUEUE_TIER_TAG)
        return QueueTier[raw] if raw in QueueTier.__members__ else QueueTier.on_demand

    @property
    def planned_hours(self) -> float:
        """Planned hours, else the declared limit."""
        h = self.run_hours
        return min(h, self.limit_hours) if h is not None else self.limit_hours

    @property
    def gpus(self) -> int:
        """GPU slots it takes: every node's GPUs (a CPU job, or a run whose spec is unreadable: one)."""
        return max(1, self.spec.resources.total_gpus) if self.spec else 1

    @property
    def limit_hours(self) -> float:
        return self.spec.resources.max_hours if self.spec else 1.0


def _spec_of(params: Mapping[str, Any]) -> JobSpec | None:
    raw = params.get("spec")
    if not isinstance(raw, dict):
        return None
    try:
        return parse_spec(raw, source="flow run parameters")
    except SpecError:
        return None  # a run with an unreadable spec still counts as one slot


class PrefectQueues:
    """Reads the train-stage backlog of every site's pool from the Prefect API in use."""

    def __init__(self, sites: SitesCatalog, flow_name: str = TRAIN_FLOW, gpu_flows: tuple[str, ...] = GPU_FLOWS):
        self.sites = sites
        self.flow_name = flow_name
        self.gpu_flows = gpu_flows

    def runs(self, pool: str) -> list[PoolRun]:
        """Waiting (scheduled, late, pending) and running train-stage runs of ``pool``."""
        return self.runs_by_pool([pool])[pool]

    def runs_by_pool(self, pools: list[str], flows: tuple[str, ...] | None = None) -> dict[str, list[PoolRun]]:
        """The same for several pools, read in one paged query (not one per pool); ``flows``: the flows whose
        runs to read (default: train-stage)."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            FlowFilter,
            FlowFilterName,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType

        found = []
        with get_client(sync_client=True) as client:
            while True:  # the API serves at most PAGE runs per call
                page = client.read_flow_runs(
                    flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows or (self.flow_name,)))),
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]))),
                    work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=sorted(set(pools)))),
                    limit=PAGE, offset=len(found),
                )
                found += page
                if len(page) < PAGE:
                    break
        out: dict[str, list[PoolRun]] = {pool: [] for pool in pools}
        for fr in found:
            state = fr.state
            out.setdefault(fr.work_pool_name or "", []).append(PoolRun(
                run_id=str(fr.id),
                state=state.type.value if state else "SCHEDULED",
                state_name=state.name if state else "Scheduled",
                spec=_spec_of(fr.parameters),
                parameters=dict(fr.parameters),
                expected_start=fr.expected_start_time,
                started=fr.start_time,
                deployment_id=str(fr.deployment_id) if fr.deployment_id else None,
                created=fr.created,
                tags=tuple(fr.tags or ()),
            ))
        return out

    def snapshot(self, now: datetime | None = None) -> dict[str, QueueState]:
        """One ``QueueState`` per site, in GPU slots, with the backlog in arrival order: the runs of every flow
        that trains on the site's GPUs (``gpu_flows``), each with its work queue and due time (a run
        without a due tag counts as due after every run that has one)."""
        now = now or datetime.now(UTC)
        states: dict[str, QueueState] = {}
        by_pool = self.runs_by_pool([site.work_pool for site in self.sites.sites], self.gpu_flows)
        for site in self.sites.sites:
            runs = by_pool[site.work_pool]
            running = [r for r in runs if r.state == "RUNNING"]
            # Future-scheduled runs are not queued yet; only due ones compete for slots now.
            waiting = [r for r in runs if r.state != "RUNNING"
                       and (r.expected_start is None or r.expected_start <= now)]
            backlog = tuple(QueuedRun(r.gpus, r.planned_hours, r.tier, r.limit_hours,
                                      r.due if r.due is not None else math.inf)
                            for r in sorted(waiting, key=lambda r: r.expected_start or now))
            running_runs = tuple(
                QueuedRun(r.gpus, remaining_hours(r.planned_hours, r.limit_hours,
                                                  (now - r.started).total_seconds() / 3600 if r.started else 0.0),
                          r.tier, r.limit_hours)
                for r in running
            )
            states[site.name] = QueueState(
                site=site.name,
                gpu_slots=site.gpu_count,
                gpus_in_use=sum(r.gpus for r in running),
                scheduled=sum(1 for r in waiting if r.state == "SCHEDULED" and r.state_name != "Late"),
                pending=sum(1 for r in waiting if r.state == "PENDING"),
                late=sum(1 for r in waiting if r.state_name == "Late"),
                running=len(running),
                backlog=backlog,
                running_runs=running_runs,
            )
        return states


def request_of(run: PoolRun, now: datetime) -> ResourceRequest | None:
    """The placement request of a queued train-stage run, as submitted and planned (None if its spec is
    unreadable): the hours its placement planned it with, when its tag says."""
    if run.spec is None:
        return None
    approved = run.parameters.get("approved") or {}
    submitted = run.created or run.expected_start or now
    return request_from_spec(run.spec, dataset_bytes=int(approved.get("size", 0)) or 0, now=submitted,
                             run_hours=run.run_hours)


def burst_inputs(runs: list[PoolRun], now: datetime) -> tuple[list[WaitingRun], list[RunningRun]]:
    """The burst controller's view of one pool: waiting runs (arrival order, each with its tagged work queue
    and due time) and running runs."""
    waiting, running = [], []
    for r in sorted(runs, key=lambda r: r.expected_start or r.created or now):
        req = request_of(r, now)
        if req is None:
            continue
        if r.state == "RUNNING":
            elapsed = (now - r.started).total_seconds() / 3600 if r.started else 0.0
            running.append(RunningRun(
                r.run_id, req,
                hours_left=remaining_hours(req.run_hours, req.max_run_hours, elapsed),
                limit_hours_left=max(req.max_run_hours - elapsed, 0.0),
                since_checkpoint_h=elapsed % (req.checkpoint_interval_s / 3600),
                tier=r.tier,
            ))
        elif r.expected_start is None or r.expected_start <= now:
            enqueued = (r.expected_start or r.created or now).timestamp()
            waiting.append(WaitingRun(r.run_id, req, enqueued_at=enqueued, tier=r.tier, due=r.due))
    return waiting, running
