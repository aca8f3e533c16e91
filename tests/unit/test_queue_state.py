"""Queue state: how the pool hands out GPU slots, and the wait a new run can expect from it."""

from __future__ import annotations

import math

import pytest

from hybridtrain.placement.queue_state import (
    QueuedRun,
    QueueState,
    QueueTier,
    Slot,
    admit,
    due_at,
    in_queue_order,
    remaining_hours,
    start_delays,
)

H = 3600.0


def test_the_module_docstring_example():
    running = [QueuedRun(2, 1.0, limit_hours=2.0), QueuedRun(2, 3.0, limit_hours=4.0)]
    head = QueuedRun(4, 2.0)
    long_tail = QueuedRun(1, 1.0, limit_hours=5.0)
    short_tail = QueuedRun(1, 1.0, limit_hours=2.0)
    assert start_delays(4, running, [head, long_tail])[1] == pytest.approx(5 * H)
    assert start_delays(4, running, [head, short_tail])[1] == pytest.approx(1 * H)
    assert start_delays(4, running, [head, long_tail])[0] == pytest.approx(3 * H)


def test_runs_start_in_queue_order_while_they_fit():
    assert admit(0.0, 4, [], [QueuedRun(1, 1), QueuedRun(2, 1), QueuedRun(1, 1), QueuedRun(1, 1)]) == [0, 1, 2]


def test_a_large_run_is_not_starved_by_small_ones():
    # 4 slots: 3 busy until their limit at 10 h; the head needs 4; a 1-slot run with a 20 h limit would
    # hold a slot past the reservation, so it may not start; one with a 5 h limit may.
    running = [Slot(10 * H, 3, QueueTier.on_demand)]
    queue = [QueuedRun(4, 1.0), QueuedRun(1, 20.0), QueuedRun(1, 5.0)]
    assert admit(0.0, 4, running, queue) == [2]


def test_headroom_is_kept_for_runs_that_may_not_leave():
    queue = [QueuedRun(1, 1.0, QueueTier.on_demand), QueuedRun(1, 1.0, QueueTier.stay)]
    running = [Slot(5 * H, 2, QueueTier.on_demand)]
    # 3 slots, 2 busy, headroom 1: the movable run must leave 1 free, the stay-at-home run may take it.
    assert admit(0.0, 3, running, queue, reserved=1) == [1]


def test_tiers_wait_only_behind_their_own_and_higher_tiers():
    running = tuple(QueuedRun(1, 1.0) for _ in range(2))
    backlog = (QueuedRun(1, 5.0, QueueTier.spot), QueuedRun(1, 2.0, QueueTier.on_demand))
    q = QueueState("p", 2, 2, running=2, scheduled=2, backlog=backlog, running_runs=running)
    assert q.wait_s(1, QueueTier.stay) == pytest.approx(1 * H)
    assert q.wait_s(1, QueueTier.on_demand) == pytest.approx(1 * H)  # second slot frees at 1 h too
    assert q.wait_s(1, QueueTier.spot) == pytest.approx(3 * H)


def test_a_work_queue_serves_the_run_due_first():
    """Tiers first; within a tier the earliest due time, equal dues and runs without one in arrival order."""
    arrived = [QueuedRun(1, 1.0, QueueTier.on_demand, due=100.0), QueuedRun(1, 2.0, QueueTier.on_demand, due=50.0),
               QueuedRun(1, 3.0, QueueTier.spot, due=10.0), QueuedRun(1, 4.0, QueueTier.on_demand),
               QueuedRun(1, 5.0, QueueTier.stay, due=1000.0), QueuedRun(1, 6.0, QueueTier.on_demand, due=50.0),
               QueuedRun(1, 7.0, QueueTier.on_demand)]
    assert [r.hours for r in in_queue_order(arrived)] == [5.0, 2.0, 6.0, 1.0, 4.0, 7.0, 3.0]
    # the pool hands its two free slots out in that order
    line = in_queue_order(arrived)
    assert [line[i].hours for i in admit(0.0, 2, [], line)] == [5.0, 2.0]


def test_due_is_the_deadline_or_the_end_of_the_wait_slo():
    assert due_at(5000.0, 1000.0, 4 * H) == 5000.0
    assert due_at(None, 1000.0, 4 * H) == 1000.0 + 4 * H


def test_a_new_run_expects_to_wait_behind_every_run_of_its_tier_whatever_their_dues():
    """Runs arriving later may still go ahead of it, so its wait counts the whole line, not only the runs
    due before it (a run due sooner than the whole line still waits for it)."""
    running = (QueuedRun(1, 1.0, limit_hours=1.0),)
    line = (QueuedRun(1, 3.0, due=1e12), QueuedRun(1, 3.0, due=2e12))
    q = QueueState("s", 1, 1, backlog=line, running_runs=running)
    assert q.wait_s(1, QueueTier.on_demand, 1.0) == pytest.approx(7 * H)


def test_counts_only_spreads_the_work_ahead_over_the_slots():
    q = QueueState("p", 4, 4, running=4, scheduled=4, default_run_hours=2.0)
    assert q.wait_s(1) == pytest.approx((4 / 2 + 4) * 2.0 / 4 * H)
    assert QueueState.idle("p", 4).wait_s(2) == 0.0
    assert math.isinf(q.wait_s(5))


def test_an_explicit_wait_wins_and_runs_too_big_never_start():
    assert QueueState("p", 4, expected_wait_s=120.0).wait_s(2) == 120.0
    assert math.isinf(QueueState("p", 4, expected_wait_s=120.0).wait_s(8))
    assert start_delays(2, [], [QueuedRun(3, 1.0), QueuedRun(1, 1.0)]) == [math.inf, 0.0]


def test_remaining_hours_of_a_run_past_its_estimate():
    assert remaining_hours(2.0, 8.0, 0.5) == 1.5
    assert remaining_hours(2.0, 8.0, 4.0) == 2.0  # halfway to its hard limit
    assert remaining_hours(2.0, 8.0, 9.0) == 0.0
