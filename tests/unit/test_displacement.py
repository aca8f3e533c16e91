"""Short runs displace rather than burst: the planning estimate never exceeds the time to the deadline,
OnPremFirst takes a short run on-prem as urgent when that is cheaper than bursting, the burst
controller makes room for it, and the simulator does so as soon as it is queued."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridtrain.placement.burst import RunningRun, WaitingRun, plan_bursts
from hybridtrain.placement.duration_estimator import plan_hours
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.queue_state import QueuedRun, QueueState, QueueTier
from hybridtrain.placement.strategy import STRATEGIES
from hybridtrain.simulation.comparison import default_scenario
from hybridtrain.simulation.simulator import Simulation, our_policy
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity
from tests.fixtures.placement_cases import NOW, SITES, H, busy, request

hours = st.floats(min_value=1e-4, max_value=500.0, allow_nan=False)


@given(hours, hours, st.one_of(st.none(), st.floats(min_value=-10.0, max_value=500.0, allow_nan=False)))
def test_plan_hours_is_the_tightest_of_estimate_limit_and_time_left(estimate, declared, left):
    h = plan_hours(estimate, declared, left)
    bounds = [estimate, declared] + ([left] if left is not None else [])
    assert h == max(min(bounds), 1.0 / 3600.0)
    if left is not None:  # more time left never plans a run shorter
        assert plan_hours(estimate, declared, left + 1.0) >= h


@pytest.fixture(scope="module")
def displacing(policy) -> Placement:
    opts = dict(policy.strategy_options)
    opts["onprem_first"] = {"displace_max_hours": 1.0}
    return Placement(SITES, policy.model_copy(update={"strategy_options": opts}))


def test_a_short_run_displaces_when_on_prem_now_is_cheaper_than_any_burst(engine, displacing):
    short = request(run_hours=0.5, max_run_hours=1.0, deadline=NOW + 1.0 * H)
    plain = engine.decide(short, now=NOW, queues=busy(5.0))
    assert plain.site != "onprem-dc1" and plain.meets_deadline  # without the option: burst
    d = displacing.decide(short, now=NOW, queues=busy(5.0))
    assert d.site == "onprem-dc1" and d.urgent and d.queue_tier is QueueTier.stay
    assert d.cost_usd < plain.cost_usd
    assert "cheaper than bursting" in d.reasons[-1] and "makes room" in d.reasons[-1]


@pytest.mark.parametrize("why, kw", [
    ("longer than the limit", {"run_hours": 2.0, "max_run_hours": 3.0, "deadline": NOW + 2.5 * H}),
    ("even starting now is late", {"run_hours": 0.5, "max_run_hours": 1.0, "deadline": NOW + 0.4 * H}),
    ("on-prem meets it by waiting", {"run_hours": 0.5, "max_run_hours": 1.0, "deadline": NOW + 9.0 * H}),
])
def test_no_displacement_outside_its_case(engine, displacing, why, kw):
    r = request(**kw)
    assert displacing.decide(r, now=NOW, queues=busy(5.0)).site == engine.decide(r, now=NOW, queues=busy(5.0)).site, why


def test_displacement_is_an_option_of_onprem_first():
    assert STRATEGIES.create("onprem_first").displace_max_hours == 0.0
    assert STRATEGIES.create("onprem_first", displace_max_hours=1).displace_max_hours == 1


def full_pool(hours_left: float) -> list[RunningRun]:
    return [RunningRun(f"r{i}", request(job=f"r{i}", run_hours=4.0, deadline=None), hours_left, hours_left + 1,
                       0.1 * i) for i in range(8)]


def test_the_controller_makes_room_for_a_run_whose_new_decision_is_urgent(engine, displacing):
    short = request(job="s", run_hours=0.5, max_run_hours=1.0, deadline=NOW + 1.0 * H)
    waiting = [WaitingRun("s", short, NOW)]
    moved = plan_bursts(engine, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=full_pool(5.0))
    assert [m.run_id for m in moved.moves] == ["s"] and not moved.evictions
    p = plan_bursts(displacing, "onprem-dc1", waiting, now=NOW, gpu_slots=8, running=full_pool(5.0))
    assert not p.moves
    (ev,) = p.evictions
    assert ev.for_run == "s" and ev.run_id == "r0" and ev.resume_here  # the one that loses least, queued again


def job(name, arrival, true_h, declared_h, deadline_h=None, job_class="standard", gb=50.0) -> SimJob:
    return SimJob(name, arrival, 1, true_h, declared_h, job_class, Sensitivity.internal,
                  None if deadline_h is None else arrival + deadline_h * H, int(gb * 1e9), int(2e9), 1800.0)


@pytest.mark.parametrize("urgent_pass", [True, False])
def test_the_simulated_pool_stops_a_run_for_a_short_one_at_once(urgent_pass):
    # One GPU, busy with a 10 h run; a 12-minute run due in 18 minutes arrives: no cloud can sync 50 GB in time.
    long_run = job("long", 0.0, 10.0, 12.0)
    short = job("short", H + 60.0, 0.2, 0.25, deadline_h=0.3, job_class="production")
    out = {o.job.id: o for o in Simulation(default_scenario(1), our_policy(urgent_pass=urgent_pass)).run([long_run, short])}
    s, la = out["short"], out["long"]
    assert s.site == la.site == "onprem-dc1"
    if urgent_pass:  # the controller runs when the urgent run is queued: it starts on arrival and makes it
        assert s.start == pytest.approx(short.arrival) and not s.missed and la.evictions == 1
        assert la.lost_gpu_hours == pytest.approx(60.0 / 3600.0)  # the minute since its checkpoint
        # the long run resumes from its 1 h checkpoint once the short one is done: 9 h to go
        assert la.finish == pytest.approx(s.finish + 9.0 * H)
    else:  # at the next tick, 10 minutes later, not even an immediate start makes it: it waits its turn
        assert la.evictions == 0 and s.start == pytest.approx(la.finish) and s.missed


CHILD = """
import dataclasses
from hybridtrain.simulation.comparison import default_scenario, replay, split
from hybridtrain.simulation.simulator import our_policy
from hybridtrain.simulation.traces import load_pods
from hybridtrain.simulation.workload import WorkloadParams, jobs_from_pods
_, report = split(jobs_from_pods(load_pods(), WorkloadParams(seed=2026)))
print(repr(dataclasses.replace(replay(default_scenario(7), our_policy(quantile=0.5, queue_quantile=None), report),
                               seconds=0.0)))
