"""SweepSlots: a sweep's ``parallelism`` places to train, taken by a trial that is ready, held to its end.

A trial gets ready before a slot is free: the study asks it, the policy places it, its data is
synced and its subflow run is created and started — Prefect and MLflow API work that takes
seconds per trial (tens of seconds on a busy server). Only then does it ``take`` a slot, just
before it trains, and it gives the slot back when it ends (completed, pruned or failed, with all
its attempts). So a freed slot starts the next, already-started trial at once instead of waiting
for that work, while never more than ``parallelism`` trials train.

An example (``parallelism: 2``, two trials ready ahead): trials 0-3 start; 0 and 1 take the two
slots and train, 2 and 3 wait in ``take``. Trial 0 ends and gives its slot back: trial 2 takes it
at once, and the sweep asks trial 4, which gets ready while 1, 2 train and 3 waits.

Slots go to the *ready* trials in the order the sweep asked them (``slot`` is called in that
order): when several wait in ``take``, the one asked first goes first, whichever subflow run
happened to start first. A trial still getting ready holds no one up: a free slot goes to a ready
trial asked after it rather than wait for that trial's API work (before, slots went strictly in
ask order, and one trial whose placement or run creation took seconds on a busy server left every
slot idle that long). A trial whose attempt ended before it took its slot (its run could not be
created, it waits for a site) goes to the back of the line (``requeue``).

The wait is not the trial's work: ``Slot.waited_s`` says how long it was, for the trial's billed
seconds to leave it out. After ``stop()`` (the sweep stops asking, e.g. too many failed trials) a
trial still waiting gets ``SweepStopping`` instead of a slot, and does not train.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from hybridtrain.errors import HybridtrainError


class SweepStopping(HybridtrainError):
    """The sweep stopped before this ready trial got a slot: it did not train (never retried)."""

    exit_code = 1
    retryable = False

    def __init__(self, number: int, reason: str):
        self.number = number
        super().__init__(f"trial {number} did not train: the sweep stopped before a slot was free ({reason})")


class SweepSlots:
    """``parallelism`` slots shared by the threads that run one sweep's trials (thread-safe)."""

    def __init__(self, parallelism: int):
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        self.parallelism = parallelism
        self._free = parallelism
        self._cond = threading.Condition()
        self._stopped: str | None = None
        self._queue: list[int] = []  # turns of the slots not taken yet, in the order they were asked
        self._ready: set[int] = set()  # turns of the trials waiting in ``take`` (ready to train)
        self._turns = 0

    @property
    def free(self) -> int:
        with self._cond:
            return self._free

    def slot(self, number: int) -> Slot:
        """Trial ``number``'s hold on one slot (not taken yet); call in the order the trials are asked."""
        return Slot(self, number, self._enqueue())

    def _enqueue(self) -> int:
        with self._cond:
            self._turns += 1
            self._queue.append(self._turns)
            self._cond.notify_all()
            return self._turns

    def wait_all_taken(self, timeout_s: float) -> bool:
        """Wait until every trial in line has taken a slot or left the line (up to ``timeout_s``)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue or self._stopped is not None, timeout=timeout_s)

    def stop(self, reason: str) -> None:
        """Trials still waiting for a slot, and any that asks later, get ``SweepStopping``."""
        with self._cond:
            self._stopped = reason
            self._cond.notify_all()

    def _take(self, number: int, turn: int, timeout_s: float | None) -> bool:
        with self._cond:
            self._ready.add(turn)
            try:
                got = self._cond.wait_for(
                    lambda: self._stopped is not None or (self._free > 0 and turn == min(self._ready)),
                    timeout=timeout_s)
            finally:
                self._ready.discard(turn)
                self._cond.notify_all()  # the next ready one may be first now
            if self._stopped is not None:
                raise SweepStopping(number, self._stopped)
            if not got:
                return False
            self._free -= 1
            if turn in self._queue:
                self._queue.remove(turn)
            return True

    def _leave(self, turn: int) -> None:
        with self._cond:
            if turn in self._queue:
                self._queue.remove(turn)
                self._cond.notify_all()

    def _give_back(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


class Slot:
    """One trial's slot: ``take`` (once; again is a no-op) before it trains, ``give_back`` when it ends."""

    def __init__(self, slots: SweepSlots, number: int, turn: int):
        self.slots, self.number = slots, number
        self.turn: int | None = turn  # its place in line; None while it holds a slot or has left the line
        self.held = False
        self.waited_s = 0.0
        self.taken_at: datetime | None = None

    def take(self, timeout_s: float | None = None) -> bool:
        """Wait for a free slot (up to ``timeout_s``; None: as long as it takes); False on timeout."""
        if self.held:
            return True
        if self.turn is None:  # it gave its slot back and needs one again (an attempt after it trained)
            self.turn = self.slots._enqueue()
        t0 = time.monotonic()
        try:
            got = self.slots._take(self.number, self.turn, timeout_s)
        finally:
            self.waited_s += time.monotonic() - t0
        if got:
            self.held, self.turn, self.taken_at = True, None, datetime.now(UTC)
        return got

    def requeue(self) -> None:
        """Not ready after all (its attempt ended before it took the slot): to the back of the line."""
        if self.turn is not None:
            self.slots._leave(self.turn)
            self.turn = self.slots._enqueue()

    def give_back(self) -> None:
        """The trial ended: its slot goes to the next in line (or, never taken, it leaves the line)."""
        if self.held:
            self.held = False
            self.slots._give_back()
        elif self.turn is not None:
            self.slots._leave(self.turn)
            self.turn = None
