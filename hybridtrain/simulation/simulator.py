"""Simulator: a discrete-event replay of jobs through the production placement engine, with a simulated clock.

Nothing here decides where a job goes: every placement is ``Placement.decide`` (with the strategy
under test), every move or eviction is ``plan_bursts``, every slot hand-out is ``admit`` — the
same code the flows call (for our policy the controller also runs as soon as a run is queued as
urgent, not only at its next tick). One part is the simulator's own, not the flows': what a spot
run does while its spot is gone. Here a ``SpotRule`` decides (wait for spot while ahead of the
deadline's line, else on-demand at its site, or fail over to another site's spot); the live
recovery instead places a preempted run again at once through the engine, with the site that
took its capacity back left out (``hybridtrain.training.recovery``), so a simulated spot run may
wait where a live one would move (on-prem included). The simulator only supplies what the live
system would: the clock, the on-prem pool's state (for our policy one work
queue per ``QueueTier``; for the baselines a single queue), queue snapshots built from the
engine's *own* duration estimates (a ``HistoryQuantile`` learning from the runs that finished so
far), spot outlooks read from the spot trace up to "now", and — when a run actually executes —
its true duration and the trace's real preemptions.

Execution model: on-prem runs take their true time; an evicted run loses the work since its last
checkpoint and resumes (queued again here, or elsewhere) from it. Cloud capacity is elastic (no
queue); a cloud run starts after the pool's start-up and the dataset sync (bytes at the slower
bandwidth) and runs at the site's speed. A spot run follows its ``SpotRule`` at every trace change
and every controller tick; a preemption loses the work since the last checkpoint (every
``checkpoint_interval_s`` of progress) and each (re)start costs ``restart_s``, billed. When the rule
would fall back to on-demand because spot is gone at the run's site, the run fails over to another
allowed site's spot if that is there and pays (``Simulation.failover_site``; spend kept per site in
``Outcome.legs``). The burst controller runs every ``controller_interval_s`` while runs wait.

Costs: on-prem GPU-hours at the site's amortized price; cloud GPU-hours at list (on-demand) or
catalog spot price; egress for the dataset (at the data site's price) and the final checkpoint
(at the run site's price).

Longer than most modules on purpose: one discrete-event loop whose events (arrival, start, finish, eviction, controller tick) share the same state.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.placement.burst import RunningRun, WaitingRun, pass_now, plan_bursts
from hybridtrain.placement.cost_model import CostModel
from hybridtrain.placement.duration_estimator import DeclaredLimit, DurationEstimator, HistoryQuantile, plan_hours
from hybridtrain.placement.engine import CandidateView, Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.queue_state import (
    BACKFILL_DEPTH,
    QueuedRun,
    QueueState,
    QueueTier,
    Slot,
    admit,
    due_at,
    remaining_hours,
)
from hybridtrain.placement.request import GB, DataTier, ResourceRequest
from hybridtrain.placement.spot_rule import Greedy, SpotAction, SpotProgress, SpotRule, UniformProgress
from hybridtrain.placement.strategy import Choice, Strategy, ThresholdBurst
from hybridtrain.simulation.conservation import ConservationError, check_conservation, cloud_compute_usd
from hybridtrain.simulation.traces import SpotTrace
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.sites import CapacityClass, Site

REFERENCE_EPOCH = 1_700_000_000.0  # trace second 0 as a POSIX time, so clocks print as dates
#: A run finishing at most this long after its deadline is not a miss (clock rounding).
MISS_GRACE_S = 1.0


# --- what is simulated -------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Sites, policy, cost model and spot traces of one simulated deployment."""

    sites: tuple[Site, ...]
    onprem: str
    policy: Policy
    spot_traces: dict[str, SpotTrace]
    cost_model: CostModel = CostModel()
    data_site: str | None = None  # where every job's data lives (default: the on-prem site)

    @property
    def capacity(self) -> int:
        return self.site(self.onprem).gpu_count

    def site(self, name: str) -> Site:
        return next(s for s in self.sites if s.name == name)


