"""SweepSlots: ready trials wait for one of the sweep's slots, never more than parallelism train, a stop withdraws the waiting."""

from __future__ import annotations

import threading
import time

import pytest

from hybridtrain.sweeps.slots import SweepSlots, SweepStopping


def test_a_ready_trial_waits_for_a_slot_and_takes_the_one_given_back_at_once():
    slots = SweepSlots(2)
    first, second, ready = slots.slot(0), slots.slot(1), slots.slot(2)
    assert first.take() and second.take()
    assert slots.free == 0
    assert not ready.take(timeout_s=0.05)  # both slots train: the ready trial waits
    assert not ready.held and ready.waited_s >= 0.05

    took = threading.Event()

    def wait_for_it() -> None:
        ready.take()
        took.set()

    t = threading.Thread(target=wait_for_it)
    t.start()
    freed = time.monotonic()
    first.give_back()
    assert took.wait(5)
    t.join(5)
    assert ready.held and ready.taken_at is not None
    assert time.monotonic() - freed < 1.0  # it started at once, not at some poll interval
    assert slots.free == 0


def test_take_and_give_back_are_idempotent_per_trial():
    slots = SweepSlots(1)
    slot = slots.slot(7)
    assert slot.take() and slot.take()  # a resumed attempt takes the slot it already holds
    assert slots.free == 0
    slot.give_back()
    slot.give_back()  # the end of a trial after its body already gave it back
    assert slots.free == 1


def test_never_more_than_parallelism_hold_a_slot():
    slots = SweepSlots(3)
    holding, most, lock = 0, 0, threading.Lock()

    def trial(number: int) -> None:
        nonlocal holding, most
        slot = slots.slot(number)
        slot.take()
        with lock:
            holding += 1
            most = max(most, holding)
        time.sleep(0.01)  # training
        with lock:
            holding -= 1
        slot.give_back()

    threads = [threading.Thread(target=trial, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most == 3 and slots.free == 3


def test_stop_withdraws_the_waiting_trials_and_keeps_the_training_ones():
    slots = SweepSlots(1)
    training = slots.slot(0)
    training.take()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            slots.slot(1).take()
        except SweepStopping as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    slots.stop("3 trials failed, more than sweep.max_failed_trials (2)")
    t.join(5)
    assert len(errors) == 1 and "trial 1 did not train" in str(errors[0]) and "max_failed_trials" in str(errors[0])
    assert training.held  # a trial that trains goes on to its end
    with pytest.raises(SweepStopping):
        slots.slot(2).take()


def test_parallelism_must_be_positive():
    with pytest.raises(ValueError, match="parallelism"):
        SweepSlots(0)


def _take_in_thread(slot, order: list[int]) -> threading.Thread:
    def run() -> None:
        if slot.take(timeout_s=10):
            order.append(slot.number)

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_ready_trials_get_slots_in_the_order_they_were_asked_whichever_got_ready_first():
    slots = SweepSlots(1)
    busy = slots.slot(0)
    busy.take()
    second, third = slots.slot(1), slots.slot(2)
    order: list[int] = []
    late_asked_ready_first = _take_in_thread(third, order)
    late_asked_ready_first.join(0.2)  # trial 2 waits for the busy slot before trial 1 is ready
    first_asked = _take_in_thread(second, order)
    busy.give_back()
    _wait_until(lambda: order == [1])
    assert not third.held  # trial 2 was ready first but waits for trial 1, asked before it
    second.give_back()
    first_asked.join(5)
    late_asked_ready_first.join(5)
    assert order == [1, 2]


def test_a_trial_still_getting_ready_holds_no_one_up():
    slots = SweepSlots(1)
    stalled, ready = slots.slot(0), slots.slot(1)  # trial 0's run is still being created
    assert ready.take(timeout_s=1)  # a free slot goes to trial 1, ready, without waiting for trial 0
    order: list[int] = []
    t = _take_in_thread(stalled, order)  # trial 0 gets ready while trial 1 trains: it waits for the slot
    t.join(0.2)
    assert t.is_alive() and order == []
    ready.give_back()
    t.join(5)
    assert order == [0]
    stalled.give_back()


def test_a_trial_not_ready_after_all_goes_to_the_back_of_the_line():
    slots = SweepSlots(1)
    stalled, ready = slots.slot(0), slots.slot(1)  # trial 0's run could not be created yet
    stalled.requeue()  # its attempt ended before it took a slot: to the back
    assert ready.take(timeout_s=1)
    assert not slots.wait_all_taken(timeout_s=0.05)  # trial 0 is still in line
    ready.give_back()
    assert stalled.take(timeout_s=1)  # its next attempt takes the slot after trial 1
    stalled.give_back()
    assert stalled.take(timeout_s=1)  # trained, gave it back, an attempt after that takes one again
    stalled.give_back()
    abandoned = slots.slot(2)
    abandoned.give_back()  # ended without ever taking one (e.g. withdrawn): it leaves the line
    assert slots.slot(3).take(timeout_s=1)


def test_wait_all_taken_returns_when_the_line_is_empty_or_after_its_timeout():
    slots = SweepSlots(2)
    first, second = slots.slot(0), slots.slot(1)
    assert not slots.wait_all_taken(timeout_s=0.05)  # both still getting ready
    first.take()
    t = threading.Thread(target=second.take)
    t.start()
    assert slots.wait_all_taken(timeout_s=5)
    t.join(5)
    assert second.held
