"""Clairvoyant: the full-knowledge preemptive EDF schedule that ``×bound`` is read against."""

from __future__ import annotations

import pytest

from hybridtrain.simulation.clairvoyant import clairvoyant, preemptive_edf
from hybridtrain.simulation.comparison import default_scenario
from hybridtrain.simulation.lower_bound import capacity_bound, job_prices, per_job_bounds
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity


def job(name: str, arrival_h: float, hours: float, deadline_h: float | None, gpus: int = 1) -> SimJob:
    deadline = None if deadline_h is None else deadline_h * 3600.0
    return SimJob(name, arrival_h * 3600.0, gpus, hours, hours, "production", Sensitivity.internal, deadline,
                  10**9, 10**9, 1800.0)


def test_an_urgent_job_pauses_a_job_without_deadline():
    finish, pauses = preemptive_edf([job("long", 0, 4, None), job("urgent", 1, 1, 2)], capacity=1)
    assert finish["urgent"] == pytest.approx(2 * 3600.0)
    assert finish["long"] == pytest.approx(5 * 3600.0)
    assert pauses == 1


def test_it_sends_to_the_cloud_what_the_pool_cannot_finish_in_time_and_meets_the_bound_there():
    scenario = default_scenario(1)
    jobs = [job(f"j{i}", 0, 4, 4) for i in range(2)]  # one GPU, both due in 4 h
    c = clairvoyant(scenario, jobs, misses=0)
    p = job_prices(scenario, jobs)[0]
    assert (c.misses, c.cloud_jobs) == (0, 1)
    assert c.usd == pytest.approx(p.onprem_usd + p.cloud_usd)
    b = capacity_bound(scenario, jobs, misses=0, horizon=4 * 3600.0, bucket_s=3600.0)
    assert b.usd <= c.usd * (1 + 1e-9)
    # one miss allowed: both stay on-prem, one late — the per-job cost
    late = clairvoyant(scenario, jobs, misses=1)
    assert (late.misses, late.cloud_jobs) == (1, 0)
    assert late.usd == pytest.approx(sum(per_job_bounds(scenario, jobs)))
