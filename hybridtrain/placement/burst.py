"""BurstPlan: which runs of an on-prem pool should move to the cloud now, and whether burst capacity can go.

The burst controller flow runs on a schedule, reads the on-prem pool — its waiting runs and its
running runs, each with its placement request, and its GPU slots — and calls ``plan_bursts``.
It then carries the plan out: each moved run is cancelled in the on-prem pool and submitted to
the target site's deployment; each evicted run is stopped at a checkpoint and resumed at its
target; burst capacity is released when told. All the judgement is here, as a pure function.

How a pass works:

1. The pool is replayed as it hands out GPU slots (``admit``, higher-priority work queues first,
   see ``QueueTier``, and within one the run due first) with the engine's own duration estimates.
   A waiting run that still meets its deadline (or, without one, starts within the policy's wait SLO) stays. For the first run
   in line that would not, the placement engine decides again with the run's expected wait at
   this site; if it picks another site the run moves, and the pool is replayed without it — one
   move can save the runs behind it — before the next at-risk run is looked at.
2. A run whose data may not leave is never moved (nor is an urgent one, which only this pool
   can still get done in time — or, for a short run, get done cheapest: the engine's decision
   for a late run may itself come back urgent). If it would still miss its deadline, and
   starting now would save it, running runs that *could* leave are stopped to make room,
   cheapest first: one whose own deadline allows (or is lost anyway) goes back to the head of its
   queue and resumes here from its last checkpoint when the room is free again; otherwise it
   resumes where the engine places the work it has left. A run that can still wait for the next
   pass (``margin_s``) takes only victims that checkpointed within that time: the others reach a
   checkpoint before it must start, so little work is thrown away.
   A run whose new decision is *late* here (rescuing it costs more than the policy says a
   deadline is worth, ``OnPremFirst.miss_above_usd``) goes to the pool's last queue
   (``BurstPlan.demoted``), behind every run that can still make its deadline.
3. When no run is waiting and enough GPUs are free, the plan says burst capacity can go.

Example: 8 GPUs, all busy for 2 more hours; waiting: A (1 GPU, 3 h, due in 4 h), B
(restricted, 1 GPU, 1 h, due in 1 h 30 m), C (1 GPU, 1 h, due tomorrow). B is first in line but
would start at 2 h — too late, and it may not leave: the running run D (1 GPU, 5 h left, due
tomorrow, checkpointed 10 minutes ago) is stopped and queued again, and B takes its GPU now. A would finish at 5 h, 1 h late → the
engine picks cloud-eu on-demand → A moves. C starts at 2 h and stays. At a later pass nothing
waits and 6 of 8 GPUs are free → release.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.placement.cost_model import clock
from hybridtrain.placement.decision import PlacementDecision
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.queue_state import QueuedRun, QueueState, QueueTier, due_at, queue_key, start_delays
from hybridtrain.placement.request import ResourceRequest
from hybridtrain.placement.spot_market import SpotOutlook


@dataclass(frozen=True, slots=True)
class WaitingRun:
    """A run waiting in the watched pool, with its placement request.

    ``expected_hours`` is how long the runs behind it should expect it to take (default: the
    request's ``run_hours``, the estimate the run is planned with — often a safer quantile).
    ``tier`` is the work queue it waits in (default: the one its request implies; an urgent run
    was put in ``QueueTier.stay``). ``due`` is its place in that queue (``QueuedRun.due``; default:
    its deadline, else submitted + the policy's wait SLO).
    """

    run_id: str
    request: ResourceRequest
    enqueued_at: float
    expected_hours: float | None = None
    tier: QueueTier | None = None
    due: float | None = None


@dataclass(frozen=True, slots=True)
class RunningRun:
    """A run on the watched pool's slots: its request, its estimated and hard-limit hours left, and
    the work since its last checkpoint (lost if it is stopped now)."""

    run_id: str
    request: ResourceRequest
    hours_left: float
    limit_hours_left: float
    since_checkpoint_h: float = 0.0
    tier: QueueTier | None = None


@dataclass(frozen=True)
class Move:
    """Move waiting run ``run_id`` from the watched site to ``decision.site``."""

    run_id: str
    from_site: str
    decision: PlacementDecision

    @property
    def to_site(self) -> str:
        return self.decision.site

    @property
    def reason(self) -> str:
        return "; ".join(self.decision.reasons)


@dataclass(frozen=True)
class Evict:
    """Stop running run ``run_id`` (it resumes from its last checkpoint) to make room for ``for_run``.

    With a ``decision`` the run resumes there; without one it goes back to the head of its queue
    here, to resume when the room is free again.
    """

    run_id: str
    for_run: str
    site: str
    decision: PlacementDecision | None
    cost_usd: float  # what stopping it is expected to cost (lost work, restart, a dearer site)

    @property
    def resume_here(self) -> bool:
        return self.decision is None

    @property
    def to_site(self) -> str:
        return self.site if self.decision is None else self.decision.site


@dataclass(frozen=True)
class Hold:
    """A run at risk of missing its deadline that stays, and why (e.g. the rule keeping its data home)."""

    run_id: str
    why: Callable[[], str]

    @property
    def reason(self) -> str:
        return self.why()


@dataclass(frozen=True)
class BurstPlan:
    """The outcome of one controller pass."""

    moves: tuple[Move, ...]
    evictions: tuple[Evict, ...]
    held: tuple[Hold, ...]
    release: bool
    release_reason: str
    #: waiting runs whose new decision lets them be late here: to the pool's last queue (``QueueTier.late``)
    demoted: tuple[str, ...] = ()


def plan_bursts(
    placement: Placement,
    site: str,
    waiting: Sequence[WaitingRun],
    *,
    now: float,
    gpu_slots: int,
    running: Sequence[RunningRun],
    reserved_slots: int = 0,
    others: Mapping[str, QueueState] | None = None,
    spot: Mapping[str, SpotOutlook] | None = None,
    team_spend: Mapping[str, float] | None = None,
    evict: bool = True,
    margin_s: float = 0.0,
    release_free_fraction: float = 0.25,
) -> BurstPlan:
    """One pass of the burst controller over the pool of ``site`` (see the module docstring).

    ``waiting`` is the pool's queue in arrival order (the pass orders it as the pool serves it:
    ``queue_key``); ``others`` the queue states of the other
    sites, ``spot`` their outlooks. ``evict=False`` never stops running runs. ``margin_s`` is
    added to every predicted start: pass the time until the next pass, since a run that is fine
    now but late by then can no longer be helped then. It must be finite and >= 0 (``ValueError``):
    a negative margin would call late runs on time, an endless one every run late.
    """
    if not (isinstance(margin_s, (int, float)) and math.isfinite(margin_s) and margin_s >= 0):
        raise ValueError(f"margin_s must be the seconds until the next pass, finite and >= 0, not {margin_s!r}")
    slo_s = placement.policy.wait_slo_hours * 3600.0
    tier = {w.run_id: w.tier if w.tier is not None else placement.plan_for(w.request).tier
            for w in (*waiting, *running)}
    dues = {w.run_id: w.due if w.due is not None else due_at(w.request.deadline, w.request.submitted_at, slo_s)
            for w in waiting}

    def key(w: WaitingRun) -> tuple[int, float]:
        return queue_key(tier[w.run_id], dues[w.run_id])

    queue = sorted(waiting, key=key)  # stable: arrival order among equal dues
    on_slots = [QueuedRun(r.request.gpus, r.hours_left, tier[r.run_id], r.limit_hours_left) for r in running]

    def replay() -> list[float]:
        return start_delays(gpu_slots, on_slots, [
            QueuedRun(w.request.gpus, w.expected_hours or w.request.run_hours, tier[w.run_id], w.request.max_run_hours)
            for w in queue
        ], reserved=reserved_slots)

    def due(req: ResourceRequest) -> float:
        return req.deadline if req.deadline is not None else req.submitted_at + slo_s

    def late(req: ResourceRequest, start: float) -> bool:
        if req.deadline is not None:
            return now + start + req.run_hours * 3600.0 > req.deadline
        return now + start > due(req)

    moves: list[Move] = []
    held: list[Hold] = []
    demoted: list[str] = []
    stuck: list[WaitingRun] = []  # may not leave and would be late
    starts = replay()
    i = 0
    while i < len(queue):
        run, start = queue[i], starts[i] + margin_s
        req = run.request
        i += 1
        if not late(req, start):
            continue
        if tier[run.run_id] is QueueTier.stay:  # data may not leave, or no other site can make it
            stuck.append(run)
            held.append(Hold(run.run_id, partial(_stay_reason, placement, req, now + start)))
            continue
        queues = dict(others or {})
        queues[site] = QueueState(site, gpu_slots, reserved_slots=reserved_slots, expected_wait_s=start)
        try:
            d = placement.decide(req, now=now, queues=queues, spot=spot, team_spend=team_spend)
        except NoFeasiblePlacement as err:
            held.append(Hold(run.run_id, partial(str, f"no site may run it: {err}")))
            continue
        if d.site == site:
            if d.late and tier[run.run_id] is not QueueTier.late:
                # not worth rescuing: to the last queue, behind every run that can still make it (held there)
                demoted.append(run.run_id)
                tier[run.run_id] = QueueTier.late
                i -= 1
                del queue[i]
                queue.insert(bisect.bisect_right(queue, key(run), lo=i, key=key), run)  # by its due there
                starts = replay()
                continue
            if d.urgent:  # only starting here now makes it (or is cheapest): make room as for a run that must stay
                stuck.append(run)
            held.append(Hold(run.run_id, partial(lambda d: "; ".join(d.reasons), d)))
            continue
        moves.append(Move(run.run_id, site, d))
        i -= 1
        del queue[i]
        starts = replay()  # the runs behind it may now make it

    evictions = _evictions(placement, site, gpu_slots, stuck, running, tier, now, others, spot, team_spend,
                           late, margin_s) if evict and stuck else []
    kept = len(queue)
    free_now = gpu_slots - sum(r.request.gpus for r in running)
    if kept == 0 and free_now >= release_free_fraction * gpu_slots:
        release, why = True, (f"{site}: no run waiting and {free_now} of {gpu_slots} GPUs free; "
                              "burst capacity can be released")
    else:
        release, why = False, f"{site}: {kept} run(s) waiting, {free_now} of {gpu_slots} GPUs free"
    return BurstPlan(tuple(moves), tuple(evictions), tuple(held), release, why, tuple(demoted))


def pass_now(decision: PlacementDecision) -> bool:
    """Whether a controller pass should run as soon as the run of ``decision`` is queued, not at the next
    tick: it is urgent (only an immediate on-prem start makes its deadline) and room must be made for it.
    The simulator and the live flows both ask this."""
    return decision.urgent and decision.is_onprem


def _evictions(placement, site, gpu_slots, stuck, running, tier, now, others, spot, team_spend, late,
               margin_s: float = 0.0) -> list[Evict]:
    """Running runs to stop so that stay-at-home runs that would miss their deadline can start now.

    Each candidate victim either goes back to the head of its queue here (losing the work since
    its checkpoint and a restart, and waiting out the stay-at-home run — only if its own deadline
    still allows) or resumes where the engine places its remaining work (paying the dearer site).
    The cheaper way is its cost; victims are taken cheapest first.
    """
    free = gpu_slots - sum(r.request.gpus for r in running)
    here = placement.by_name[site].gpu_hour_price
    restart_h = placement.cost_model.restart_s / 3600.0
    options: list[tuple[float, RunningRun, PlacementDecision | None]] = []
    longest_stuck_h = max(w.request.run_hours for w in stuck)
    for victim in running:
        if tier[victim.run_id] is QueueTier.stay:
            continue
        req = victim.request
        lost = req.gpus * (victim.since_checkpoint_h + restart_h) * here
        back_by = now + (longest_stuck_h + restart_h + victim.hours_left) * 3600.0
        lost_anyway = req.deadline is not None and now + victim.hours_left * 3600.0 > req.deadline
        if req.deadline is None or back_by <= req.deadline or lost_anyway or tier[victim.run_id] is QueueTier.late:
            options.append((lost, victim, None))
            continue
        left = dataclasses.replace(req, run_hours=max(victim.hours_left, 1e-3),
                                   max_run_hours=max(victim.limit_hours_left, victim.hours_left, 1e-3))
        queues = dict(others or {})
        queues[site] = QueueState(site, gpu_slots, expected_wait_s=math.inf)  # it is leaving this pool
        try:
            d = placement.decide(left, now=now, queues=queues, spot=spot, team_spend=team_spend)
        except NoFeasiblePlacement:
            continue
        if d.site != site:
            extra = d.cost_usd - left.gpus * left.run_hours * here
            options.append((lost + extra, victim, d))
    options.sort(key=lambda o: o[0])
    out: list[Evict] = []
    for run in stuck:
        req = run.request
        if late(req, 0.0):
            continue  # even starting now would not save it
        # A run that can still wait for the next pass takes only victims that checkpointed within
        # that time (they lose little now); the others reach a checkpoint before it has to start.
        fresh_h = margin_s / 3600.0 if margin_s > 0 and not late(req, margin_s) else math.inf
        chosen, gained = [], 0
        for option in options:
            if free + gained >= req.gpus:
                break
            if option[1].since_checkpoint_h > fresh_h:
                continue
            chosen.append(option)
            gained += option[1].request.gpus
        if free + gained < req.gpus:
            continue  # not enough room even so: evict nobody for it
        out.extend(Evict(v.run_id, run.run_id, site, d, cost) for cost, v, d in chosen)
        options = [o for o in options if o not in chosen]
        free += gained - req.gpus
    return out


def _stay_reason(placement: Placement, req: ResourceRequest, start_at: float) -> str:
    when = f"its deadline {clock(req.deadline)}" if req.deadline is not None else "its wait SLO"
    if not placement.plan_for(req).must_stay:
        return f"would start at {clock(start_at)} and miss {when}; no other site can make it either (urgent)"
    rules = sorted({v.rule for v in placement.plan_for(req).verdicts if not v.allowed and v.rule})
    return (f"would start at {clock(start_at)} and miss {when}, but its data may not leave: every off-prem "
            f"candidate is rejected ({', '.join(rules)})")
