"""LocalGpus: which of this machine's GPUs a job trains on, when its site has no SSH hosts.

A site without SSH hosts trains on the machine its worker runs on. The site's GPU lease
(``orchestration.gpu_lease``) caps how many GPUs its jobs hold together, but not *which*: two
jobs on one machine would both train on ``cuda:0``. ``claim(n)`` picks ``n`` GPUs of this machine
no other job holds, by an exclusive ``flock`` on one file per GPU in ``lock_dir`` (default
``$HYBRIDTRAIN_GPU_LOCK_DIR`` or ``/tmp/hybridtrain-gpu-locks``). The kernel drops a dead
process's locks, so a killed worker never strands a GPU. An example, on a machine with 4 GPUs:

- job A (``gpus: 2``) claims GPUs 0 and 1; job B (``gpus: 1``) claims GPU 2;
- job C (``gpus: 2``) finds one free and waits, saying so, until A ends; then it takes 0 and 1;
- a job of ``gpus: 8`` is refused at once: this machine has 4.

GPUs are named as CUDA sees them: with ``CUDA_VISIBLE_DEVICES`` set for the worker, its entries
(indices or UUIDs) are the lock names, so workers given different GPUs never contend. A machine
without CUDA has nothing to claim (``count() == 0``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from hybridtrain.errors import NoFeasiblePlacement, Problem, SpecError

LOCK_DIR_ENV = "HYBRIDTRAIN_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/hybridtrain-gpu-locks"
WAIT_ENV = "HYBRIDTRAIN_GPU_WAIT_S"
DEFAULT_WAIT_S = 6 * 3600.0


def gpu_wait_s(env: dict[str, str] | None = None) -> float:
    """How long a job waits for busy GPUs before it fails: ``$HYBRIDTRAIN_GPU_WAIT_S`` seconds (default 6 h).

    Read when a job waits, so a worker's environment can change it without a restart. A value that
    is not a number ≥ 0 is a ``SpecError`` naming the variable.
    """
    raw = (os.environ if env is None else env).get(WAIT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_WAIT_S
    try:
        wait = float(raw)
    except ValueError:
        wait = float("nan")
    if not (wait >= 0 and wait != float("inf")):
        raise SpecError("the worker's environment", [Problem(
            WAIT_ENV, f"{raw!r} is not a number of seconds >= 0: set {WAIT_ENV} to how long a job may wait "
                      "for busy GPUs (e.g. 3600), or unset it for the default (6 h)")])
    return wait


def visible_gpus(count: int | None = None, env: dict[str, str] | None = None) -> list[str]:
    """This machine's GPUs as CUDA numbers them for this process: the names ``CUDA_VISIBLE_DEVICES`` gives,
    else ``0..count-1``. ``count`` defaults to ``torch.cuda.device_count()`` (0 without CUDA)."""
    if count is None:
        import torch  # lazy: heavy

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    names = [x.strip() for x in listed.split(",") if x.strip()] if listed else []
    return names[:count] if names else [str(i) for i in range(count)]


@dataclass
class ClaimedGpus:
    """GPUs held by this process: ``names`` for ``CUDA_VISIBLE_DEVICES``, ``positions`` for ``cuda:<i>`` here."""

    names: list[str]
    positions: list[int]
    _files: list[IO[bytes]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for fh in self._files:
            fh.close()  # closing the descriptor drops its flock
        self._files.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LocalGpus:
    """Claims GPUs of this machine for one job at a time each (see the module doc)."""

    def __init__(self, gpus: Sequence[str] | None = None, lock_dir: Path | str | None = None):
        self.gpus = list(gpus) if gpus is not None else visible_gpus()
        self.lock_dir = Path(lock_dir or os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)

    def count(self) -> int:
        return len(self.gpus)

    def _open(self, name: str) -> IO[bytes]:
        """The lock file of GPU ``name``, created for every user of the machine (the lock is what matters)."""
        path = self.lock_dir / f"gpu-{_file_safe(name)}.lock"
        try:
            if not self.lock_dir.is_dir():
                self.lock_dir.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    self.lock_dir.chmod(0o1777)  # like /tmp: any worker may add a file, none may remove another's
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)
            return os.fdopen(fd, "r+b")
        except OSError as exc:
            raise SpecError("the worker's environment", [Problem(
                LOCK_DIR_ENV, f"cannot use {path} to claim GPU {name} of this machine ({exc.strerror}): set "
                              f"{LOCK_DIR_ENV} to a directory every worker on this machine may write")]) from None

    def try_claim(self, n: int) -> ClaimedGpus | None:
        """The first ``n`` free GPUs, locked; None (and nothing held) when fewer are free."""
        taken = ClaimedGpus([], [])
        for position, name in enumerate(self.gpus):
            if len(taken.names) == n:
                break
            fh = self._open(name)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            taken._files.append(fh)
            taken.names.append(name)
            taken.positions.append(position)
        if len(taken.names) < n:
            taken.release()
            return None
        return taken

    def busy(self) -> int:
        """How many of this machine's GPUs other jobs hold now."""
        free = 0
        for name in self.gpus:
            with self._open(name) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                free += 1
        return len(self.gpus) - free

    def claim(self, n: int, *, job: str, site: str, wait_s: float | None = None, poll_s: float = 2.0,
              say: Callable[[str], None] | None = None) -> ClaimedGpus:
        """Hold ``n`` free GPUs of this machine, waiting up to ``wait_s`` (default ``$HYBRIDTRAIN_GPU_WAIT_S``)
        for them. ``NoFeasiblePlacement`` naming the site and the counts: at once for a job larger than the
        machine, or when the wait runs out."""
        if n > len(self.gpus):
            raise NoFeasiblePlacement(job, {site: f"site {site} trains on its worker's machine, which has "
                                                  f"{len(self.gpus)} GPU(s); the job needs {n}"},
                                      hint="lower resources.gpus, run the site's worker on a machine with more "
                                           "GPUs, or place the job elsewhere")
        wait = gpu_wait_s() if wait_s is None else wait_s
        deadline = time.monotonic() + wait
        said = False
        while True:
            got = self.try_claim(n)
            if got is not None:
                return got
            busy = self.busy()
            if time.monotonic() >= deadline:
                raise NoFeasiblePlacement(job, {site: f"{len(self.gpus) - busy} of the {len(self.gpus)} GPUs of "
                                                      f"site {site}'s worker machine free; the job needs {n} "
                                                      f"(waited {wait:.0f} s)"},
                                          hint=f"wait for the machine's other jobs to end, raise {WAIT_ENV}, or "
                                               "place the job elsewhere")
            if not said and say is not None:
                say(f"waiting for GPUs on this machine: {len(self.gpus) - busy} of {len(self.gpus)} free; "
                    f"the job needs {n}")
                said = True
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def hold_for_job(gpus: int, *, job: str, site: str, count: int | None = None,
                 say: Callable[[str], None] | None = None) -> contextlib.AbstractContextManager[ClaimedGpus | None]:
    """What a job asking for ``gpus`` GPUs holds of this machine while the block runs: ``max(1, gpus)`` of them
    on a machine with CUDA (None for a CPU job, or a machine without CUDA)."""
    machine = LocalGpus()
    if gpus < 1 or not machine.count():
        return contextlib.nullcontext(None)
    return machine.claim(count if count is not None else gpus, job=job, site=site, say=say)


def job_device(gpus: int, held: ClaimedGpus | None) -> Any:
    """The torch device an in-process job trains on: the CPU for a CPU job (it never takes a GPU another job
    holds), the GPU it holds, else None (the trainer's default)."""
    import torch  # lazy: heavy

    if gpus == 0:
        return torch.device("cpu")
    return torch.device(f"cuda:{held.positions[0]}") if held is not None else None
