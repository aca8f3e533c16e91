"""What a deadline is worth (``OnPremFirst.miss_above_usd``): a run whose rescue costs more than that stays
on-prem late, in the pool's last queue; the burst controller demotes such runs instead of moving them; a
victim that is late anyway resumes here; the simulated pool serves the last queue last; an eviction waits
for a checkpoint when the run it makes room for can wait."""

from __future__ import annotations

import pytest

from hybridtrain.placement.burst import RunningRun, WaitingRun, plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.queue_state import QueueTier
from hybridtrain.simulation.comparison import default_scenario
from hybridtrain.simulation.simulator import Simulation, our_policy, with_miss_value
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity
from tests.fixtures.placement_cases import NOW, SITES, H, busy, request


def valued(policy, usd: float) -> Placement:
    opts = dict(policy.strategy_options)
    opts["onprem_first"] = {"miss_above_usd": usd}
    return Placement(SITES, policy.model_copy(update={"strategy_options": opts}))


def test_a_rescue_dearer_than_the_deadline_is_worth_is_not_bought(policy):
    # 8 GPU-hours due in 6 h with the pool busy for 5 h: on-prem finishes late; the cloud meets it for ~$30 more
    r = request(gpus=4, run_hours=2.0, max_run_hours=3.0, deadline=NOW + 6 * H)
    rescue = valued(policy, 1000.0).decide(r, now=NOW, queues=busy(5.0))
    assert rescue.site != "onprem-dc1" and rescue.meets_deadline and not rescue.late
    onprem = Placement(SITES, policy).decide(r, now=NOW, queues=busy(5.0), strategy="fastest")
    extra = rescue.cost_usd - valued(policy, 1.0).decide(r, now=NOW, queues=busy(5.0)).cost_usd
    assert extra > 5.0
    d = valued(policy, extra - 1.0).decide(r, now=NOW, queues=busy(5.0))
    assert d.site == "onprem-dc1" and d.late and not d.meets_deadline
    assert d.queue_tier is QueueTier.late and d.cost_usd < rescue.cost_usd
    assert "a deadline is worth" in d.reasons[-1] and "queued last" in d.reasons[-1]
    # worth more than the rescue costs: bought
    assert valued(policy, extra + 1.0).decide(r, now=NOW, queues=busy(5.0)).site == rescue.site
    assert onprem.site == rescue.site  # the cloud is also the fastest: on-prem is really late


def test_a_deadline_lost_everywhere_is_not_paid_for(policy):
    r = request(run_hours=3.0, max_run_hours=4.0, deadline=NOW + 2 * H)  # late wherever it runs
    plain = Placement(SITES, policy).decide(r, now=NOW, queues=busy(5.0))
    assert not plain.meets_deadline and plain.site != "onprem-dc1"  # least late: the cloud
    d = valued(policy, 50.0).decide(r, now=NOW, queues=busy(5.0))
    assert d.site == "onprem-dc1" and d.late and d.cost_usd < plain.cost_usd


def test_data_that_may_not_leave_is_never_demoted(policy):
    r = request(sensitivity=Sensitivity.restricted, deadline=NOW + 3 * H)
    d = valued(policy, 1.0).decide(r, now=NOW, queues=busy(5.0))
    assert d.site == "onprem-dc1" and not d.late and d.queue_tier is QueueTier.stay


def test_the_controller_demotes_a_run_not_worth_rescuing(policy):
    engine = valued(policy, 5.0)
    big = request(job="big", gpus=4, run_hours=2.0, max_run_hours=3.0, deadline=NOW + 3 * H)
    running = [RunningRun(f"r{i}", request(job=f"r{i}", run_hours=4.0, deadline=None), 5.0, 6.0, 0.2)
               for i in range(8)]
    p = plan_bursts(engine, "onprem-dc1", [WaitingRun("big", big, NOW)], now=NOW, gpu_slots=8, running=running)
    assert not p.moves and p.demoted == ("big",) and [h.run_id for h in p.held] == ["big"]
    # already in the last queue: held, not demoted again
    again = plan_bursts(engine, "onprem-dc1", [WaitingRun("big", big, NOW, tier=QueueTier.late)], now=NOW,
                        gpu_slots=8, running=running)
    assert not again.moves and not again.demoted
    # without a deadline value the same run moves
    moved = plan_bursts(Placement(SITES, policy), "onprem-dc1", [WaitingRun("big", big, NOW)], now=NOW, gpu_slots=8,
                        running=running)
    assert [m.run_id for m in moved.moves] == ["big"]


