"""Placement: the engine that decides where a job runs — policy, cost model and strategy over every candidate.

``Placement(sites, policy, cost_model).decide(request, now=..., queues=..., spot=...)`` is a pure
function of its inputs: the request, the catalog, the policy, queue states, spot outlooks and the
clock are all passed in, so the flows (live Prefect state) and the simulator (replayed traces)
drive the very same code. It returns a ``PlacementDecision`` or raises ``NoFeasiblePlacement``
listing every candidate and the rule that rejected it.

Decisions are cheap because the work is split by how often its inputs change:

- per catalog and policy (once): each candidate's prices, speed, start-up and transfer rates;
- per kind of request (``request.policy_key``: sensitivity, tier, residency, GPUs, job class,
  team, data site, pin — first use only): the policy's site verdicts, and the allowed candidates
  sorted by their price per reference GPU-hour;
- per snapshot of live state (``observe``): queue waits per GPU count, spot outlooks;
- per decision: sites reported unavailable (``unavailable``: site health) lose their candidates,
  each rejected by rule ``site health`` with the reason; the strategy asks for what it needs —
  e.g. "the cheapest on-prem candidate that meets the deadline" — and candidates are priced on
  demand, scanning in price order and stopping as soon as no unpriced candidate can be cheaper.
  The full candidates table is priced only when the explanation is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from functools import partial

from hybridtrain.errors import NoFeasiblePlacement

#: Seconds of tolerance when comparing a finish time with the deadline (float rounding).
from hybridtrain.placement.candidate import HEALTH_RULE, Cand, CandidateView, Conditions, KeyPlan
from hybridtrain.placement.cost_model import CostModel, Estimate
from hybridtrain.placement.decision import PlacementDecision
from hybridtrain.placement.policy import Policy, Verdict, capacity_options, option_price
from hybridtrain.placement.queue_state import QueueState, QueueTier, due_at
from hybridtrain.placement.request import GB, ResourceRequest
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.placement.strategy import Strategy
from hybridtrain.specs.sites import CapacityClass, Site, SiteKind, SitesCatalog


class Placement:
    """The placement engine for one sites catalog and one policy."""

    def __init__(
        self,
        sites: SitesCatalog | Sequence[Site],
        policy: Policy,
        cost_model: CostModel | None = None,
    ) -> None:
        self.sites: tuple[Site, ...] = sites.sites if isinstance(sites, SitesCatalog) else tuple(sites)
        self.policy = policy
        self.cost_model = cost_model or CostModel()
        self.by_name = {s.name: s for s in self.sites}
        self.options: list[tuple[Site, CapacityClass]] = [(s, k) for s in self.sites for k in capacity_options(s)]
        self._plans: dict[tuple, KeyPlan] = {}
        self._strategies: dict[str, Strategy] = {}
        self._slo_s = policy.wait_slo_hours * 3600.0
        self._restart_h = self.cost_model.restart_s / 3600.0
        self._empty = Conditions(None, None, self.cost_model.default_spot)
        self._default = self.strategy(policy.default_strategy)
        self._team_caps = dict(policy.budgets.teams)

    def observe(
        self, queues: Mapping[str, QueueState] | None = None, spot: Mapping[str, SpotOutlook] | None = None
    ) -> Conditions:
        """Live state (site → queue state, site → spot outlook) as one snapshot for many decisions."""
        return Conditions(queues, spot, self.cost_model.default_spot)

    # --- compile ---------------------------------------------------------------------------

    def plan_for(self, request: ResourceRequest) -> KeyPlan:
        """The compiled policy verdicts for requests like this one (cached by ``policy_key``)."""
        plan = self._plans.get(request.policy_key)
        if plan is None:
            plan = self._plans[request.policy_key] = self._compile(request)
        return plan

    def _compile(self, request: ResourceRequest) -> KeyPlan:
        policy, cm = self.policy, self.cost_model
        rules = policy.matching_rules(request)
        verdicts = [policy.static_verdict(request, s, k, rules) for s, k in self.options]
        src = self.by_name.get(request.data_site)
        allowed, cands = [], []
        for i, ((site, klass), v) in enumerate(zip(self.options, verdicts, strict=True)):
            if not v.allowed:
                continue
            remote = site.name != request.data_site
            src_bw = src.bandwidth_mbps if src is not None else site.bandwidth_mbps
            price = option_price(site, klass)
            inv_speed = 1.0 / cm.speed(site)
            is_spot = klass is CapacityClass.opportunistic
            allowed.append(i)
            cands.append(Cand(
                site=site.name, klass=klass, onprem=site.kind is SiteKind.onprem, spot=is_spot,
                burst=klass is CapacityClass.burst, price=price, od_price=site.gpu_hour_price,
                inv_speed=inv_speed, startup_s=cm.startup(site),
                egress_usd_per_byte=(src.egress_per_gb if src is not None else 0.0) / GB if remote else 0.0,
                ckpt_usd_per_byte=site.egress_per_gb / GB if remote else 0.0,
                sync_s_per_byte=8.0 / (min(src_bw, site.bandwidth_mbps) * 1e6) if remote else 0.0,
                remote=remote,
                lower_bound=(min(price, site.gpu_hour_price) if is_spot else price) * inv_speed,
            ))
        by_price = sorted(range(len(cands)), key=lambda p: (cands[p].lower_bound, p))

        def cap(attr: str) -> float:
            values = [getattr(r, attr) for _, r in rules if getattr(r, attr) is not None]
            return min(values) if values else math.inf

        job_class = policy.job_class_of(request)
        per_job = policy.budgets.per_job_usd
        return KeyPlan(
            verdicts=verdicts,
            allowed=allowed,
            cands=cands,
            by_price=by_price,
            must_stay=all(c.onprem for c in cands),
            tier=(QueueTier.stay if all(c.onprem for c in cands)
                  else QueueTier.spot if any(c.spot for c in cands) else QueueTier.on_demand),
            onprem=[p for p in by_price if cands[p].onprem],
            spot=[p for p in by_price if cands[p].spot],
            burst=[p for p in by_price if cands[p].burst],
            rules=rules,
            cost_rules=[(i, r) for i, r in rules if r.cost_fields],
            job_class=job_class,
            max_egress_gb=cap("max_egress_gb"),
            max_egress_usd=cap("max_egress_usd"),
            max_cost_usd=cap("max_cost_usd"),
            static_cap=min(cap("max_cost_usd"), per_job if per_job is not None else math.inf),
            strategy=policy.job_classes[job_class].strategy,
            rejected={f"{v.site} ({v.capacity_class.value})": f"{v.rule}: {v.reason}" for v in verdicts if not v.allowed},
        )

    def strategy(self, name: str | None = None) -> Strategy:
        """The named strategy with the policy's options for it (cached)."""
        name = name or self.policy.default_strategy
        s = self._strategies.get(name)
        if s is None:
            s = self._strategies[name] = self.policy.strategy(name)
        return s

    # --- decide ----------------------------------------------------------------------------

    def decide(
        self,
        request: ResourceRequest,
        *,
        now: float,
        queues: Mapping[str, QueueState] | None = None,
        spot: Mapping[str, SpotOutlook] | None = None,
        conditions: Conditions | None = None,
        strategy: str | Strategy | None = None,
        team_spend: Mapping[str, float] | None = None,
        unavailable: Mapping[str, str] | None = None,
    ) -> PlacementDecision:
        """Where ``request`` should run at ``now``; raises ``NoFeasiblePlacement`` if nowhere may.

        Live state comes as ``queues`` and ``spot`` mappings (site → state), or as ``conditions``
        from ``observe`` when many decisions share one snapshot. ``strategy`` overrides the one
        the spec, job class or policy names. ``team_spend`` is each team's spend this period.
        ``unavailable`` maps sites that must not be used now (failed health checks, a site the
        job was just preempted or lost at) to the reason: their candidates are rejected by rule
        ``site health`` with that reason, and appear so in the candidates table.
        """
        plan = self._plans.get(request.policy_key)
        if plan is None:
            plan = self.plan_for(request)
        if unavailable:
            healthy = _without_sites(plan, unavailable)
            if not healthy.cands and plan.cands:
                raise NoFeasiblePlacement(
                    request.job, healthy.rejected,
                    hint=f"every site the policy allows is unavailable now ({HEALTH_RULE}); the job can run once "
                         "one of them is healthy again")
            plan = healthy
        if not plan.cands:
            raise NoFeasiblePlacement(request.job, plan.rejected)
        if conditions is None:
            conditions = self._empty if queues is None and spot is None else self.observe(queues, spot)
        if strategy is None or isinstance(strategy, str):
            name = strategy or request.strategy or plan.strategy
            strat = self._strategies.get(name) if name else self._default
            if strat is None:
                strat = self.strategy(name)
        else:
            strat = strategy

        cap = plan.static_cap
        if request.budget_usd is not None and request.budget_usd < cap:
            cap = request.budget_usd
        if self._team_caps:
            team_cap = self._team_caps.get(request.team)
            if team_cap is not None:
                cap = min(cap, team_cap - (team_spend or {}).get(request.team, 0.0))
        due = due_at(request.deadline, request.submitted_at, self._slo_s)
        view = CandidateView(plan, conditions, request, now, due, self._slo_s, cap, self._restart_h)
        choice = strat.choose(view)
        if choice.pos < 0:
            # Rejections are built only if read (callers that try many requests rarely read them);
            # the spend seen is this decision's, even if the caller's mapping changes later.
            raise NoFeasiblePlacement(request.job, partial(self.rejections, view,
                                                           dict(team_spend) if team_spend else None))
        return PlacementDecision(self, view, choice.pos, strat.name, choice.reasons, team_spend, choice.urgent,
                                 choice.late)

    # --- explain ---------------------------------------------------------------------------

    def verdicts(self, view: CandidateView, team_spend: Mapping[str, float] | None = None) -> list[Verdict]:
        """Every candidate's verdict for this decision: the policy's site rules, then its cost caps."""
        plan, r = view.plan, view.request
        spent = (team_spend or {}).get(r.team, 0.0)
        out = list(plan.verdicts)
        for pos, n in enumerate(plan.allowed):
            p = view.priced(pos)
            if not p.feasible:
                c = plan.cands[pos]
                out[n] = self.policy.cost_verdict(r, c.site, c.klass, egress_gb=p.egress_gb, egress_usd=p.egress_usd,
                                                  total_usd=p.total, team_spent_usd=spent, rules=plan.cost_rules)
        return out

    def rejections(self, view: CandidateView, team_spend: Mapping[str, float] | None = None) -> dict[str, str]:
        """``"site (capacity)"`` → ``"rule: reason"`` for every candidate rejected in this decision."""
        return {f"{v.site} ({v.capacity_class.value})": f"{v.rule}: {v.reason}"
                for v in self.verdicts(view, team_spend) if not v.allowed}

    def estimate(
        self,
        request: ResourceRequest,
        site: str,
        capacity_class: CapacityClass,
        *,
        now: float,
        conditions: Conditions | None = None,
    ) -> Estimate:
        """The cost model's full estimate (every term) for one candidate, with the inputs ``decide`` had."""
        cond = conditions or self._empty
        return self.cost_model.estimate(
            request, self.by_name[site], now=now, capacity_class=capacity_class,
            queue=cond.queues.get(site), spot=cond.spot.get(site),
            data_site=self.by_name.get(request.data_site), tier=self.plan_for(request).tier,
        )


