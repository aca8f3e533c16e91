"""Simulator accounting: a restarted run is finished by its own start, an evicted run keeps its progress
wherever it resumes, cloud spend excludes on-prem work, and every run conserves work and money."""

from __future__ import annotations

import dataclasses

import pytest

from hybridtrain.placement.queue_state import QueueTier
from hybridtrain.simulation.comparison import (
    CLOUD_AFTER_ONPREM,
    CLOUD_AT_ARRIVAL,
    ONPREM,
    default_scenario,
    metrics,
    spend_by_class,
)
from hybridtrain.simulation.conservation import ConservationError, check_conservation
from hybridtrain.simulation.simulator import Contender, Outcome, Simulation, contenders
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity

H = 3600.0


def job(jid: str, hours: float, *, deadline_h: float | None = None, sensitivity=Sensitivity.internal,
        job_class: str = "standard", arrival: float = 0.0) -> SimJob:
    return SimJob(jid, arrival, 1, hours, hours, job_class, sensitivity,
                  None if deadline_h is None else deadline_h * H, 10**9, 10**9, 1800.0)


def test_an_evicted_run_restarted_here_is_finished_by_its_own_start_not_the_first():
    scenario = default_scenario(1)
    sim = Simulation(scenario, Contender("t"))
    a = job("a", 3.0)
    sim.enqueue(0.0, a, sim.request(a), QueueTier.on_demand)  # starts at 0: "done" due at 3 h
    sim.evict(1.25 * H, "a", None)  # checkpoint at 1.0 h: 0.25 h lost, queued again
    sim.start_ready(1.5 * H)  # restarts with 2 h left: done at 3.5 h
    sim.run([])  # drain the events (the stale 3 h one included)
    out = sim.outcomes["a"]
    assert out.finish == pytest.approx(3.5 * H)
    assert out.onprem_gpu_hours == pytest.approx(1.25 + 2.0)
    assert out.lost_gpu_hours == pytest.approx(0.25) and out.evictions == 1
    check_conservation(scenario, [out])


def test_an_evicted_run_moved_to_the_cloud_from_its_queue_keeps_its_checkpointed_work():
    scenario = default_scenario(1)
    sim = Simulation(scenario, Contender("t", controller=True))
    a = job("a", 4.0, deadline_h=10.0)
    sim.enqueue(0.0, a, sim.request(a), QueueTier.on_demand)
    sim.evict(2.0 * H, "a", None)  # 2 h checkpointed, back in the queue
    blocker = job("r", 20.0, sensitivity=Sensitivity.restricted, arrival=2.0 * H)
    sim.enqueue(2.0 * H, blocker, sim.request(blocker), QueueTier.stay)  # takes the only GPU for 20 h
    sim.run([])  # the controller's tick finds "a" late behind it and moves it to the cloud
    out = sim.outcomes["a"]
    assert out.cloud and out.moved
    assert out.od_gpu_hours + out.spot_gpu_hours == pytest.approx(2.0)  # the 2 h left, not all 4 h
    assert out.onprem_gpu_hours == pytest.approx(2.0) and out.lost_gpu_hours == pytest.approx(0.0)
    site = scenario.site(out.site)
    assert out.cloud_usd == pytest.approx(out.od_gpu_hours * site.gpu_hour_price + out.egress_usd)
    assert out.onprem_usd == pytest.approx(2.0 * scenario.site("onprem-dc1").gpu_hour_price)
    m = metrics("t", [out, sim.outcomes["r"]], 1)
    assert m.cloud_usd == pytest.approx(out.cloud_usd)  # the on-prem part is not cloud spend
    assert m.total_usd == pytest.approx(out.cost_usd + sim.outcomes["r"].cost_usd)
    check_conservation(scenario, [out, sim.outcomes["r"]])
    spend = {(x["job_class"], x["where"]): x for x in spend_by_class([out, sim.outcomes["r"]])}
    assert set(spend) == {("standard", ONPREM), ("standard", CLOUD_AFTER_ONPREM)}
    assert spend["standard", ONPREM]["jobs"] == 2  # a's first 2 h and the blocker
    assert spend["standard", ONPREM]["usd"] == pytest.approx(out.onprem_usd + sim.outcomes["r"].cost_usd, abs=1e-3)
    moved = spend["standard", CLOUD_AFTER_ONPREM]
    assert moved["jobs"] == 1 and moved["usd"] == pytest.approx(out.cloud_usd, abs=1e-3)
    assert moved["od_gpu_hours"] + moved["spot_gpu_hours"] == pytest.approx(2.0)
    assert sum(x["usd"] for x in spend.values()) == pytest.approx(m.total_usd, abs=1e-2)


def test_a_job_sent_to_the_cloud_when_it_arrives_is_spent_there():
    scenario = default_scenario(1)
    cloud = next(c for c in contenders(threshold_limits=(0,)) if c.name == "cloud_on_demand")
    outs = Simulation(scenario, cloud).run([job("a", 2.0, job_class="production"), job("b", 1.0, arrival=H)])
    spend = spend_by_class(outs)
    assert [(x["job_class"], x["where"], x["jobs"]) for x in spend] == [("production", CLOUD_AT_ARRIVAL, 1),
                                                                      ("standard", CLOUD_AT_ARRIVAL, 1)]
    assert sum(x["usd"] for x in spend) == pytest.approx(metrics("c", outs, 1).total_usd, abs=1e-2)
    assert sum(x["onprem_gpu_hours"] for x in spend) == 0


def test_conservation_names_the_job_whose_work_or_spend_does_not_add_up():
    scenario = default_scenario(2)
    j = job("x", 2.0)
    price = scenario.site("onprem-dc1").gpu_hour_price
    good = Outcome(j, site="onprem-dc1", start=0.0, finish=2 * H, onprem_gpu_hours=2.0, compute_usd=2 * price,
                   onprem_usd=2 * price)
    check_conservation(scenario, [good])
    short = dataclasses.replace(good, onprem_gpu_hours=1.5, compute_usd=1.5 * price, onprem_usd=1.5 * price)
    with pytest.raises(ConservationError, match="job x: executed 1.5"):
        check_conservation(scenario, [short])
    twice = dataclasses.replace(good, compute_usd=4 * price)
    with pytest.raises(ConservationError, match="job x: cloud compute"):
        check_conservation(scenario, [twice])
    with pytest.raises(ConservationError, match="more than one outcome"):
        check_conservation(scenario, [good, good])


@pytest.mark.parametrize("load", [0.0, -1.0, float("nan"), float("inf")])
def test_a_load_no_pool_can_have_is_refused_not_silently_replaced(load):
    from hybridtrain.errors import SpecError
    from hybridtrain.simulation.comparison import run_comparison

    with pytest.raises(SpecError, match="--load"):
        run_comparison(load=load)
