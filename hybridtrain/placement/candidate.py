"""CandidateView: every candidate (site × capacity class) for one request at one moment — allowed by
the policy, priced by the cost model, with its queue wait — which every strategy chooses from."""


from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from hybridtrain.placement.cost_model import spot_split
from hybridtrain.placement.policy import Rule, Verdict
from hybridtrain.placement.queue_state import QueueState, QueueTier
from hybridtrain.placement.request import GB, ResourceRequest
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.specs.sites import CapacityClass

#: Seconds of tolerance when comparing a finish time with the deadline (float rounding).
EPS_S = 1e-6
#: The rule named when a candidate is rejected because its site is unhealthy (``decide(unavailable=...)``).
HEALTH_RULE = "site health"


class Cand(NamedTuple):
    """The static facts of one allowed candidate, for one kind of request."""

    site: str
    klass: CapacityClass
    onprem: bool
    spot: bool
    burst: bool
    price: float  # per GPU-hour of this capacity class
    od_price: float  # the site's on-demand price (spot fallback)
    inv_speed: float  # run hours here per reference run hour
    startup_s: float
    egress_usd_per_byte: float  # dataset leaving its site, 0 when local
    ckpt_usd_per_byte: float  # checkpoint coming home, 0 when local
    sync_s_per_byte: float
    remote: bool
    lower_bound: float  # USD per reference GPU-hour no run here can cost less than


class Priced(NamedTuple):
    """One candidate priced for one decision (times in seconds from ``now``)."""

    total: float
    egress_usd: float
    egress_gb: float
    wait: float
    start: float
    finish: float
    feasible: bool
    meets: bool


@dataclass(slots=True)
class KeyPlan:
    """What the policy allows for one kind of request: verdicts, and the allowed candidates in price order."""

    verdicts: list[Verdict]  # every candidate, catalog order
    allowed: list[int]  # candidate numbers of the allowed ones
    cands: list[Cand]  # parallel to ``allowed``
    by_price: list[int]  # positions in ``cands``, cheapest lower bound first
    must_stay: bool  # no allowed candidate is off-prem
    tier: QueueTier  # the pool queue its runs wait in
    onprem: list[int]
    spot: list[int]
    burst: list[int]
    rules: list[tuple[int, Rule]]
    cost_rules: list[tuple[int, Rule]]  # the matching rules that cap egress or cost
    job_class: str
    max_egress_gb: float
    max_egress_usd: float
    max_cost_usd: float
    static_cap: float  # the lowest cost cap that does not depend on the request's own budget
    strategy: str | None  # the job class's strategy, if it names one
    rejected: dict[str, str]


class Conditions:
    """Queue states and spot outlooks at one instant, for the engine's candidates.

    Build one with ``Placement.observe`` and pass it to many ``decide`` calls (a flow tick, a
    burst-controller pass): each site's wait is then computed once per GPU count.
    """

    __slots__ = ("queues", "spot", "default_spot", "_waits")

    def __init__(self, queues: Mapping[str, QueueState] | None, spot: Mapping[str, SpotOutlook] | None,
                 default_spot: SpotOutlook) -> None:
        self.queues = dict(queues or {})
        self.spot = dict(spot or {})
        self.default_spot = default_spot
        self._waits: dict[tuple, float] = {}

    def wait(self, site: str, gpus: int, tier: QueueTier, hours: float, limit_hours: float) -> float:
        """Expected queue wait (s) at ``site`` of a new run (see ``QueueState.wait_s``)."""
        key = (site, gpus, tier, hours, limit_hours)
        w = self._waits.get(key)
        if w is None:
            q = self.queues.get(site)
            w = self._waits[key] = q.wait_s(gpus, tier, hours, limit_hours) if q is not None else 0.0
        return w

    def first_queue_wait(self, site: str, gpus: int, hours: float, limit_hours: float) -> float:
        """Expected wait (s) at ``site`` of a new run queued first with every stoppable run stopped
        (see ``QueueState.first_queue_wait_s``); 0 for a site without a queue state."""
        q = self.queues.get(site)
        return q.first_queue_wait_s(gpus, hours, limit_hours) if q is not None else 0.0

    def queued(self, site: str) -> int:
        q = self.queues.get(site)
        return q.queued if q is not None else 0

    def outlook(self, site: str) -> SpotOutlook:
        return self.spot.get(site, self.default_spot)


