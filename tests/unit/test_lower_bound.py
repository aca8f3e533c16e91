"""LowerBound: the capacity-aware LP bound is never above any policy's cost in a run, and it binds when capacity does."""

from __future__ import annotations

import pytest

from hybridtrain.simulation.comparison import default_scenario, replay_outcomes, split
from hybridtrain.simulation.lower_bound import capacity_bound, job_prices, per_job_bounds
from hybridtrain.simulation.simulator import contenders
from hybridtrain.simulation.traces import load_pods
from hybridtrain.simulation.workload import SimJob, WorkloadParams, jobs_from_pods
from hybridtrain.specs.job import Sensitivity


@pytest.fixture(scope="module", params=["loose", "tight"])
def day(request) -> list[SimJob]:
    """One busy day of the report half (~200 jobs), in each deadline regime."""
    jobs = jobs_from_pods(load_pods(), WorkloadParams(deadline_regime=request.param))
    _, report = split(jobs)
    start = report[0].arrival + 86400
    return [j for j in report if start <= j.arrival < start + 86400]


def test_the_capacity_bound_is_never_above_any_policys_cost(day):
    scenario = default_scenario(4)  # a small pool: capacity binds
    prices = None
    seen = 0
    for c in contenders(threshold_limits=(0, 4, 64), spot_limits=(4,)):
        m, outcomes = replay_outcomes(scenario, c, day)
        placed = [o.job for o in outcomes if not o.unplaceable]
        prices = job_prices(scenario, placed)
        b = capacity_bound(scenario, placed, misses=m.misses, horizon=m.last_finish_s, prices=prices)
        assert b.status == "optimal", b.status
        assert b.usd <= m.total_usd * (1 + 1e-9), (c.name, b.usd, m.total_usd)
        assert b.usd >= b.per_job_usd - 1e-6
        seen += 1
    assert seen == 8


def test_the_bound_charges_what_the_pool_cannot_hold():
    scenario = default_scenario(1)
    # two 1-GPU, 4 h jobs that must finish in 4 h; one GPU: one of them must go to the cloud (or miss)
    jobs = [SimJob(f"j{i}", 0.0, 1, 4.0, 4.0, "production", Sensitivity.internal, 4 * 3600.0, 10**9, 10**9, 1800.0)
            for i in range(2)]
    per_job = sum(per_job_bounds(scenario, jobs))
    tight = capacity_bound(scenario, jobs, misses=0, horizon=4 * 3600.0, bucket_s=3600.0)
    assert tight.usd > per_job + 1.0  # one job pays the cloud's price
    p = job_prices(scenario, jobs)[0]
    assert tight.usd == pytest.approx(p.onprem_usd + p.cloud_usd, rel=1e-6)
    # allowed to miss one, it can run later on-prem: back to the per-job bound
    late = capacity_bound(scenario, jobs, misses=1, horizon=8 * 3600.0, bucket_s=3600.0)
    assert late.usd == pytest.approx(per_job, rel=1e-6)


def test_a_run_ending_within_the_miss_grace_is_on_time_for_the_bound_too():
    scenario = default_scenario(1)
    # one 1-GPU, 4 h job whose deadline is 0.9 s before it can end: the simulator counts no miss
    job = SimJob("j", 0.0, 1, 4.0, 4.0, "production", Sensitivity.internal, 4 * 3600.0 - 0.9, 10**9, 10**9, 1800.0)
    fifo = next(c for c in contenders() if c.name == "onprem_fifo")
    m, _ = replay_outcomes(scenario, fifo, [job])
    assert m.misses == 0
    b = capacity_bound(scenario, [job], misses=0, horizon=m.last_finish_s, bucket_s=3600.0)
    assert b.status == "optimal", b.status
    assert b.usd <= m.total_usd * (1 + 1e-9), (b.usd, m.total_usd)