"""


def test_a_replay_does_not_depend_on_string_hashing():
    # Urgent runs promoted in one controller pass must go first in a fixed order, not a set's.
    import os
    import subprocess
    import sys

    from tests.fixtures.workspaces import ROOT

    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=True)
        outs.append(done.stdout)
    assert "evictions=0," not in outs[0]  # the slice exercises displacement
    assert outs[0] == outs[1]


def pool_of(tiers: list[QueueTier], hours_left: float, first_queue: int = 0) -> dict[str, QueueState]:
    """The 8-GPU pool full with one-GPU runs of ``tiers`` (``hours_left`` each), and ``first_queue``
    urgent half-hour runs already waiting in the first queue."""
    running = tuple(QueuedRun(1, hours_left, t) for t in tiers)
    backlog = tuple(QueuedRun(1, 0.5, QueueTier.stay) for _ in range(first_queue))
    return {"onprem-dc1": QueueState("onprem-dc1", 8, len(tiers), running=len(tiers), scheduled=first_queue,
                                     backlog=backlog, running_runs=running)}


@pytest.mark.parametrize("why, tiers, first_queue", [
    ("every running run is stay-at-home", [QueueTier.stay] * 8, 0),
    ("the first queue ahead already takes longer than the slack", [QueueTier.on_demand] * 8, 24),
])
def test_no_displacement_when_no_room_can_be_made_in_time(displacing, why, tiers, first_queue):
    # Regression (issue #21, loose seeds 2026/2028 at 1.10x): with the pool held by runs nothing may
    # stop, short urgent runs piled up in the first queue, each "on time if it started now", and missed.
    short = request(run_hours=0.5, max_run_hours=1.0, deadline=NOW + 1.0 * H)
    stoppable = displacing.decide(short, now=NOW, queues=pool_of([QueueTier.on_demand] * 8, 5.0))
    assert stoppable.site == "onprem-dc1" and stoppable.urgent  # room can be made: it displaces
    d = displacing.decide(short, now=NOW, queues=pool_of(tiers, 5.0, first_queue))
    assert d.site != "onprem-dc1" and d.meets_deadline and not d.urgent, why


def test_the_first_queue_wait_counts_only_what_nothing_may_stop():
    q = pool_of([QueueTier.stay] * 2 + [QueueTier.on_demand] * 6, 5.0, first_queue=3)["onprem-dc1"]
    # the 6 stoppable slots are free for it, but 3 urgent runs go first: it still starts at once
    assert q.first_queue_wait_s(1, 0.5, 1.0) == 0.0
    assert q.first_queue_wait_s(4, 0.5, 1.0) == pytest.approx(0.5 * H)  # 3 left beside them: until they end
    assert q.first_queue_wait_s(7, 0.5, 1.0) == pytest.approx(5.0 * H)  # more than 6: the stay-at-home runs' end
    assert QueueState("onprem-dc1", 8, 8, running=8).first_queue_wait_s(1) == 0.0  # counts only: unknown


def test_the_simulated_pool_bursts_a_short_run_when_nothing_it_may_stop_is_running():
    # One GPU, held for 10 h by a run whose data may not leave; a 12-minute run due in an hour arrives.
    held = dataclasses.replace(job("held", 0.0, 10.0, 12.0), sensitivity=Sensitivity.restricted)
    short = job("short", H, 0.2, 0.25, deadline_h=1.0, job_class="production", gb=1.0)
    out = {o.job.id: o for o in Simulation(default_scenario(1), our_policy()).run([held, short])}
    assert out["held"].evictions == 0 and out["short"].cloud and not out["short"].missed