def test_a_victim_late_anyway_resumes_here_and_evictions_wait_for_a_checkpoint(policy):
    engine = Placement(SITES, policy)
    must = request(job="must", run_hours=0.5, max_run_hours=1.0, deadline=NOW + 2 * H,
                   sensitivity=Sensitivity.restricted)
    # 8 busy GPUs: one late-queue run 25 min past its checkpoint, one on-time run 2 min past its checkpoint
    running = [RunningRun(f"r{i}", request(job=f"r{i}", run_hours=4.0, deadline=NOW + 9 * H), 5.0, 6.0, 0.45)
               for i in range(6)]
    running.append(RunningRun("late", request(job="late", run_hours=4.0, deadline=NOW + 1 * H), 3.0, 4.0, 25 / 60,
                              tier=QueueTier.late))
    running.append(RunningRun("fresh", request(job="fresh", run_hours=4.0, deadline=NOW + 9 * H), 5.0, 6.0, 2 / 60))
    waiting = [WaitingRun("must", must, NOW, tier=QueueTier.stay)]
    now_ = plan_bursts(engine, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=running)
    (ev,) = now_.evictions  # no margin: the cheapest victim at once
    assert ev.run_id == "fresh" and ev.resume_here
    # with 10 minutes to the next pass and 1 h of slack, only a victim that checkpointed within them is stopped now
    running[-1] = RunningRun("fresh", running[-1].request, 5.0, 6.0, 20 / 60)
    later = plan_bursts(engine, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=running, margin_s=600)
    assert not later.evictions
    at_once = plan_bursts(engine, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=running)
    (ev,) = at_once.evictions
    assert ev.run_id == "fresh"  # 20 min lost beats 25 min lost
    running[-1] = RunningRun("fresh", running[-1].request, 5.0, 6.0, 40 / 60)
    (ev,) = plan_bursts(engine, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=running).evictions
    assert ev.run_id == "late" and ev.resume_here  # its deadline is lost anyway: it queues again here


def job(name, arrival, true_h, declared_h, deadline_h=None, gpus=1, job_class="standard",
        sensitivity=Sensitivity.internal) -> SimJob:
    return SimJob(name, arrival, gpus, true_h, declared_h, job_class, sensitivity,
                  None if deadline_h is None else arrival + deadline_h * H, int(50e9), int(2e9), 1800.0)


def test_the_simulated_pool_serves_the_last_queue_last():
    # One GPU busy for 4 h with a run that may not leave (never stopped for another). "lost" (3 h, due in 4 h) is
    # late on-prem; the cloud would make it (in 3 h 15 m with the sync) for more than $1 above on-prem → last
    # queue. "ok" (1 h, due in 8 h) arrives after it and starts first.
    jobs = [job("busy", 0.0, 4.0, 4.0, sensitivity=Sensitivity.restricted), job("lost", 60.0, 3.0, 3.0, deadline_h=4.0),
            job("ok", 120.0, 1.0, 1.0, deadline_h=8.0)]
    sim = Simulation(default_scenario(1), our_policy(quantile=1.0, queue_quantile=None, miss_above_usd=1.0))
    out = {o.job.id: o for o in sim.run(jobs)}
    assert out["lost"].site == out["ok"].site == "onprem-dc1"
    assert out["lost"].missed and not out["ok"].missed
    assert out["ok"].start == pytest.approx(4.0 * H) and out["lost"].start == pytest.approx(out["ok"].finish)
    plain = {o.job.id: o for o in Simulation(default_scenario(1), our_policy(quantile=1.0, queue_quantile=None))
             .run(jobs)}
    assert plain["lost"].cloud and not plain["lost"].missed  # without a deadline value it is rescued, at a price
    assert out["lost"].cost_usd < plain["lost"].cost_usd


def test_the_deadline_value_reaches_both_strategies_that_take_it(policy):
    p = with_miss_value(policy, 7.0)
    assert p.strategy_options["onprem_first"]["miss_above_usd"] == 7.0
    assert p.strategy_options["deadline_spot"]["miss_above_usd"] == 7.0
    assert with_miss_value(policy, None) is policy
    assert Placement(SITES, p).strategy("deadline_spot").miss_above_usd == 7.0