def _without_sites(plan: KeyPlan, unavailable: Mapping[str, str]) -> KeyPlan:
    """``plan`` with the candidates at ``unavailable`` sites rejected by ``HEALTH_RULE``.

    A copy: the cached plan stays as the policy compiled it.
    """
    if not any(c.site in unavailable for c in plan.cands):
        return plan
    keep = [p for p, c in enumerate(plan.cands) if c.site not in unavailable]
    moved = {old: new for new, old in enumerate(keep)}
    verdicts = list(plan.verdicts)
    rejected = dict(plan.rejected)
    for p, c in enumerate(plan.cands):
        if c.site in unavailable:
            reason = unavailable[c.site]
            verdicts[plan.allowed[p]] = Verdict(c.site, c.klass, False, HEALTH_RULE, reason)
            rejected[f"{c.site} ({c.klass.value})"] = f"{HEALTH_RULE}: {reason}"

    def remap(positions: list[int]) -> list[int]:
        return [moved[p] for p in positions if p in moved]

    # must_stay and the queue tier are the policy's verdict on the job, not on today's health.
    return dataclasses.replace(
        plan, verdicts=verdicts, allowed=[plan.allowed[p] for p in keep], cands=[plan.cands[p] for p in keep],
        by_price=remap(plan.by_price), onprem=remap(plan.onprem), spot=remap(plan.spot), burst=remap(plan.burst),
        rejected=rejected,
    )


def decide(
    request: ResourceRequest,
    sites: SitesCatalog | Sequence[Site],
    policy: Policy,
    queues: Mapping[str, QueueState] | None = None,
    *,
    now: float,
    strategy: str | Strategy | None = None,
    cost_model: CostModel | None = None,
    spot: Mapping[str, SpotOutlook] | None = None,
    team_spend: Mapping[str, float] | None = None,
    unavailable: Mapping[str, str] | None = None,
) -> PlacementDecision:
    """One-off decision (compiles the engine each call; keep a ``Placement`` for many decisions)."""
    return Placement(sites, policy, cost_model).decide(
        request, now=now, queues=queues, spot=spot, strategy=strategy, team_spend=team_spend,
        unavailable=unavailable,
    )
