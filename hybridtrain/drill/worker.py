"""DrillWorker: the production host job (``hybridtrain.remote.host_training``) with a step beacon, as a failover drill runs it.

``python -m hybridtrain.drill.worker BUNDLE_DIR`` does what ``python -m hybridtrain.remote.host_training
BUNDLE_DIR`` does — read the job bundle, fetch the approved data by its DVC pointer from the
site's store, train with ``Trainer`` under a ``PreemptionNotice``, checkpoint into the site's
store under the bundle's run key, resume from its newest valid checkpoint, write
``preempted.json`` and exit ``EXIT_PREEMPTED`` (75) on SIGTERM — by calling the very same
``host_training.run``. The one addition is what a drill needs to measure from outside:

``BUNDLE_DIR/beacon`` (``StepBeacon``): 24 bytes rewritten in place after every optimizer step —
the steps completed by this process, the wall time (``time.time()``) of its first completed step
and of its latest. The trainer asks its ``should_stop`` callable exactly once after every
optimizer step, so a notice that counts its calls counts steps. A process killed with SIGKILL
leaves the beacon as it was after its last completed step: how far it got before the fault.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hybridtrain.errors import EXIT_PREEMPTED, HybridtrainError, Preempted
from hybridtrain.training.preemption import PreemptionNotice

BEACON_FILE = "beacon"
_FORMAT = struct.Struct("<qdd")  # steps completed, wall time of the first, wall time of the latest


@dataclass(frozen=True)
class Beacon:
    """What a beacon file says: ``steps`` completed by one process, and when its first and latest ended."""

    steps: int
    first_step_at: float
    last_step_at: float

    @property
    def seconds_per_step(self) -> float | None:
        """Mean wall seconds per step between the first and the latest (None with fewer than 2 steps)."""
        if self.steps < 2:
            return None
        return (self.last_step_at - self.first_step_at) / (self.steps - 1)

    @classmethod
    def read(cls, path: Path) -> Beacon | None:
        """The beacon at ``path``, or None when the process has not completed a step yet."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) < _FORMAT.size:
            return None
        steps, first, last = _FORMAT.unpack(raw[:_FORMAT.size])
        return cls(steps, first, last) if steps > 0 else None


class StepBeacon(PreemptionNotice):
    """A ``PreemptionNotice`` that also records every call (= every optimizer step) in a beacon file.

    One ``pwrite`` of 24 bytes per step (microseconds); the file is opened on ``__enter__`` and
    closed on ``__exit__``.
    """

    def __init__(self, path: Path, grace_s: float = 30.0):
        super().__init__(grace_s)
        self.path = Path(path)
        self.steps = 0
        self.first_at = 0.0
        self._fd: int | None = None

    def __enter__(self) -> StepBeacon:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __call__(self) -> bool:
        now = time.time()
        self.steps += 1
        if self.steps == 1:
            self.first_at = now
        if self._fd is not None:
            os.pwrite(self._fd, _FORMAT.pack(self.steps, self.first_at, now), 0)
        return super().__call__()


def main(argv: list[str] | None = None) -> int:
    """``host_training.main`` with a ``StepBeacon`` in place of the plain notice."""
    from hybridtrain.remote import host_training  # lazy: heavy (torch, pandas)
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hybridtrain.drill.worker BUNDLE_DIR", file=sys.stderr)
        return 2
    bundle_dir = Path(args[0])
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format=f"{host_training.PREFIX} %(levelname)s %(name)s: %(message)s")
    try:
        with StepBeacon(bundle_dir / BEACON_FILE) as notice:
            host_training.run(bundle_dir, notice=notice)
    except Preempted as exc:
        print(f"{host_training.PREFIX} {exc}; exiting with status {EXIT_PREEMPTED}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except HybridtrainError as exc:
        print(f"{host_training.PREFIX} error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
