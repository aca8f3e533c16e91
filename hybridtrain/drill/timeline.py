"""Timeline: when each event of a drill scenario happened, relative to its fault — and waiting, with a
deadline, for the next one; the drill's own failures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hybridtrain.drill.report import DrillReport, Event
from hybridtrain.errors import HybridtrainError

#: Bound on every wait of the drill for a process, a file or a server.
WAIT_S = 120.0
#: How often the drill looks at a beacon or a store while it waits.
POLL_S = 0.001
#: SSH timeouts of the ssh-down drill. Production's reconnect window is 60 s (``ssh_site.Timeouts``);


class DrillFailed(Exception):
    """A scenario's recovery did not go as it must (the message says what happened instead)."""


class RecoveryFailed(HybridtrainError):
    """A failover drill found a recovery path that does not work: fix it before a real failure needs it."""

    exit_code = 1

    def __init__(self, report: DrillReport):
        self.report = report
        failed = "; ".join(f"{s.scenario}: {s.notes[0] if s.notes else 'failed'}" for s in report.failed)
        super().__init__(f"failover drill: {len(report.failed)} scenario(s) failed ({failed}); the report is in "
                         f"{report.directory}")


class Skipped(Exception):
    """A scenario cannot run here (the message says why and how to make it possible)."""


class Timeline:
    """Events of one scenario, timed against its fault (set with ``fault()``)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []
        self.fault_at: float | None = None

    def add(self, what: str, at: float | None = None) -> float:
        t = time.time() if at is None else at
        self.events.append((t, what))
        return t

    def fault(self, what: str, at: float | None = None) -> float:
        self.fault_at = self.add(what, at)
        return self.fault_at

    def since_fault(self, t: float) -> float:
        assert self.fault_at is not None, "no fault injected yet"
        return t - self.fault_at

    def to_events(self) -> list[Event]:
        zero = self.fault_at if self.fault_at is not None else (self.events[0][0] if self.events else 0.0)
        return [Event(at_s=round(t - zero, 4), what=w) for t, w in sorted(self.events)]


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, every: float = POLL_S) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); ``DrillFailed`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DrillFailed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise DrillFailed(message)
