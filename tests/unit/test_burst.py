"""Burst controller logic: late runs move, runs whose data may not leave never do, room is made, capacity released."""

from __future__ import annotations

import pytest

from hybridtrain.placement.burst import RunningRun, WaitingRun, plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.request import ResourceRequest
from hybridtrain.specs.job import Sensitivity
from tests.fixtures.placement_cases import CLOUD_EU, CLOUD_US, NOW, ONPREM
from tests.fixtures.workspaces import ROOT

H = 3600.0


@pytest.fixture(scope="module")
def engine() -> Placement:
    return Placement([ONPREM, CLOUD_EU, CLOUD_US], Policy.load(ROOT / "deployments" / "policy.yaml"))


def req(job, hours=1.0, due_h=24.0, gpus=1, **kw) -> ResourceRequest:
    base = dict(job=job, gpus=gpus, run_hours=hours, max_run_hours=hours * 1.5, submitted_at=NOW,
                data_site="onprem-dc1", dataset_bytes=10**9, sensitivity=Sensitivity.internal, job_class="standard",
                deadline=None if due_h is None else NOW + due_h * H)
    base.update(kw)
    return ResourceRequest(**base)


def full_pool(hours_left=2.0, **kw) -> list[RunningRun]:
    """8 GPUs, all busy for ``hours_left`` more hours."""
    return [RunningRun(f"r{i}", req(f"r{i}", hours=4.0, **kw), hours_left, hours_left + 1, 0.2) for i in range(8)]


def plan(engine, waiting, running, **kw):
    return plan_bursts(engine, "onprem-dc1", [WaitingRun(r.job, r, NOW) for r in waiting], now=NOW, gpu_slots=8,
                       running=running, **kw)


def test_a_run_that_would_be_late_moves_and_one_that_meets_stays(engine):
    a = req("a", hours=3.0, due_h=4.0)  # would start at 2 h, finish at 5 h: 1 h late
    c = req("c", hours=1.0, due_h=24.0)
    p = plan(engine, [a, c], full_pool())
    assert [(m.run_id, m.to_site) for m in p.moves] == [("a", "cloud-us")]
    assert "after the deadline" in p.moves[0].reason
    assert not p.evictions and not p.release


def test_data_that_may_not_leave_is_never_moved(engine):
    b = req("b", hours=1.0, due_h=1.0, sensitivity=Sensitivity.restricted)  # starting now is just enough
    running = full_pool(hours_left=5.0, sensitivity=Sensitivity.restricted)  # nothing running may leave either
    p = plan(engine, [b], running)
    assert not p.moves and not p.evictions
    (held,) = p.held
    assert held.run_id == "b" and "rules[0] (restricted data never leaves on-prem)" in held.reason


def test_room_is_made_by_stopping_the_cheapest_run_that_may_leave(engine):
    b = req("b", hours=0.5, due_h=1.0, sensitivity=Sensitivity.restricted)
    running = full_pool(hours_left=5.0)
    running[3] = RunningRun("cheap", req("cheap", hours=4.0), 5.0, 6.0, 0.0)  # just checkpointed: loses nothing
    p = plan(engine, [b], running)
    (ev,) = p.evictions
    assert ev.run_id == "cheap" and ev.for_run == "b" and ev.resume_here  # its own deadline allows waiting
    assert not p.moves


def test_a_victim_that_cannot_wait_resumes_elsewhere(engine):
    b = req("b", hours=0.5, due_h=1.0, sensitivity=Sensitivity.restricted)
    running = full_pool(hours_left=5.0, due_h=5.5)  # they would miss their own deadline if they waited
    (ev,) = plan(engine, [b], running).evictions
    assert not ev.resume_here and ev.to_site == "cloud-us" and ev.decision.site == "cloud-us"


def test_stopping_nobody_when_it_would_not_help(engine):
    b = req("b", hours=2.0, due_h=1.0, sensitivity=Sensitivity.restricted)  # late even if started now
    p = plan(engine, [b], full_pool(hours_left=5.0))
    assert not p.evictions and [h.run_id for h in p.held] == ["b"]
    assert not plan(engine, [req("x", hours=0.5, due_h=1.0, sensitivity=Sensitivity.restricted)],
                    full_pool(hours_left=5.0), evict=False).evictions


def test_one_move_can_save_the_runs_behind_it(engine):
    big = req("big", hours=6.0, due_h=7.0, gpus=8)  # would start at 2 h and finish at 8 h: late
    small = req("small", hours=1.0, due_h=4.0)  # behind it (EASY would hold it for the big run)
    p = plan(engine, [big, small], full_pool())
    assert [m.run_id for m in p.moves] == ["big"]


def test_no_deadline_uses_the_wait_slo(engine):
    slow = req("slow", hours=1.0, due_h=None)
    assert not plan(engine, [slow], full_pool(hours_left=3.0)).moves  # starts in 3 h < 4 h SLO
    assert [m.run_id for m in plan(engine, [slow], full_pool(hours_left=5.0)).moves] == ["slow"]


def test_the_margin_acts_before_it_is_too_late(engine):
    a = req("a", hours=1.0, due_h=3.1)  # starts at 2 h, ends at 3 h: fine now, late if it slips 10 minutes
    assert not plan(engine, [a], full_pool()).moves
    assert [m.run_id for m in plan(engine, [a], full_pool(), margin_s=600).moves] == ["a"]


def test_an_urgent_run_is_held_and_room_is_made(engine):
    from hybridtrain.placement.queue_state import QueueTier

    u = req("u", hours=0.5, due_h=1.0)
    p = plan_bursts(engine, "onprem-dc1", [WaitingRun("u", u, NOW, tier=QueueTier.stay)], now=NOW, gpu_slots=8,
                    running=full_pool(hours_left=5.0))
    assert not p.moves and [e.for_run for e in p.evictions] == ["u"]
    assert "urgent" in p.held[0].reason


def test_release_when_the_queue_has_drained(engine):
    p = plan(engine, [], full_pool()[:2])
    assert p.release and "6 of 8 GPUs free" in p.release_reason
    assert not plan(engine, [], full_pool()).release


def test_the_replay_serves_the_run_due_first_within_a_work_queue(engine):
    """A wide run due in two days arrived first; a short one due in 3.5 h behind it. Served in arrival
    order the short one would start only after the wide one (at 4 h) and miss; served due-first it
    starts at 2 h and the wide one after it, both on time: nothing moves."""
    wide = req("wide", hours=2.0, due_h=48.0, gpus=8)
    short = req("short", hours=1.0, due_h=3.5)
    p = plan(engine, [wide, short], full_pool())
    assert not p.moves and not p.evictions and not p.demoted
    # a due time given with the run (its placement's tag) is its place in line: the wide run tagged as
    # due first goes first again, and the short one is late and moves
    tagged = plan_bursts(engine, "onprem-dc1", [WaitingRun("wide", wide, NOW, due=NOW), WaitingRun("short", short, NOW)],
                         now=NOW, gpu_slots=8, running=full_pool())
    assert [m.run_id for m in tagged.moves] == ["short"]
