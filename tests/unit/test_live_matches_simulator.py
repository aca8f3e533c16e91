"""The live flows and the simulator take the same placement decision for the same state.

The simulator replays a small pool; at the moment a job arrives, the queue state it hands the engine is
captured. The live path — ``stages.place`` on a workspace with the same sites and policy, the request
built from a job spec by ``request_from_spec`` — decides from that state: the same planned hours (at
most the time to the deadline, ``plan_hours``), site, capacity, urgency, work queue, and the same answer
to "run a controller pass at once" (``burst.pass_now``). Then the burst controller's live inputs
(``orchestration.queues.burst_inputs`` over train runs carrying the placement's tags) and the
simulator's own give the same plan.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from hybridtrain import stages
from hybridtrain.placement.burst import WaitingRun, pass_now, plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.queue_state import QueueTier, due_at
from hybridtrain.placement.request import request_from_spec
from hybridtrain.simulation.comparison import SIM_POLICY, default_scenario
from hybridtrain.simulation.simulator import REFERENCE_EPOCH, Simulation, our_policy
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity, load_spec, parse_spec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.workspace import Workspace
from orchestration.queues import PoolRun, burst_inputs, decision_tags
from tests.fixtures.workspaces import ROOT

H = 3600.0
GB = 10**9


def spec_like(job: SimJob):
    """A job spec asking for what ``job`` asks for (one GPU, its limit, deadline, class, sensitivity)."""
    data = load_spec(ROOT / "jobs" / "churn.yaml").to_dict()
    data["metadata"]["name"] = job.id
    data["resources"]["max_hours"] = job.declared_hours
    data["deadline"] = f"{round((job.deadline - job.arrival) / 60)}m"
    data["placement"] = {"job_class": job.job_class}
    data["data_policy"]["sensitivity"] = job.sensitivity.value
    data["data_policy"]["residency"] = []  # the simulated jobs declare none
    data["sync"]["sample_fraction"] = 1.0
    data.pop("budget_usd", None)
    return parse_spec(data)


def job(name, arrival_h, true_h, declared_h, deadline_h=None, job_class="production") -> SimJob:
    return SimJob(name, arrival_h * H, 1, true_h, declared_h, job_class, Sensitivity.internal,
                  None if deadline_h is None else (arrival_h + deadline_h) * H, 20 * GB, 0, 1800.0)


@pytest.fixture(scope="module")
def scenario():
    return default_scenario(2)


@pytest.fixture(scope="module")
def ws(scenario, tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("live")
    catalog = SitesCatalog(apiVersion="hybridtrain/v1", sites=scenario.sites)
    (root / "sites.yaml").write_text(yaml.safe_dump(catalog.model_dump(mode="json", exclude_none=True)))
    return Workspace.resolve(root, sites_file=root / "sites.yaml", policy_file=SIM_POLICY,
                             tracking_uri=f"sqlite:///{root}/mlflow.db")


# Two 1-GPU runs hold the pool for hours; then a run that is due soon arrives.
CASES = {
    # 12 minutes of work due in 20 minutes: no cloud can sync 20 GB and finish in time; on-prem now can
    "urgent": job("probe", 1.0, 0.2, 0.25, deadline_h=20 / 60),
    # 3 h declared, due in 1 h: planned with the hour it has (plan_hours), not its limit
    "capped": job("probe", 1.0, 0.8, 3.0, deadline_h=1.0),
    # 3 h of work (too long to displace a run) due in 6 h behind 7 h of queue: bursts
    "burst": job("probe", 1.0, 3.0, 3.0, deadline_h=6.0),
}


def simulated(scenario, probe: SimJob):
    """The simulator's request, queue state and decision at the probe's arrival (and the simulation)."""
    sim = Simulation(scenario, our_policy(quantile=1.0, queue_quantile=None))
    seen = {}
    decide = sim.engine.decide

    def spy(request, **kw):
        d = decide(request, **kw)
        if request.job == probe.id and "request" not in seen:
            seen.update(request=request, queues=kw["queues"], now=kw["now"], decision=d)
        return d

    sim.engine.decide = spy
    sim.run([job("a", 0.0, 6.0, 8.0), job("b", 0.0, 6.0, 8.0), probe])
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_live_placement_takes_the_simulators_decision(scenario, ws, case):
    probe = CASES[case]
    sim = simulated(scenario, probe)
    now = datetime.fromtimestamp(sim["now"], UTC)
    live = stages.place(ws, spec_like(probe), probe.dataset_bytes, sim["queues"], now)
    req, d = sim["request"], sim["decision"]
    assert live.run_hours == pytest.approx(req.run_hours)
    assert (live.site, live.capacity_class, live.urgent, live.late, live.queue_tier) == (
        d.site, d.capacity_class.value, d.urgent, d.late, d.queue_tier.name)
    assert live.controller_pass == pass_now(d)
    assert live.cost_usd == pytest.approx(d.cost_usd)
    # its place in the pool's work queue: the due time the simulated pool queues it by
    slo_s = Policy.load(ws.policy_file).wait_slo_hours * H
    assert live.due_at.timestamp() == pytest.approx(due_at(req.deadline, req.submitted_at, slo_s))
    if case == "urgent":
        assert live.controller_pass and live.queue_tier == "stay"
    if case == "capped":
        assert req.run_hours == pytest.approx(1.0) and probe.declared_hours == 3.0
    if case == "burst":
        assert live.site != "onprem-dc1" and not live.controller_pass


def test_the_live_request_plans_with_at_most_the_time_to_the_deadline():
    probe = CASES["capped"]
    spec = spec_like(probe)
    now = datetime.fromtimestamp(REFERENCE_EPOCH, UTC)
    assert request_from_spec(spec, dataset_bytes=GB, now=now).run_hours == pytest.approx(1.0)
    assert request_from_spec(spec, dataset_bytes=GB, now=now, run_hours=0.5).run_hours == pytest.approx(0.5)
    no_deadline = parse_spec({**spec.to_dict(), "deadline": None})
    assert request_from_spec(no_deadline, dataset_bytes=GB, now=now).run_hours == pytest.approx(3.0)


def test_the_live_controller_sees_the_runs_as_the_simulator_does(scenario, ws):
    """Train runs tagged with their placement give the controller the simulator's requests and queues."""
    probe = CASES["capped"]
    sim = simulated(scenario, probe)
    now_s = sim["now"]
    now = datetime.fromtimestamp(now_s, UTC)
    spec = spec_like(probe)
    d = sim["decision"]
    due = due_at(d.request.deadline, d.request.submitted_at, Policy.load(ws.policy_file).wait_slo_hours * H)
    # the probe waiting in the pool as the lifecycle queued it, and one untagged run queued before tags existed
    runs = [PoolRun(run_id="probe", state="SCHEDULED", state_name="Scheduled", spec=spec,
                    parameters={"approved": {"size": probe.dataset_bytes}}, expected_start=now, started=None,
                    deployment_id=None, created=now,
                    tags=tuple(decision_tags(d.request.run_hours, d.queue_tier.name, datetime.fromtimestamp(due, UTC))))]
    waiting, running = burst_inputs(runs, now)
    (w,) = waiting
    assert not running
    assert w.request.run_hours == pytest.approx(sim["request"].run_hours) and w.tier is d.queue_tier
    assert w.due == pytest.approx(due)
    engine_live = Placement(ws.load_sites(), Policy.load(ws.policy_file))
    sim_engine = Simulation(scenario, our_policy()).engine
    kw = {"now": now_s, "gpu_slots": 2, "running": [], "margin_s": 600.0}
    live_plan = plan_bursts(engine_live, "onprem-dc1", waiting, **kw)
    sim_plan = plan_bursts(sim_engine, "onprem-dc1",
                           [WaitingRun("probe", sim["request"], now_s, tier=d.queue_tier)], **kw)
    assert [(m.run_id, m.to_site) for m in live_plan.moves] == [(m.run_id, m.to_site) for m in sim_plan.moves]
    assert [h.run_id for h in live_plan.held] == [h.run_id for h in sim_plan.held]
    assert live_plan.release == sim_plan.release
    untagged = PoolRun(run_id="old", state="SCHEDULED", state_name="Scheduled", spec=spec, parameters={},
                       expected_start=now, started=None, deployment_id=None, created=now)
    assert untagged.tier is QueueTier.on_demand and untagged.run_hours is None and untagged.due is None
