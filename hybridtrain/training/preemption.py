"""Preemption: the notice that the capacity is going away, trapped as a signal, and the report a stopped run leaves.

A spot instance's termination notice, a pool shutting a worker down, ``kill <pid>``, SLURM's
``--signal=USR1@60``, torchrun passing its own SIGTERM on to its workers — all reach the
training process as SIGTERM (or SIGUSR1). Python's default for SIGTERM ends the process at once
and loses everything since the last checkpoint. Inside ``with PreemptionNotice(grace_s=30) as
notice:`` the signal only *records* the notice (the handler sets a flag and the time, nothing
else); the ``Trainer`` asks ``notice()`` — it is the ``should_stop`` callable — after every
optimizer step, so it finishes the step in progress, writes a checkpoint and raises
``Preempted``; the process then writes ``preempted.json`` (a ``PreemptionReport``) and exits
with ``EXIT_PREEMPTED`` (75, ``EX_TEMPFAIL``). The previous handlers are put back on exit.

An example with ``checkpoint.preemption_grace_s: 30``:

1. 12:00:00.0 SIGTERM arrives during step 342; the handler notes it.
2. 12:00:00.4 step 342 ends; ``should_stop()`` is True; the checkpoint of step 342 is written
   (data, then its SHA-256 manifest) by 12:00:01.2; ``Preempted(job, 342, key)`` is raised.
3. The report says step 342, that key, 1.2 s after the notice, within the 30 s grace; the
   process exits 75. The orchestrator records a preemption (not a failure) and resumes the run
   from that checkpoint — on the same site or, after ``CheckpointStore.copy_latest``, another.

A step is never cut short: one that takes longer than the grace still runs to its end, and the
report then says the grace was exceeded (the platform may kill the process first; a resume then
finds the previous checkpoint). A notice that comes before training starts stops it after its
first step. Under torchrun every rank traps the signal and the ranks agree on stopping
(``Trainer`` all-reduces the flag), rank 0 writes the checkpoint and the report, and every rank
exits 75; torchrun itself then exits 1 (it died of the signal, or saw a worker exit non-zero),
so callers over SSH decide by the report, not by torchrun's status.

Signal handlers can only be installed from the main thread; ``PreemptionNotice`` refuses to be
entered anywhere else. ``trigger()`` records a notice from any thread (a pool's status poll, a
cloud metadata watcher).

A notice can also come after training ended, while the step records its result. Outside any trap
that ends the process at once, and the finished work is lost (a flow run marked Crashed, a trial
trained again). ``preemption_trap`` covers the whole step: a flow enters it around its body, and
the training task inside reuses that same notice. A notice during training stops training as
above; one after training is only recorded, and the step finishes within its grace.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel, Field

from hybridtrain.errors import EXIT_PREEMPTED, Preempted

__all__ = ["DEFAULT_SIGNALS", "EXIT_PREEMPTED", "REPORT_FILE", "PreemptionNotice", "PreemptionReport",
           "preemption_trap"]

#: The signals a notice arrives as: SIGTERM (spot notice, pool shutdown, torchrun) and SIGUSR1 (SLURM, custom agents).
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
#: The report a preempted process leaves next to its other result files.
REPORT_FILE = "preempted.json"
#: The notices installed in this process, innermost last (entered and left by the main thread only).
_INSTALLED: list[PreemptionNotice] = []


class PreemptionNotice:
    """A trap for preemption signals, active inside ``with``; call it to ask whether a notice came.

    ``grace_s`` is how long the platform waits after the notice before it kills the process
    (``checkpoint.preemption_grace_s``); it is recorded, not enforced. ``clock`` (monotonic
    seconds) is injectable for tests.
    """

    def __init__(
        self,
        grace_s: float = 30.0,
        *,
        signals: Iterable[signal.Signals] = DEFAULT_SIGNALS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if grace_s <= 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s}")
        self.grace_s = float(grace_s)
        self.signals = tuple(signals)
        self.clock = clock
        self._event = threading.Event()
        self._lock = threading.RLock()  # re-entrant: the handler may interrupt trigger() in the main thread
        self._previous: dict[signal.Signals, Any] = {}
        #: When the first notice came (``clock`` seconds and wall time) and what it was.
        self.received_at: float | None = None
        self.received_wall: datetime | None = None
        self.reason: str | None = None
        #: How many notices came (a platform may repeat SIGTERM; only the first one counts).
        self.count = 0

    # -- the trap ------------------------------------------------------------------------------

    def __enter__(self) -> PreemptionNotice:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionNotice must be entered in the main thread (only it may install signal handlers); "
                "in a worker thread, pass a notice entered by the main thread, or call trigger() on one"
            )
        if self._previous:
            raise RuntimeError("this PreemptionNotice is already installed")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        _INSTALLED.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self in _INSTALLED:
            _INSTALLED.remove(self)

    @staticmethod
    def installed() -> PreemptionNotice | None:
        """The innermost notice installed in this process (by its main thread), if any."""
        return _INSTALLED[-1] if _INSTALLED else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: record, nothing else (no logging, no I/O).
        self.trigger(signal.Signals(signum).name)

    def trigger(self, reason: str = "requested") -> None:
        """Record a notice (from a signal handler or any thread); only the first one sets the time."""
        with self._lock:
            self.count += 1
            if self.received_at is None:
                self.received_at = self.clock()
                self.received_wall = datetime.now(UTC)
                self.reason = reason
        self._event.set()

    # -- what the trainer and the process ask ------------------------------------------------

    def __call__(self) -> bool:
        """``should_stop`` for ``Trainer.fit``: True once a notice came."""
        return self._event.is_set()

    @property
    def received(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a notice comes (True) or ``timeout`` seconds pass (False)."""
        return self._event.wait(timeout)

    @property
    def deadline(self) -> float | None:
        """``clock`` time by which the checkpoint should be stored (notice + grace); None before a notice."""
        return None if self.received_at is None else self.received_at + self.grace_s

    def elapsed(self) -> float | None:
        """Seconds since the notice; None before one."""
        return None if self.received_at is None else self.clock() - self.received_at

    def report(self, exc: Preempted, *, checkpoint_uri: str | None = None, site: str | None = None,
               rank: int = 0) -> PreemptionReport:
        """What to leave behind for ``exc``, timed now (right after the checkpoint was written)."""
        elapsed = self.elapsed()
        return PreemptionReport(
            job=exc.job,
            step=exc.step,
            checkpoint=exc.checkpoint,
            checkpoint_uri=checkpoint_uri,
            site=site or exc.site,
            reason=self.reason,
            notice_at=self.received_wall,
            stopped_at=datetime.now(UTC),
            seconds_after_notice=elapsed,
            grace_s=self.grace_s,
            within_grace=elapsed is None or elapsed <= self.grace_s,
            hostname=os.uname().nodename,
            pid=os.getpid(),
            rank=rank,
        )


