"""The sweep workload in the simulator: its trials as jobs, replayed through the production engine beside other jobs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybridtrain.placement.strategy import ThresholdBurst
from hybridtrain.simulation.comparison import default_scenario, split
from hybridtrain.simulation.simulator import Contender, our_policy
from hybridtrain.simulation.sweep_workload import (
    SWEEP_FAMILY,
    SWEEP_PREFIX,
    SweepWorkload,
    compare,
    compare_at_equal_completion,
)
from hybridtrain.simulation.traces import load_pods
from hybridtrain.simulation.workload import WorkloadParams, demand_gpus, jobs_from_pods


def test_trials_arrive_in_waves_with_one_deadline_and_pruned_ones_are_shorter():
    w = SweepWorkload(n_trials=10, parallelism=4, trial_hours=2.0, pruned_share=0.5, pruned_fraction=0.25)
    jobs = w.jobs(arrival=1000.0)
    assert [j.arrival for j in jobs] == [1000.0] * 4 + [1000.0 + 7200] * 4 + [1000.0 + 14400] * 2
    assert {j.deadline for j in jobs} == {1000.0 + 1.5 * 3 * 2 * 3600}
    assert {j.true_hours for j in jobs} == {0.5, 2.0} and all(j.declared_hours == 2.0 for j in jobs)
    assert all(j.job_class == "opportunistic" and j.id.startswith(SWEEP_PREFIX) for j in jobs)
    assert {j.family for j in jobs} == {SWEEP_FAMILY}  # one job: the engine learns the trials' durations together
    assert w.jobs(1000.0) == jobs  # seeded


def test_a_sweep_on_a_full_cluster_costs_less_on_spot_than_on_demand_and_finishes_in_time():
    scenario = default_scenario(capacity=2)
    t0 = 3 * 86400.0
    # Two long standard jobs hold both on-prem GPUs, so the sweep has to burst.
    busy = [replace(j, id=f"busy-{i}", job_class="standard", deadline=None) for i, j in enumerate(
        SweepWorkload(n_trials=2, parallelism=2, trial_hours=24, pruned_share=0.0).jobs(t0))]
    ours, od = compare(scenario, busy, SweepWorkload(n_trials=8, parallelism=4, trial_hours=1.0), t0 + 60,
                       [our_policy(), Contender("all_on_demand", ThresholdBurst(queue_limit=-1))])
    assert od.on_demand_gpu_hours > 0 and od.spot_gpu_hours == 0
    assert ours.spot_gpu_hours > 0 and ours.cost_usd < od.cost_usd
    assert ours.missed == 0 and od.missed == 0


def test_at_equal_completion_ours_gets_all_on_demands_completion_time_as_its_deadline():
    scenario = default_scenario(capacity=2)
    t0 = 3 * 86400.0
    busy = [replace(j, id=f"busy-{i}", job_class="standard", deadline=None) for i, j in enumerate(
        SweepWorkload(n_trials=2, parallelism=2, trial_hours=24, pruned_share=0.0).jobs(t0))]
    workload = SweepWorkload(n_trials=8, parallelism=4, trial_hours=1.0)
    c = compare_at_equal_completion(scenario, busy, workload, t0 + 60, our_policy(),
                                    Contender("all_on_demand", ThresholdBurst(queue_limit=-1)))
    # The slack replay is the plain comparison.
    slack, _ = compare(scenario, busy, workload, t0 + 60, [our_policy(), Contender("all_on_demand",
                                                                                     ThresholdBurst(queue_limit=-1))])
    assert c.ours_slack == slack
    assert c.on_demand.completion_h < 1.5 * workload.waves * workload.trial_hours
    tight = replace(workload, deadline_hours=c.on_demand.completion_h).jobs(t0 + 60)
    assert {j.deadline for j in tight} == {t0 + 60 + c.on_demand.completion_h * 3600}
    # Bound by all-on-demand's completion time, ours still ends by it and still costs less.
    assert c.meets and c.ours_equal.missed == 0
    assert c.ratio_equal < 1
    # All-on-demand's jobs never share a GPU: what the sweep adds to the cluster is what its trials cost.
    assert c.on_demand.cluster_usd - c.on_demand_alone_usd == pytest.approx(c.on_demand.cost_usd)


def test_the_marginal_cost_counts_what_other_jobs_pay_when_the_trials_hold_the_onprem_gpus():
    """Two 3-h trials take both on-prem GPUs; ten minutes later two standard jobs arrive that must end
    3.3 h later. Without the sweep they run on-prem; with it they must go to on-demand. The trials'
    own bill (on-prem) is about a quarter of all-on-demand's; what they cost the cluster is as much."""
    scenario = default_scenario(capacity=2)
    t0 = 3 * 86400.0
    workload = SweepWorkload(n_trials=2, parallelism=2, trial_hours=3.0, pruned_share=0.0)
    trace = [replace(j, id=f"trace-{i}", job_class="standard", arrival=t0 + 600, deadline=t0 + 600 + 3.3 * 3600)
             for i, j in enumerate(workload.jobs(t0))]
    c = compare_at_equal_completion(scenario, trace, workload, t0, our_policy(),
                                    Contender("all_on_demand", ThresholdBurst(queue_limit=-1)))
    assert c.ours_equal.onprem_gpu_hours == 6.0 and c.ratio_equal < 0.5
    assert c.ours_equal.cluster_usd - c.ours_equal.cost_usd > c.ours_alone_usd  # the trace paid the cloud
    assert c.ratio_marginal == pytest.approx(1.0)


def test_at_every_decile_of_the_trace_ours_ends_by_all_on_demands_completion_time():
    """The shared trace at ~1.1x load, the sweep arriving at each decile of the report half.

    The trace's opportunistic jobs use about half their declared limit; the sweep's full trials
    use all of it. Estimated from their class, last-wave trials queued on-prem looked an hour
    shorter than they were: the controller moved them to the cloud too late, and at the 7th and
    9th deciles the sweep ended 47 and 10 minutes after all-on-demand's. Estimated from the
    trials that already finished (the sweep's own history), every trial ends in time."""
    _, report = split(jobs_from_pods(load_pods(), WorkloadParams()))
    scenario = default_scenario(max(1, round(demand_gpus(report) / 1.1)))
    late = []
    for decile in range(1, 10):
        arrival = report[len(report) * decile // 10].arrival
        window = [j for j in report if abs(j.arrival - arrival) <= 2 * 86400]
        c = compare_at_equal_completion(scenario, window, SweepWorkload(), arrival, our_policy(),
                                        Contender("all_on_demand", ThresholdBurst(queue_limit=-1)))
        assert c.ratio_equal < 1
        if not c.meets:
            late.append((decile, round((c.ours_equal.completion_h - c.on_demand.completion_h) * 60)))
    assert late == []