@dataclass(frozen=True)
class Contender:
    """One policy under comparison: a strategy for arrivals, and what else it may use."""

    name: str
    strategy: Strategy | None = None  # None: the policy's own (per job class)
    controller: bool = False  # run the burst controller
    controller_interval_s: float = 600.0
    tiered_queues: bool = False  # one on-prem work queue per QueueTier (else a single queue)
    due_first: bool = True  # each work queue serves the run due first (else arrival order)
    stay_reserve: int = 0  # on-prem headroom kept for runs whose data may not leave
    evict: bool = False  # the controller may stop running runs that could leave, for ones that cannot
    spot_rule: SpotRule = field(default_factory=UniformProgress)
    estimator: Callable[[], DurationEstimator] = DeclaredLimit
    #: quantile of the history estimate for runs *ahead in a queue* (None: the same as for the run itself)
    queue_quantile: float | None = None
    spot_work: str = "limit"  # what the spot rule thinks is left: "limit" (declared) or "estimate"
    deadline_cap: bool = False  # plan a run with at most the time left to its deadline (``plan_hours``)
    urgent_pass: bool = False  # a controller pass as soon as an urgent run is queued, not at the next tick
    #: the policy's ``miss_above_usd`` for onprem_first and deadline_spot (None: as the policy file says)
    miss_above_usd: float | None = None
    #: a spot run whose spot is gone, about to fall back to on-demand, moves to another allowed site's
    #: spot when that is there and cheaper (``Simulation.failover_site``; the live recovery re-places at once)
    spot_failover: bool = True


@dataclass(frozen=True, slots=True)
class CloudLeg:
    """The part of a spot run at one cloud site, when it failed over between sites (GPU-hours)."""

    site: str
    spot_gpu_hours: float = 0.0
    od_gpu_hours: float = 0.0
    overhead_gpu_hours: float = 0.0


@dataclass(slots=True)
class Outcome:
    """What happened to one job."""

    job: SimJob
    site: str = ""
    capacity_class: str = ""
    cloud: bool = False
    moved: bool = False
    unplaceable: bool = False
    start: float = math.nan
    finish: float = math.nan
    onprem_gpu_hours: float = 0.0
    spot_gpu_hours: float = 0.0
    od_gpu_hours: float = 0.0
    compute_usd: float = 0.0
    egress_usd: float = 0.0
    preemptions: int = 0  # spot capacity taken back
    evictions: int = 0  # stopped on-prem to make room for a run that could not go elsewhere
    lost_gpu_hours: float = 0.0  # work redone after an eviction or preemption, reference GPU-hours
    onprem_usd: float = 0.0  # the part of ``compute_usd`` spent on-prem
    overhead_gpu_hours: float = 0.0  # billed restart time (no progress), at the cloud site
    #: per cloud site, in order, when a spot run failed over (empty: it ran at ``site`` only);
    #: ``site`` is then the last one and the GPU-hour fields are the sums over the legs
    legs: tuple[CloudLeg, ...] = ()

    @property
    def failovers(self) -> int:
        return max(len(self.legs) - 1, 0)

    @property
    def cost_usd(self) -> float:
        return self.compute_usd + self.egress_usd

    @property
    def cloud_usd(self) -> float:
        """What this job spent in the cloud (compute and egress), its on-prem part excluded."""
        return self.cost_usd - self.onprem_usd

    @property
    def missed(self) -> bool:
        if self.job.deadline is None:
            return False
        return self.unplaceable or self.finish > self.job.deadline + MISS_GRACE_S


# --- baselines that exist only for comparison --------------------------------------------------


@dataclass(frozen=True)
class OnPremOnly:
    """Baseline: every job waits for the on-prem pool; a job on-prem cannot run is unplaceable."""

    name: ClassVar[str] = "onprem_only"

    def choose(self, c: CandidateView) -> Choice:
        pos = c.cheapest("onprem", meeting=False)
        return Choice(pos, lambda: ["on-prem only"])


@dataclass(frozen=True)
class GreedySpotBurst:
    """Baseline: a job that would be more than ``queue_limit`` runs deep in the on-prem queue goes to
    the cheapest spot it may use (else on-demand) at once; ``queue_limit=0``: as soon as it would wait."""

    name: ClassVar[str] = "greedy_spot"
    queue_limit: int = 0

    def choose(self, c: CandidateView) -> Choice:
        onprem = c.cheapest("onprem", meeting=False)
        if onprem >= 0 and c.queued(onprem) + (1 if c.must_wait(onprem) else 0) <= self.queue_limit:
            return Choice(onprem, lambda: ["on-prem queue within the limit"])
        for group in ("spot", "burst"):
            pos = c.cheapest(group, meeting=False)
            if pos >= 0:
                return Choice(pos, lambda: [f"greedy {group}"])
        return Choice(onprem, lambda: ["no cloud allowed"])