@contextmanager
def preemption_trap(grace_s: float) -> Iterator[PreemptionNotice | None]:
    """The notice that covers this block: the one already installed in the process (a flow's, around the
    task that trains), else a new one installed for the block in the main thread; ``None`` in another
    thread with none installed (in-process trials in threads: the process's own trap, if any, decides)."""
    current = PreemptionNotice.installed()
    if current is not None:
        yield current
    elif threading.current_thread() is not threading.main_thread():
        yield None
    else:
        with PreemptionNotice(grace_s) as notice:
            yield notice


class PreemptionReport(BaseModel):
    """What a preempted training process left (``preempted.json``): where it stopped and how fast it saved."""

    job: str
    step: int = Field(description="The optimizer step the checkpoint holds.")
    checkpoint: str | None = Field(description="Key of the checkpoint written at that step, in the run's store.")
    checkpoint_uri: str | None = None
    site: str | None = None
    reason: str | None = Field(None, description="The signal (SIGTERM, SIGUSR1) or trigger that gave the notice; "
                                                 "None when the stop was requested without a notice.")
    notice_at: datetime | None = None
    stopped_at: datetime
    seconds_after_notice: float | None = Field(None, description="From the notice until the checkpoint was stored.")
    grace_s: float
    within_grace: bool
    hostname: str
    pid: int
    rank: int = 0
    exit_status: int = EXIT_PREEMPTED

    def write(self, directory: Path | str) -> Path:
        """Write ``directory/preempted.json`` atomically (temp file + rename)."""
        path = Path(directory) / REPORT_FILE
        tmp = path.with_name(f".{REPORT_FILE}.tmp-{os.getpid()}")
        tmp.write_text(self.model_dump_json(indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: Path | str) -> PreemptionReport | None:
        """The report in ``directory``, or None when the process left none."""
        path = Path(directory) / REPORT_FILE
        try:
            return cls.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None

    def error(self, *, site: str | None = None) -> Preempted:
        """The ``Preempted`` error this report stands for (what an executor raises)."""
        return Preempted(self.job, self.step, self.checkpoint, site=site or self.site)
