"""Spot failover in the simulator: a spot run whose spot is gone moves to another allowed site's spot
instead of falling back to on-demand — only where the policy allows it and the move pays — and its
spend is attributed per site."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hybridtrain.placement.spot_rule import UniformProgress
from hybridtrain.simulation.comparison import default_scenario
from hybridtrain.simulation.conservation import ConservationError, check_conservation
from hybridtrain.simulation.simulator import CloudLeg, Contender, Simulation
from hybridtrain.simulation.traces import SpotTrace
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity
from hybridtrain.specs.sites import CapacityClass

H = 3600.0
GONE_AFTER_90_MIN = np.array([True] * 9 + [False] * 60 + [True] * 3)  # 10-min ticks, a 12-h cycle
ALWAYS = np.array([True] * 72)


def scenario(us: np.ndarray, eu: np.ndarray):
    sc = default_scenario(8)
    return dataclasses.replace(sc, spot_traces={"cloud-us": SpotTrace("us", us, 600), "cloud-eu": SpotTrace("eu", eu, 600)})


def spot_job(*, sensitivity=Sensitivity.internal, hours=4.0, deadline_h=8.0, checkpoint_gb=1.0) -> SimJob:
    return SimJob("s", 0.0, 1, hours, hours, "opportunistic", sensitivity, deadline_h * H, 10**9,
                  int(checkpoint_gb * 10**9), 1800.0)


def run(sc, job: SimJob, site: str, *, failover: bool = True):
    sim = Simulation(sc, Contender("t", spot_rule=UniformProgress(), spot_failover=failover))
    sim.run_cloud(0.0, job, sim.request(job), site, CapacityClass.opportunistic)
    out = sim.outcomes[job.id]
    check_conservation(sc, [out])
    return out


def test_a_run_whose_spot_is_gone_moves_to_another_sites_spot_instead_of_on_demand():
    sc = scenario(GONE_AFTER_90_MIN, ALWAYS)
    job = spot_job()
    stay = run(sc, job, "cloud-us", failover=False)
    assert stay.legs == () and stay.od_gpu_hours > 1.0  # the old behaviour: on-demand at cloud-us

    out = run(sc, job, "cloud-us")
    assert [leg.site for leg in out.legs] == ["cloud-us", "cloud-eu"] and out.failovers == 1
    assert out.site == "cloud-eu" and out.cloud
    assert out.od_gpu_hours == pytest.approx(0.0)  # the rest ran on cloud-eu's spot
    assert out.legs[0].spot_gpu_hours > 0 and out.legs[1].spot_gpu_hours > 0
    assert out.finish <= job.deadline
    us, eu = sc.site("cloud-us"), sc.site("cloud-eu")
    assert out.compute_usd == pytest.approx(out.legs[0].spot_gpu_hours * us.spot_price_per_gpu_hour
                                            + out.legs[1].spot_gpu_hours * eu.spot_price_per_gpu_hour)
    # the move pays the checkpoint out of cloud-us (the dataset comes from on-prem, free here)
    assert out.egress_usd == pytest.approx(stay.egress_usd + 1.0 * us.egress_per_gb)
    assert out.cost_usd < stay.cost_usd


def test_failover_keeps_to_the_policy():
    # confidential data may only run in the EU: when cloud-eu's spot goes, cloud-us's is no way out
    sc = scenario(ALWAYS, GONE_AFTER_90_MIN)
    out = run(sc, spot_job(sensitivity=Sensitivity.confidential), "cloud-eu")
    assert out.legs == () and out.site == "cloud-eu" and out.od_gpu_hours > 0


def test_no_failover_when_moving_costs_more_than_it_saves():
    # a 100 GB checkpoint costs $9 to move out of cloud-us; 2.5 h left saves ~$5 of on-demand
    sc = scenario(GONE_AFTER_90_MIN, ALWAYS)
    out = run(sc, spot_job(checkpoint_gb=100.0), "cloud-us")
    assert out.legs == () and out.od_gpu_hours > 0


def test_no_failover_when_the_deadline_is_too_close_to_start_over_there():
    # 4 h of work due in 4 h 20 m: once spot is gone, starting over at cloud-eu (its start-up, the
    # sync) would leave the rule there on-demand too, so the run stays on cloud-us's on-demand
    sc = scenario(GONE_AFTER_90_MIN, ALWAYS)
    job = spot_job(deadline_h=4.0 + 20 / 60)
    out = run(sc, job, "cloud-us")
    assert out.legs == () and out.od_gpu_hours > 0
    assert out == run(sc, job, "cloud-us", failover=False)


def test_conservation_checks_each_leg_at_its_own_site():
    sc = scenario(GONE_AFTER_90_MIN, ALWAYS)
    out = run(sc, spot_job(), "cloud-us")
    wrong = dataclasses.replace(out, legs=(*out.legs[:-1], CloudLeg("cloud-eu", 0.0, 0.0, 0.0)))
    with pytest.raises(ConservationError, match="legs do not add up"):
        check_conservation(sc, [wrong])
    # priced at the last site only, the same GPU-hours would not match the spend
    flat = dataclasses.replace(out, legs=())
    with pytest.raises(ConservationError, match="cloud compute"):
        check_conservation(sc, [flat])