def contenders(threshold_limits: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64),
               ours: Contender | None = None, spot_limits: Sequence[int] | None = None) -> list[Contender]:
    """The comparison set: on-prem FIFO, cloud on-demand, threshold burst (swept), greedy spot
    (``greedy_spot``, and ``spot_burst_N`` for each N of ``spot_limits`` — default: the thresholds
    above 0), ours."""
    spot_limits = [n for n in threshold_limits if n > 0] if spot_limits is None else spot_limits
    out = [
        Contender("onprem_fifo", OnPremOnly()),
        Contender("cloud_on_demand", ThresholdBurst(queue_limit=-1)),
        *[Contender(f"threshold_{n}", ThresholdBurst(queue_limit=n)) for n in threshold_limits],
        Contender("greedy_spot", GreedySpotBurst(), spot_rule=Greedy()),
        *[Contender(f"spot_burst_{n}", GreedySpotBurst(queue_limit=n), spot_rule=Greedy()) for n in spot_limits],
        ours or our_policy(),
    ]
    return out


def with_miss_value(policy: Policy, miss_above_usd: float | None) -> Policy:
    """``policy`` with ``miss_above_usd`` set for the strategies that take it (None: unchanged)."""
    if miss_above_usd is None:
        return policy
    options = {k: dict(v) for k, v in policy.strategy_options.items()}
    for name in ("onprem_first", "deadline_spot"):
        options.setdefault(name, {})["miss_above_usd"] = miss_above_usd
    if "onprem_first" in policy.strategy_options and "displace_max_hours" in policy.strategy_options["onprem_first"]:
        # deadline_spot falls back to onprem_first: the same displacement
        options["deadline_spot"].setdefault("displace_max_hours", options["onprem_first"]["displace_max_hours"])
    return policy.model_copy(update={"strategy_options": options})


def our_policy(quantile: float = 0.9, stay_reserve: int = 0, evict: bool = True, queue_quantile: float | None = 0.5,
               spot_work: str = "limit", controller_interval_s: float = 600.0, deadline_cap: bool = True,
               urgent_pass: bool = True, miss_above_usd: float | None = None) -> Contender:
    """Our policy: the policy file's strategies, burst controller (with evictions, and a pass as soon
    as an urgent run is queued), tiered on-prem queues, uniform progress on spot, and the engine's
    history estimates at ``quantile`` for a run itself — at most the time left to its deadline —
    and ``queue_quantile`` for the runs queued behind it; ``miss_above_usd``: what a deadline is worth
    (``OnPremFirst``), None: as the policy file says."""
    return Contender(
        "ours", strategy=None, controller=True, controller_interval_s=controller_interval_s, tiered_queues=True,
        spot_rule=UniformProgress(),
        estimator=lambda q=quantile: HistoryQuantile(quantile=q), queue_quantile=queue_quantile,
        spot_work=spot_work, stay_reserve=stay_reserve, evict=evict, deadline_cap=deadline_cap,
        urgent_pass=urgent_pass, miss_above_usd=miss_above_usd,
    )


# --- the replay --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Queued:
    job: SimJob
    request: ResourceRequest  # for the work still to do
    enqueued: float
    tier: QueueTier
    expected_h: float = 0.0  # the engine's expected hours, as others in the queue see this run
    done_h: float = 0.0  # work already done and checkpointed (after an eviction)
    cancelled: bool = False
    due: float = math.inf  # its place in its work queue (``QueuedRun.due``), set when queued