class CandidateView:
    """The allowed candidates of one decision, priced on demand; what strategies query.

    Positions index ``plan.cands``. Groups are ``"all"``, ``"onprem"``, ``"spot"``, ``"burst"``.
    ``meets`` means finishing by the deadline or, without one, starting by ``due`` (submission
    + the policy's wait SLO); ``feasible`` means passing every cost cap.
    """

    __slots__ = ("plan", "conditions", "request", "now", "deadline", "due", "slo_s", "_cap", "_k", "_restart_h",
                 "_priced")

    def __init__(self, plan: KeyPlan, conditions: Conditions, request: ResourceRequest, now: float,
                 due: float, slo_s: float, cap: float, restart_h: float) -> None:
        self.plan = plan
        self.conditions = conditions
        self.request = request
        self.now = now
        self.deadline = request.deadline
        self.due = due
        self.slo_s = slo_s
        self._cap = cap
        self._restart_h = restart_h
        self._k = request.checkpoint_interval_s / 7200.0 + restart_h
        self._priced: dict[int, Priced] = {}

    # --- pricing ---------------------------------------------------------------------------

    def priced(self, pos: int) -> Priced:
        """Cost and timing of candidate ``pos`` (computed once per decision)."""
        p = self._priced.get(pos)
        if p is not None:
            return p
        c = self.plan.cands[pos]
        r = self.request
        cond = self.conditions
        nbytes = r.dataset_bytes
        run_h = r.run_hours * c.inv_speed
        wait = (cond.wait(c.site, r.gpus, self.plan.tier, run_h, r.max_run_hours * c.inv_speed)
                if cond.queues else 0.0)
        start = c.startup_s + nbytes * c.sync_s_per_byte
        egress = nbytes * c.egress_usd_per_byte + r.checkpoint_bytes * c.ckpt_usd_per_byte
        if c.spot:
            o = cond.outlook(c.site)
            if not o.available_now:
                wait += o.expected_wait_s
            start += wait
            window = (self.deadline - self.now - start) / 3600.0 if self.deadline is not None else None
            split = spot_split(run_h, 1.0 + o.preemptions_per_hour * self._k, o.availability, window,
                               self._restart_h)
            compute = r.gpus * (split.spot_hours * c.price + split.on_demand_hours * c.od_price)
            wall_h = split.wall_hours
        else:
            start += wait
            compute = r.gpus * run_h * c.price
            wall_h = run_h
        total = compute + egress
        finish = start + wall_h * 3600.0
        plan = self.plan
        egress_gb = (nbytes + r.checkpoint_bytes) / GB if c.remote else 0.0
        feasible = (total <= self._cap and egress <= plan.max_egress_usd and egress_gb <= plan.max_egress_gb)
        if self.deadline is not None:
            meets = finish <= self.deadline - self.now + EPS_S
        else:
            meets = start <= self.due - self.now + EPS_S
        p = self._priced[pos] = Priced(total, egress, egress_gb, wait, start, finish, feasible, meets)
        return p

    def group(self, name: str) -> list[int]:
        return self.plan.by_price if name == "all" else getattr(self.plan, name)

    def affordable(self, name: str) -> list[int]:
        """The group's candidates whose lower bound is within the cost cap (the rest cannot be feasible)."""
        cands, gh, cap = self.plan.cands, self.request.gpus * self.request.run_hours, self._cap
        out = []
        for pos in self.group(name):
            if cands[pos].lower_bound * gh > cap:
                break
            out.append(pos)
        return out

    # --- queries strategies use --------------------------------------------------------------

    def cheapest(self, group: str = "all", meeting: bool = True, exclude_site: str | None = None) -> int:
        """Cheapest feasible candidate in ``group`` (that meets the due time if ``meeting``); -1 if none.

        Scans in order of each candidate's lower bound (price per reference GPU-hour × GPU-hours)
        and stops once that bound reaches the best total found, so usually few are priced.
        """
        gh = self.request.gpus * self.request.run_hours
        cands = self.plan.cands
        best, best_total = -1, math.inf
        for pos in self.group(group):
            lb = cands[pos].lower_bound * gh
            if lb >= best_total or lb > self._cap:
                break
            if cands[pos].site == exclude_site:
                continue
            p = self.priced(pos)
            if p.feasible and (p.meets or not meeting) and p.total < best_total:
                best, best_total = pos, p.total
        return best

    def cheapest_meeting_if_started_now(self, group: str = "all") -> int:
        """Cheapest feasible candidate in ``group`` that would meet the due time if it started as soon
        as room can be made for it; -1 if none.

        "As soon as" is the wait of a run queued first with every stoppable running run stopped
        (``QueueState.first_queue_wait_s``): it still waits for the urgent and stay-at-home runs
        ahead of it and on the slots — room the burst controller cannot make. Without per-run
        detail in the queue state, no wait at all.
        """
        best, best_total = -1, math.inf
        r = self.request
        for pos in self.affordable(group):
            p = self.priced(pos)
            if not p.feasible or p.total >= best_total:
                continue
            c = self.plan.cands[pos]
            first = (self.conditions.first_queue_wait(c.site, r.gpus, r.run_hours * c.inv_speed,
                                                      r.max_run_hours * c.inv_speed)
                     if c.onprem and self.conditions.queues else 0.0)
            slack = (self.deadline if self.deadline is not None else self.due) - self.now
            at = (p.finish if self.deadline is not None else p.start) - p.wait + min(first, p.wait)
            if at <= slack + EPS_S:
                best, best_total = pos, p.total
        return best

    def fastest(self, group: str = "all") -> int:
        """Feasible candidate in ``group`` with the earliest finish (ties: cheaper); -1 if none."""
        best, key = -1, (math.inf, math.inf)
        for pos in self.affordable(group):
            p = self.priced(pos)
            if p.feasible and (p.finish, p.total) < key:
                best, key = pos, (p.finish, p.total)
        return best

    def least_late(self, group: str = "all") -> int:
        """Feasible candidate in ``group`` that misses the due time by least (ties: cheaper); -1 if none."""
        best, key = -1, (math.inf, math.inf)
        for pos in self.affordable(group):
            p = self.priced(pos)
            if p.feasible and (self.lateness(pos), p.total) < key:
                best, key = pos, (self.lateness(pos), p.total)
        return best

    # --- facts for reasons -----------------------------------------------------------------

    def lateness(self, pos: int) -> float:
        """Seconds candidate ``pos`` finishes (or, without a deadline, starts) after it should."""
        p = self.priced(pos)
        if self.deadline is not None:
            return p.finish - (self.deadline - self.now)
        return p.start - (self.due - self.now)

    def label(self, pos: int) -> str:
        c = self.plan.cands[pos]
        return f"{c.site} ({c.klass.value})"

    def site(self, pos: int) -> str:
        return self.plan.cands[pos].site

    def total(self, pos: int) -> float:
        return self.priced(pos).total

    def wait(self, pos: int) -> float:
        return self.priced(pos).wait

    def finish_at(self, pos: int) -> float:
        return self.now + self.priced(pos).finish

    def start_in(self, pos: int) -> float:
        return self.priced(pos).start

    def queued(self, pos: int) -> int:
        return self.conditions.queued(self.plan.cands[pos].site)

    def must_wait(self, pos: int) -> bool:
        """Whether a run would queue at candidate ``pos`` now (runs queued, or too few free slots)."""
        q = self.conditions.queues.get(self.plan.cands[pos].site)
        return q is not None and (q.queued > 0 or q.free_slots < self.request.gpus)

    def has_onprem(self) -> bool:
        return bool(self.plan.onprem)


