"""Placement engine: table-driven decisions with their reasons, explanations that add up, and a property test."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtrain.errors import NoFeasiblePlacement, SpecError
from hybridtrain.placement.cost_model import CostModel, clock, spot_split
from hybridtrain.placement.decision import MAX_TAG_CHARS
from hybridtrain.placement.engine import Placement, decide
from hybridtrain.placement.policy import Policy, capacity_options
from hybridtrain.placement.queue_state import QueuedRun, QueueState, QueueTier
from hybridtrain.placement.request import DataTier, request_from_spec
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.placement.strategy import STRATEGIES, ThresholdBurst
from hybridtrain.specs.job import Sensitivity, load_spec
from hybridtrain.specs.sites import CapacityClass, SitesCatalog
from tests.fixtures.placement_cases import CLOUD_EU, CLOUD_US, CLOUD_V100, NOW, ONPREM, SITES, H, busy, request
from tests.fixtures.workspaces import ROOT

# (reason, request overrides, queue wait ahead on-prem in hours (None: empty), spot outlooks,
#  expected site, expected capacity class, meets deadline)
CASES = [
    ("queue empty keeps on-prem", dict(), None, None, "onprem-dc1", "fixed", True),
    ("a short queue still meets the deadline: stay", dict(), 3.0, None, "onprem-dc1", "fixed", True),
    ("deadline forces burst to the cheapest cloud that meets it", dict(), 5.0, None, "cloud-v100", "burst", True),
    ("residency blocks the cheaper US cloud", dict(sensitivity=Sensitivity.confidential), 5.0, None,
     "cloud-eu", "burst", True),
    ("restricted data stays even when late (flagged)", dict(sensitivity=Sensitivity.restricted), 5.0, None,
     "onprem-dc1", "fixed", False),
    ("GPU type mismatch rules out the cheapest cloud", dict(gpu_type="A100"), 5.0, None, "cloud-us", "burst", True),
    ("budget exceeded everywhere but on-prem: stay, flagged", dict(budget_usd=3.0), 5.0, None,
     "onprem-dc1", "fixed", False),
    ("opportunistic job bursts to spot when on-prem waits too long", dict(job_class="opportunistic"), 3.0, None,
     "cloud-v100", "opportunistic", True),
    ("spot fallback: scarce spot is priced with on-demand fallback but still meets the deadline",
     dict(job_class="opportunistic", residency=("US",)), 3.0,
     {"cloud-us": SpotOutlook(availability=0.3, preemptions_per_hour=0.5)}, "cloud-us", "opportunistic", True),
    ("no deadline: the wait SLO decides (3 h < 4 h: stay)", dict(deadline=None), 3.0, None,
     "onprem-dc1", "fixed", True),
    ("no deadline: a 5 h wait breaks the SLO: burst", dict(deadline=None), 5.0, None, "cloud-v100", "burst", True),
    ("nothing meets the deadline: least late, flagged", dict(deadline=NOW + 1.5 * H), 5.0, None,
     "cloud-v100", "burst", False),
]


@pytest.mark.parametrize("why,kw,wait,spot,site,klass,meets", CASES, ids=[c[0] for c in CASES])
def test_decisions(engine, why, kw, wait, spot, site, klass, meets):
    d = engine.decide(request(**kw), now=NOW, queues=busy(wait) if wait else None, spot=spot)
    assert (d.site, d.capacity_class.value, d.meets_deadline) == (site, klass, meets), f"{why}: {d} {d.reasons}"
    assert d.reasons and all(isinstance(r, str) for r in d.reasons)
    if not meets:  # flagged as late, or queued first as urgent
        assert any("flagged" in r or "urgent" in r for r in d.reasons), d.reasons


def test_scarce_spot_is_priced_with_its_on_demand_fallback(engine):
    scarce = {"cloud-us": SpotOutlook(availability=0.3, preemptions_per_hour=0.5)}
    d = engine.decide(request(job_class="opportunistic", residency=("US",)), now=NOW, spot=scarce)
    e = d.estimate
    assert d.capacity_class is CapacityClass.opportunistic and d.meets_deadline
    assert e.on_demand_gpu_hours > 0 and e.spot_gpu_hours > 0
    assert e.compute_usd == pytest.approx(e.spot_gpu_hours * 0.8 + e.on_demand_gpu_hours * 3.0)
    assert "on-demand fallback" in e.lines()[0]


def test_urgent_when_only_an_on_prem_start_now_makes_it(engine):
    # 1 TB to sync takes 4.4 h: no cloud makes a 2.5 h deadline; on-prem would, were it not for the queue.
    d = engine.decide(request(dataset_bytes=10**12, deadline=NOW + 2.5 * H), now=NOW, queues=busy(5.0))
    assert d.site == "onprem-dc1" and d.urgent and not d.meets_deadline
    assert d.queue_tier is QueueTier.stay and d.to_tags()["placement.urgent"] == "true"
    assert "urgent" in d.reasons[-1] and "makes room" in d.reasons[-1]
    # a deadline even an immediate start cannot meet is not urgent: least late, flagged
    late = engine.decide(request(dataset_bytes=10**12, deadline=NOW + 1.5 * H), now=NOW, queues=busy(5.0))
    assert not late.urgent and "flagged" in late.reasons[-1]


def test_restricted_reason_names_the_rule(engine):
    d = engine.decide(request(sensitivity=Sensitivity.restricted), now=NOW, queues=busy(5.0))
    assert "no on-prem" not in d.reasons[0]
    assert d.rejected["cloud-eu (burst)"].startswith("rules[0] (restricted data never leaves on-prem)")
    assert d.must_stay and d.queue_tier is QueueTier.stay


def test_no_feasible_placement_lists_every_candidate_and_rule(policy):
    eng = Placement([CLOUD_US, CLOUD_V100], policy)
    with pytest.raises(NoFeasiblePlacement) as info:
        eng.decide(request(sensitivity=Sensitivity.restricted), now=NOW)
    err = info.value
    assert set(err.rejected) == {"cloud-us (burst)", "cloud-us (opportunistic)", "cloud-v100 (burst)",
                                 "cloud-v100 (opportunistic)"}
    assert err.rejected["cloud-us (burst)"].startswith("rules[0] (restricted data never leaves on-prem)")
    assert "cloud-v100 (burst): rules[0]" in str(err)


def test_cost_caps_everywhere_raise_with_the_cap_rule(engine):
    with pytest.raises(NoFeasiblePlacement) as info:
        engine.decide(request(budget_usd=0.5), now=NOW)
    assert info.value.rejected["onprem-dc1 (fixed)"].startswith("spec budget_usd: estimated $2.26 exceeds")


def test_a_refusal_keeps_the_spend_it_was_decided_with_and_pickles_as_its_values(engine):
    import pickle

    spend = {"default": 0.0}
    with pytest.raises(NoFeasiblePlacement) as info:
        engine.decide(request(budget_usd=0.5), now=NOW, team_spend=spend)
    spend["default"] = 1e9  # the caller's books move on; the refusal still says why it was refused then
    err = info.value
    assert err.rejected["onprem-dc1 (fixed)"].startswith("spec budget_usd: estimated $2.26 exceeds")
    back = pickle.loads(pickle.dumps(err))
    assert (back.job, back.rejected, str(back)) == (err.job, err.rejected, str(err))


def test_strategies_by_name(engine):
    req = request(deadline=NOW + 24 * H)
    q = busy(3.0)
    assert engine.decide(req, now=NOW, queues=q).site == "onprem-dc1"
    assert engine.decide(req, now=NOW, queues=q, strategy="cheapest").site == "onprem-dc1"
    fastest = engine.decide(req, now=NOW, queues=q, strategy="fastest")
    assert fastest.site != "onprem-dc1" and fastest.finish_at < NOW + 3 * H
    assert engine.decide(req, now=NOW, queues=q, strategy=ThresholdBurst(queue_limit=0)).site == "cloud-v100"
    with pytest.raises(SpecError) as info:
        engine.decide(req, now=NOW, strategy="nope")
    assert "choose one of: cheapest, deadline_spot, fastest, onprem_first (default), threshold_burst" in str(info.value)
    assert STRATEGIES.default == "onprem_first"


def test_explanation_adds_up_by_hand(engine):
    """Every priced candidate's numbers equal the cost model's full estimate; the breakdown sums to the total."""
    spot = {"cloud-eu": SpotOutlook(availability=0.5, preemptions_per_hour=0.3, available_now=False,
                                    expected_wait_s=900)}
    req = request(job_class="opportunistic", checkpoint_bytes=2 * 10**9, gpus=2)
    d = engine.decide(req, now=NOW, queues=busy(4.0), spot=spot)
    cond = engine.observe(busy(4.0), spot)
    priced = [c for c in d.candidates if c.cost_usd is not None]
    assert len(priced) >= 5
    for c in priced:
        est = engine.estimate(req, c.site, c.capacity_class, now=NOW, conditions=cond)
        assert c.cost_usd == pytest.approx(est.total_usd, rel=1e-9), c
        assert c.finish_at == pytest.approx(est.finish_at, abs=1e-3), c
    e = d.estimate
    assert e.total_usd == pytest.approx(e.compute_usd + e.dataset_egress_usd + e.checkpoint_egress_usd)
    assert e.finish_at == pytest.approx(NOW + e.queue_wait_s + e.startup_s + e.sync_s + e.run_s)
    assert any(line.startswith("total: $") for line in e.lines())


def test_spot_split_keeps_the_deadline():
    # 4 h of work, 12 h window, spot there half the time with 10% overhead: spot alone would take 8.8 h.
    assert spot_split(4.0, 1.1, 0.5, 12.0, 0.1).on_demand_hours == 0.0
    tight = spot_split(4.0, 1.1, 0.5, 6.0, 0.1)
    assert 0 < tight.on_demand_hours < 4.0 and tight.wall_hours <= 6.0 + 1e-9
    assert spot_split(4.0, 1.1, 0.5, 3.0, 0.1).on_demand_hours == 4.0  # too late even on-demand
    assert spot_split(4.0, 1.1, 0.5, None, 0.1).wall_hours == pytest.approx(8.8)


def test_table_and_tags_for_the_run(engine):
    d = engine.decide(request(sensitivity=Sensitivity.confidential), now=NOW, queues=busy(5.0))
    rows = d.to_table()
    assert rows[0]["verdict"] == "chosen" and rows[0]["site"] == d.site
    assert {r["verdict"] for r in rows} == {"chosen", "allowed", "rejected"}
    assert all(isinstance(v, str) for r in rows for v in r.values())
    tags = d.to_tags()
    assert tags["placement.site"] == "cloud-eu" and tags["placement.meets_deadline"] == "true"
    assert "rules[1] (confidential data only in EU)" in tags["placement.rejected"]
    assert all(isinstance(v, str) and len(v) <= MAX_TAG_CHARS for v in tags.values())
    assert d.needs_sync


def test_request_from_the_project_spec():
    sites = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    spec = load_spec(ROOT / "jobs" / "churn.yaml", sites)
    req = request_from_spec(spec, dataset_bytes=10**9, now=NOW)
    assert req.run_hours == req.max_run_hours == spec.resources.max_hours  # no estimate: the hard limit
    assert req.deadline == NOW + 6 * H and req.residency == ("EU",) and req.team == "growth"
    assert req.dataset_bytes == int(10**9 * spec.sync.sample_fraction)
    assert req.pinned_site == "cloud-eu" and req.tier is DataTier.approved
    estimated = request_from_spec(spec, dataset_bytes=10**9, now=NOW, run_hours=0.25)
    assert estimated.run_hours == 0.25 and estimated.max_run_hours == 1.0
    d = decide(req, sites, Policy.load(ROOT / "deployments" / "policy.yaml", sites), now=NOW)
    assert d.site == "cloud-eu" and d.rejected["onprem-dc1 (fixed)"].startswith("spec placement.site")


def test_a_malformed_request_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        request(run_hours=0.0)
    assert "run_hours" in str(info.value)


# --- property: no decision ever lands on a candidate the policy rejects ----------------------------------

sites_st = st.lists(st.sampled_from(SITES), min_size=1, max_size=5, unique_by=lambda s: s.name)
requests_st = st.builds(
    lambda gpus, hours, sens, tier, job_class, gpu_type, residency, deadline_h, budget, nbytes, pin, team: request(
        gpus=gpus, run_hours=hours, max_run_hours=hours * 2, sensitivity=sens, tier=tier, job_class=job_class,
        gpu_type=gpu_type, residency=residency, deadline=None if deadline_h is None else NOW + deadline_h * H,
        budget_usd=budget, dataset_bytes=nbytes, pinned_site=pin, team=team),
    gpus=st.sampled_from([0, 1, 2, 4, 8, 16]),
    hours=st.floats(0.05, 48),
    sens=st.sampled_from(list(Sensitivity)),
    tier=st.sampled_from(list(DataTier)),
    job_class=st.sampled_from(["standard", "production", "opportunistic"]),
    gpu_type=st.sampled_from([None, "A100", "V100", "H100"]),
    residency=st.sampled_from([(), ("EU",), ("US",)]),
    deadline_h=st.one_of(st.none(), st.floats(0.1, 100)),
    budget=st.one_of(st.none(), st.floats(0.1, 1000)),
    nbytes=st.integers(0, 5 * 10**12),
    pin=st.sampled_from([None, None, "onprem-dc1", "cloud-eu"]),
    team=st.sampled_from(["default", "growth"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests_st, sites=sites_st, wait_h=st.floats(0, 50), strategy=st.sampled_from(STRATEGIES.names),
       avail=st.floats(0.05, 1.0), spent=st.floats(0, 3000))
def test_no_decision_lands_on_a_rejected_site(policy, req, sites, wait_h, strategy, avail, spent):
    engine = Placement(sites, policy)
    queues = busy(wait_h) if wait_h > 0 and any(s.name == "onprem-dc1" for s in sites) else None
    spot = {"cloud-eu": SpotOutlook(availability=avail)}
    team_spend = {"growth": spent}
    try:
        d = engine.decide(req, now=NOW, queues=queues, spot=spot, strategy=strategy, team_spend=team_spend)
    except NoFeasiblePlacement as err:
        # then every candidate really is rejected, each with its rule
        assert len(err.rejected) == sum(len(capacity_options(s)) for s in sites)
        assert all(":" in why for why in err.rejected.values())
        return
    site = engine.by_name[d.site]
    cond = engine.observe(queues, spot)
    est = engine.estimate(req, d.site, d.capacity_class, now=NOW, conditions=cond)
    v = policy.evaluate(req, site, d.capacity_class, estimate=est, team_spend=team_spend)
    assert v.allowed, f"{d} landed on a rejected candidate: {v}"
    assert d.cost_usd == pytest.approx(est.total_usd, rel=1e-9, abs=1e-9)
    # and the engine's verdicts agree with the policy's own, candidate by candidate
    for c in d.candidates:
        ref = policy.evaluate(req, engine.by_name[c.site], c.capacity_class,
                              estimate=engine.estimate(req, c.site, c.capacity_class, now=NOW, conditions=cond),
                              team_spend=team_spend)
        assert (c.allowed, c.rule) == (ref.allowed, ref.rule), (c, ref)
    if strategy == "onprem_first" and d.meets_deadline is False:
        assert not any(c.allowed and c.meets_deadline for c in d.candidates if c.site == "onprem-dc1")


def test_decisions_are_pure(engine):
    req = request()
    q = busy(5.0)
    a = engine.decide(req, now=NOW, queues=q)
    b = Placement(SITES, engine.policy).decide(req, now=NOW, queues=dict(q))
    assert (a.site, a.capacity_class, a.cost_usd, a.finish_at) == (b.site, b.capacity_class, b.cost_usd, b.finish_at)
    assert a.to_table() == b.to_table()


def test_queue_tier_orders_who_waits(engine):
    """A spot-capable run waits behind runs that could only burst on demand; a stay-at-home run goes first."""
    running = tuple(QueuedRun(1, 1.0, QueueTier.on_demand, 2.0) for _ in range(8))
    backlog = (QueuedRun(1, 3.0, QueueTier.on_demand, 4.0),) * 8
    q = {"onprem-dc1": QueueState("onprem-dc1", 8, 8, running=8, scheduled=8, backlog=backlog, running_runs=running)}
    waits = {cls: engine.decide(request(sensitivity=sens, job_class=cls, deadline=NOW + 48 * H), now=NOW, queues=q)
             .queue_wait_s for cls, sens in [("standard", Sensitivity.restricted), ("standard", Sensitivity.internal),
                                             ("opportunistic", Sensitivity.internal)]}
    assert waits["standard"] >= 0 and math.isfinite(waits["opportunistic"])
    stay = engine.decide(request(sensitivity=Sensitivity.restricted, deadline=NOW + 48 * H), now=NOW, queues=q)
    normal = engine.decide(request(deadline=NOW + 48 * H), now=NOW, queues=q)
    assert stay.queue_wait_s == pytest.approx(1 * H) and normal.queue_wait_s == pytest.approx(4 * H)


def test_cpu_only_jobs_cost_no_gpu_hours(engine):
    d = engine.decide(request(gpus=0), now=NOW)
    assert d.site == "onprem-dc1" and d.cost_usd == 0.0


def test_replace_keeps_the_policy_key_fresh():
    a = request()
    b = dataclasses.replace(a, sensitivity=Sensitivity.restricted)
    assert a.policy_key != b.policy_key and b.policy_key[0] is Sensitivity.restricted


def test_cost_model_defaults_are_documented():
    cm = CostModel()
    assert cm.restart_s > 0 and cm.speed(CLOUD_EU) == 1.0 and cm.startup(ONPREM) == 0.0
    assert CapacityClass.opportunistic in capacity_options(CLOUD_US)


@pytest.mark.parametrize(("t", "shown"), [
    (0.0, "1970-01-01 00:00 UTC"), (math.inf, "never"), (1e300, "after 9999-12-31"),
    (-1e300, "before 0001-01-01"), (math.nan, "unknown")])
def test_clock_names_any_time_an_estimate_can_reach(t, shown):
    assert clock(t) == shown