class Simulation:
    """One replay of ``jobs`` under one contender (build a new one per run)."""

    def __init__(self, scenario: Scenario, contender: Contender, *, time_offset: float = REFERENCE_EPOCH,
                 spot_window_s: float = 86400.0) -> None:
        self.sc = scenario
        self.ct = contender
        self.offset = time_offset
        self.spot_window_s = spot_window_s
        self.engine = Placement(scenario.sites, with_miss_value(scenario.policy, contender.miss_above_usd),
                                scenario.cost_model)
        self.estimator = contender.estimator()
        self.capacity = scenario.capacity
        self.reserved = contender.stay_reserve
        self.onprem_price = scenario.site(scenario.onprem).gpu_hour_price
        self.data_site = scenario.data_site or scenario.onprem
        self.slo_s = scenario.policy.wait_slo_hours * 3600.0
        self.free = self.capacity
        self.running: dict[str, tuple[_Queued, float, float, int]] = {}  # id → (entry, start, est hours, token)
        self.queues: list[deque[_Queued]] = [deque() for _ in QueueTier]
        self.waiting = 0
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.outcomes: dict[str, Outcome] = {}
        self.next_tick = math.inf
        self.prior: dict[str, Outcome] = {}  # what evicted runs already used

    # --- inputs the engine sees --------------------------------------------------------------

    def request(self, job: SimJob) -> ResourceRequest:
        left = (job.deadline - job.arrival) / 3600.0 if self.ct.deadline_cap and job.deadline is not None else None
        est = plan_hours(self.estimator.estimate(job.declared_hours, job.job_class, family=job.family),
                         job.declared_hours, left)
        return ResourceRequest(
            job=job.id, gpus=job.gpus, run_hours=est, max_run_hours=job.declared_hours,
            submitted_at=job.arrival + self.offset, data_site=self.data_site, dataset_bytes=job.dataset_bytes,
            sensitivity=job.sensitivity, tier=DataTier.approved,
            deadline=job.deadline + self.offset if job.deadline is not None else None,
            job_class=job.job_class, checkpoint_bytes=job.checkpoint_bytes,
            checkpoint_interval_s=job.checkpoint_interval_s,
        )

    def running_runs(self, t: float) -> tuple[QueuedRun, ...]:
        out = []
        for e, start, est, _ in self.running.values():
            elapsed = (t - start) / 3600.0
            out.append(QueuedRun(e.job.gpus, remaining_hours(est, e.request.max_run_hours, elapsed), e.tier,
                                 e.request.max_run_hours - elapsed))
        return tuple(out)

    def queue_state(self, t: float, detailed: bool) -> QueueState:
        used = self.capacity - self.free
        if not detailed:
            return QueueState(self.sc.onprem, self.capacity, used, self.reserved, scheduled=self.waiting,
                              running=len(self.running))
        return QueueState(
            self.sc.onprem, self.capacity, used, self.reserved, scheduled=self.waiting, running=len(self.running),
            backlog=tuple(QueuedRun(e.job.gpus, max(e.expected_h - e.done_h, 0.01), e.tier, e.request.max_run_hours,
                                    e.due)
                          for q in self.queues for e in q if not e.cancelled),
            running_runs=self.running_runs(t),
        )

    def spot_outlooks(self, t: float) -> dict:
        return {name: tr.outlook(t, self.spot_window_s) for name, tr in self.sc.spot_traces.items()}

    # --- the event loop ----------------------------------------------------------------------

    def push(self, t: float, kind: str, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self, jobs: Sequence[SimJob]) -> list[Outcome]:
        for job in jobs:
            self.push(job.arrival, "arrive", job)
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if kind == "arrive":
                self.arrive(t, payload)  # type: ignore[arg-type]
            elif kind == "done":
                self.finish_onprem(t, *payload)  # type: ignore[misc]
            elif kind == "observe":
                job, hours = payload  # type: ignore[misc]
                self.observe(job, hours)
            elif kind == "tick":
                self.tick(t)
        if self.prior:
            raise ConservationError(f"evicted runs never finished: {sorted(self.prior)[:5]}")
        outcomes = [self.outcomes[j.id] for j in jobs]
        check_conservation(self.sc, outcomes)
        return outcomes

    def observe(self, job: SimJob, hours: float) -> None:
        if isinstance(self.estimator, HistoryQuantile):
            self.estimator.observe(job.declared_hours, hours, job.job_class, family=job.family)

    def arrive(self, t: float, job: SimJob) -> None:
        req = self.request(job)
        ct = self.ct
        queues = {self.sc.onprem: self.queue_state(t, detailed=ct.controller)}
        spot = self.spot_outlooks(t)
        try:
            d = self.engine.decide(req, now=t + self.offset, queues=queues, spot=spot, strategy=ct.strategy)
        except NoFeasiblePlacement:
            self.outcomes[job.id] = Outcome(job, unplaceable=True)
            return
        if d.site == self.sc.onprem:
            self.enqueue(t, job, req, d.queue_tier if ct.tiered_queues else QueueTier.on_demand)
            if ct.urgent_pass and pass_now(d) and self.waiting:
                self.control(t)
                self.start_ready(t)
        else:
            self.run_cloud(t, job, req, d.site, d.capacity_class)

    def expected(self, job: SimJob) -> float:
        q = self.ct.queue_quantile
        if q is None or not isinstance(self.estimator, HistoryQuantile):
            return self.estimator.estimate(job.declared_hours, job.job_class, family=job.family)
        return self.estimator.estimate(job.declared_hours, job.job_class, q, family=job.family)

    def enqueue(self, t: float, job: SimJob, req: ResourceRequest, tier: QueueTier) -> None:
        self.put(_Queued(job, req, t, tier, self.expected(job)))
        self.waiting += 1
        self.start_ready(t)
        if self.ct.controller and self.waiting and self.next_tick == math.inf:
            self.next_tick = t + self.ct.controller_interval_s
            self.push(self.next_tick, "tick", None)

    def put(self, e: _Queued) -> None:
        """Queue ``e`` in its tier's work queue by its due time (``queue_key``: after the runs due no later)."""
        e.due = due_at(e.request.deadline, e.request.submitted_at, self.slo_s) if self.ct.due_first else math.inf
        q = self.queues[e.tier]
        k = len(q)
        while k > 0 and q[k - 1].due > e.due:
            k -= 1
        q.insert(k, e)

    def start_ready(self, t: float) -> None:
        """Start the waiting runs the pool's rule (``admit``) lets start now."""
        if self.free <= 0 or not self.waiting:
            return
        waiting = []
        for q in self.queues:  # only the runs admit can look at
            for e in q:
                if not e.cancelled:
                    waiting.append(e)
                    if len(waiting) > BACKFILL_DEPTH + 64:
                        break
        slots = [Slot(start + e.request.max_run_hours * 3600.0, e.job.gpus, e.tier)
                 for e, start, _, _ in self.running.values()]
        runs = [QueuedRun(e.job.gpus, e.request.run_hours, e.tier, e.request.max_run_hours, e.due) for e in waiting]
        chosen = admit(t, self.capacity, slots, runs, self.reserved)
        for i in chosen:
            e = waiting[i]
            e.cancelled = True  # leaves the queue
            self.waiting -= 1
            self.free -= e.job.gpus
            self.seq += 1
            token = self.seq  # a restarted run's earlier "done" events carry an older token
            self.running[e.job.id] = (e, t, max(e.expected_h - e.done_h, 0.01), token)
            self.push(t + (e.job.true_hours - e.done_h) * 3600.0, "done", (e.job.id, token))
        for q in self.queues:
            while q and q[0].cancelled:
                q.popleft()

    def finish_onprem(self, t: float, job_id: str, token: int) -> None:
        run = self.running.get(job_id)
        if run is None or run[3] != token:
            return  # this start was evicted earlier (the run may be running again, from a later start)
        entry, start, _, _ = self.running.pop(job_id)
        job = entry.job
        self.free += job.gpus
        gh = job.gpus * (t - start) / 3600.0  # what the clock says ran, so a stale event cannot hide work
        out = Outcome(job, site=self.sc.onprem, capacity_class=CapacityClass.fixed.value, start=start, finish=t,
                      onprem_gpu_hours=gh, compute_usd=gh * self.onprem_price, onprem_usd=gh * self.onprem_price)
        self.outcomes[job.id] = self.merge(out)
        self.observe(job, job.true_hours)
        self.start_ready(t)

    def tick(self, t: float) -> None:
        self.next_tick = math.inf
        if not self.control(t):
            return
        self.start_ready(t)
        if self.waiting:
            self.next_tick = t + self.ct.controller_interval_s
            self.push(self.next_tick, "tick", None)

    def control(self, t: float) -> bool:
        """One burst-controller pass (``plan_bursts``) carried out: evictions, urgent runs to the first
        queue, moves. False when nothing waits."""
        waiting = [e for q in self.queues for e in q if not e.cancelled]
        if not waiting:
            return False
        runs = [WaitingRun(e.job.id, e.request, e.enqueued + self.offset, max(e.expected_h - e.done_h, 0.01), e.tier,
                           e.due)
                for e in waiting]
        by_id = {e.job.id: e for e in waiting}
        running = []
        for e, start, est, _ in self.running.values():
            elapsed = (t - start) / 3600.0
            ckpt_h = e.job.checkpoint_interval_s / 3600.0
            running.append(RunningRun(e.job.id, e.request, remaining_hours(est, e.request.max_run_hours, elapsed),
                                      e.request.max_run_hours - elapsed, elapsed % ckpt_h, e.tier))
        plan = plan_bursts(self.engine, self.sc.onprem, runs, now=t + self.offset, gpu_slots=self.capacity,
                           running=running, reserved_slots=self.reserved, spot=self.spot_outlooks(t),
                           evict=self.ct.evict, margin_s=self.ct.controller_interval_s)
        for ev in plan.evictions:
            self.evict(t, ev.run_id, None if ev.resume_here else (ev.to_site, ev.decision.capacity_class))
        for rid in dict.fromkeys(ev.for_run for ev in plan.evictions):  # in the plan's order
            e = by_id.get(rid)
            if e is not None and e.tier is not QueueTier.stay and not e.cancelled:
                e.cancelled = True  # an urgent run goes to the first queue
                self.put(_Queued(e.job, e.request, e.enqueued, QueueTier.stay, e.expected_h, e.done_h))
        for rid in plan.demoted:
            e = by_id[rid]
            if not e.cancelled:
                e.cancelled = True  # late anyway: to the last queue
                self.put(_Queued(e.job, e.request, e.enqueued, QueueTier.late, e.expected_h, e.done_h))
        for move in plan.moves:
            e = by_id[move.run_id]
            e.cancelled = True
            self.waiting -= 1
            # an evicted run queued again keeps the work it had checkpointed
            self.run_cloud(t, e.job, e.request, move.to_site, move.decision.capacity_class, moved=True,
                           done_h=e.done_h)
        return True

    def evict(self, t: float, job_id: str, to: tuple[str, CapacityClass] | None) -> None:
        """Stop an on-prem run at its last checkpoint; queue it again here (``to=None``) or resume it at ``to``."""
        entry, start, _, _ = self.running.pop(job_id)
        job = entry.job
        self.free += job.gpus
        ran_h = (t - start) / 3600.0
        ckpt_h = job.checkpoint_interval_s / 3600.0
        kept_h = min(math.floor(ran_h / ckpt_h + 1e-9) * ckpt_h, job.true_hours - entry.done_h)
        prior = self.prior.setdefault(job.id, Outcome(job))
        prior.onprem_gpu_hours += job.gpus * ran_h
        prior.compute_usd += job.gpus * ran_h * self.onprem_price
        prior.onprem_usd += job.gpus * ran_h * self.onprem_price
        prior.lost_gpu_hours += job.gpus * (ran_h - kept_h) * self.sc.cost_model.speed(self.sc.site(self.sc.onprem))
        prior.evictions += 1
        prior.moved = True
        done_h = entry.done_h + kept_h
        req = entry.request
        left = replace(req, run_hours=max(req.run_hours - kept_h, 0.01), max_run_hours=max(req.max_run_hours - kept_h, 0.01))
        if to is None:
            self.put(_Queued(job, left, entry.enqueued, entry.tier, entry.expected_h, done_h))
            self.waiting += 1
        else:
            self.run_cloud(t, job, left, to[0], to[1], moved=True, done_h=done_h)

    def merge(self, out: Outcome) -> Outcome:
        """Add what an evicted run used before to its final outcome."""
        prior = self.prior.pop(out.job.id, None)
        if prior is not None:
            out.onprem_gpu_hours += prior.onprem_gpu_hours
            out.compute_usd += prior.compute_usd
            out.onprem_usd += prior.onprem_usd
            out.lost_gpu_hours += prior.lost_gpu_hours
            out.evictions += prior.evictions
            out.moved = True
        return out

    # --- cloud execution ---------------------------------------------------------------------

    def run_cloud(self, t: float, job: SimJob, req: ResourceRequest, site_name: str, klass: CapacityClass,
                  moved: bool = False, done_h: float = 0.0) -> None:
        site = self.sc.site(site_name)
        src = self.sc.site(self.data_site)
        remote = site.name != self.data_site
        cm = self.sc.cost_model
        sync = job.dataset_bytes * 8 / (min(src.bandwidth_mbps, site.bandwidth_mbps) * 1e6) if remote else 0.0
        egress = (job.dataset_bytes / GB * src.egress_per_gb + job.checkpoint_bytes / GB * site.egress_per_gb) if remote else 0.0
        begin = t + cm.startup(site) + sync
        work_h = (job.true_hours - done_h) / cm.speed(site)
        out = Outcome(job, site=site.name, capacity_class=klass.value, cloud=True, moved=moved, start=begin,
                      egress_usd=egress)
        if klass is CapacityClass.opportunistic:
            planned = req.max_run_hours if self.ct.spot_work == "limit" else req.run_hours
            self.run_spot(out, site, begin, work_h, planned / cm.speed(site), req)
        else:
            out.finish = begin + work_h * 3600.0
            out.od_gpu_hours = job.gpus * work_h
            out.compute_usd = out.od_gpu_hours * site.gpu_hour_price
        self.outcomes[job.id] = self.merge(out)
        self.push(out.finish, "observe", (job, job.true_hours))

    def run_spot(self, out: Outcome, site: Site, begin: float, work_h: float, planned_h: float,
                 req: ResourceRequest | None = None) -> None:
        """Replay one spot run against the site's trace under the contender's spot rule.

        With ``req`` and the contender's ``spot_failover``, a run about to fall back to on-demand
        because spot is gone here moves to another site's spot instead when ``failover_site`` finds
        one (from its last checkpoint, after that site's start-up and the sync; the checkpoint
        and the dataset are paid for), and goes on there under the same rule.
        """
        rule = self.ct.spot_rule
        cm = self.sc.cost_model
        restart_h = cm.restart_s / 3600.0
        tick_s = self.ct.controller_interval_s
        ckpt_h = out.job.checkpoint_interval_s / 3600.0
        deadline = out.job.deadline
        gpus = out.job.gpus
        first = site
        t, done, current = begin, 0.0, SpotAction.wait
        spot_h = od_h = overhead = lost_ref = 0.0
        legs: list[CloudLeg] = []
        preemptions = 0
        fresh = True  # the first launch's start-up is already counted
        while done < work_h - 1e-9:
            trace = self.sc.spot_traces[site.name]
            avail = trace.is_available(t)
            action = rule.choose(SpotProgress(
                now=t, started_at=begin, deadline=deadline, work_done_h=done,
                work_left_h=max(planned_h - done, 0.0), spot_available=avail, current=current))
            if action is SpotAction.on_demand and not avail and current is SpotAction.wait and req is not None \
                    and self.ct.spot_failover:
                move = self.failover_site(out.job, req, site, t, begin, done, work_h, planned_h)
                if move is not None:
                    to, delay_s, move_usd = move
                    legs.append(CloudLeg(site.name, gpus * spot_h, gpus * od_h, gpus * overhead))
                    spot_h = od_h = overhead = 0.0
                    scale = cm.speed(site) / cm.speed(to)  # the same work in the new site's hours
                    done, work_h, planned_h = done * scale, work_h * scale, planned_h * scale
                    ckpt_h *= scale
                    out.egress_usd += move_usd
                    site, t, fresh = to, t + delay_s, False  # a relaunch there: its restart is billed
                    continue
            if action is SpotAction.wait:
                current = SpotAction.wait
                t = min(trace.next_change(t) if not avail else t + tick_s, t + tick_s)
                continue
            if action is not current and not fresh:
                # relaunch / switch: restart time billed, no progress
                if action is SpotAction.spot:
                    spot_h += restart_h
                else:
                    od_h += restart_h
                overhead += restart_h
                t += restart_h * 3600.0
                if action is SpotAction.spot and not trace.is_available(t):
                    current = SpotAction.wait
                    preemptions += 1
                    continue
            fresh = False
            current = action
            remaining_s = (work_h - done) * 3600.0
            if action is SpotAction.spot:
                until = min(trace.next_change(t), t + remaining_s)
                ran_h = (until - t) / 3600.0
                spot_h += ran_h
                done += ran_h
                t = until
                if done < work_h - 1e-9:  # preempted: back to the last checkpoint
                    kept = math.floor(done / ckpt_h + 1e-9) * ckpt_h
                    lost_ref += gpus * (done - kept) * cm.speed(site)
                    done = kept
                    preemptions += 1
                    current = SpotAction.wait
            else:
                until = t + remaining_s if isinstance(rule, Greedy) else min(t + remaining_s, t + tick_s)
                ran_h = (until - t) / 3600.0
                od_h += ran_h
                done += ran_h
                t = until
        out.finish = t
        out.preemptions = preemptions
        out.lost_gpu_hours = lost_ref
        legs.append(CloudLeg(site.name, gpus * spot_h, gpus * od_h, gpus * overhead))
        if len(legs) > 1:
            out.legs = tuple(legs)
            out.site = site.name
            # the final checkpoint goes home from the last site, not the first
            out.egress_usd += out.job.checkpoint_bytes / GB * (site.egress_per_gb - first.egress_per_gb)
        out.spot_gpu_hours = math.fsum(leg.spot_gpu_hours for leg in legs)
        out.od_gpu_hours = math.fsum(leg.od_gpu_hours for leg in legs)
        out.overhead_gpu_hours = math.fsum(leg.overhead_gpu_hours for leg in legs)
        out.compute_usd = math.fsum(cloud_compute_usd(self.sc.site(leg.site), leg.spot_gpu_hours, leg.od_gpu_hours)
                                    for leg in legs)

    def failover_site(self, job: SimJob, req: ResourceRequest, here: Site, t: float, begin: float, done: float,
                      work_h: float, planned_h: float) -> tuple[Site, float, float] | None:
        """Where a spot run whose spot is gone at ``here`` goes instead of on-demand here: the allowed
        site (the engine's candidates for ``req``: policy, jurisdiction and caps apply) with the
        cheapest spot that is there now, cheaper than on-demand here by more than moving costs
        (the checkpoint out of ``here``, the dataset in), and still on the line by the deadline
        once the run has started there (the spot rule there would take spot, not on-demand).
        Returns (site, seconds before it can run there, USD of the move), or None: stay.

        The live recovery moves sooner and more widely: on a spot notice it places the run again at
        once, with the site that took its capacity back left out, and any other allowed site (on-prem,
        spot or on-demand) may take it (``hybridtrain.training.recovery``).
        """
        cm = self.sc.cost_model
        src = self.sc.site(self.data_site)
        left_h = max(work_h - done, 0.0) * cm.speed(here)  # reference hours still to run
        best = None
        for c in self.engine.plan_for(req).cands:
            if not c.spot or c.site == here.name or c.site not in self.sc.spot_traces:
                continue
            to = self.sc.site(c.site)
            if to.spot_price_per_gpu_hour is None or not self.sc.spot_traces[to.name].is_available(t):
                continue
            remote = to.name != self.data_site
            ckpt_gb, data_gb = job.checkpoint_bytes / GB, (job.dataset_bytes / GB if remote else 0.0)
            move_usd = ckpt_gb * here.egress_per_gb + data_gb * src.egress_per_gb
            sync_s = (job.checkpoint_bytes + (job.dataset_bytes if remote else 0)) * 8 / (
                min(here.bandwidth_mbps, src.bandwidth_mbps, to.bandwidth_mbps) * 1e6)
            delay_s = cm.startup(to) + sync_s
            saved = job.gpus * left_h * (here.gpu_hour_price / cm.speed(here) - to.spot_price_per_gpu_hour / cm.speed(to))
            if saved <= move_usd:
                continue
            scale = cm.speed(here) / cm.speed(to)
            there = self.ct.spot_rule.choose(SpotProgress(
                now=t + delay_s, started_at=begin, deadline=job.deadline, work_done_h=done * scale,
                work_left_h=max(planned_h - done, 0.0) * scale, spot_available=True, current=SpotAction.wait))
            if there is not SpotAction.spot:
                continue
            if best is None or to.spot_price_per_gpu_hour < best[0].spot_price_per_gpu_hour:
                best = (to, delay_s, move_usd)
        return best

