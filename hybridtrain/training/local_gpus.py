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

Who holds a GPU: the claiming job writes a ``GpuHolder`` (job, site, pid, host, since) into the
GPU's lock file while it holds the lock. ``holders()`` reads them — a file whose lock is free is
a free GPU, whatever it says — so a waiting job names the jobs it waits for, and
``hybridtrain gpus`` lists them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
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
        wait = math.nan
    if not (math.isfinite(wait) and wait >= 0):
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


@dataclass(frozen=True)
class GpuHolder:
    """The job holding one GPU of this machine, as it wrote itself into the GPU's lock file."""

    job: str
    site: str
    pid: int
    host: str
    since: str  # ISO 8601, UTC

    @property
    def started(self) -> str:
        """When it claimed the GPU, as ``2026-11-28 13:10:38`` (UTC)."""
        return self.since[:19].replace("T", " ")

    def line(self) -> str:
        return f"job {self.job} at site {self.site} (pid {self.pid}, since {self.started} UTC)"

    @classmethod
    def parse(cls, raw: bytes) -> GpuHolder | None:
        """The holder a lock file names; None for an empty or foreign file (an older holder wrote none)."""
        try:
            got = json.loads(raw.decode())
            return cls(job=str(got["job"]), site=str(got["site"]), pid=int(got["pid"]), host=str(got["host"]),
                       since=str(got["since"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None


#: A GPU some process holds without having said who (a lock file from before holders were written).
UNKNOWN = GpuHolder(job="(unknown)", site="(unknown)", pid=0, host="", since="")


def holding_summary(held: dict[str, GpuHolder | None]) -> str:
    """``GPU 0, 1: job a at site s (pid …); GPU 3: job b …`` for the GPUs held, grouped by holder."""
    by: dict[GpuHolder, list[str]] = {}
    for name, h in held.items():
        if h is not None:
            by.setdefault(h, []).append(name)
    return "; ".join(f"GPU {', '.join(names)}: {h.line() if h is not UNKNOWN else 'a process that did not say'}"
                     for h, names in by.items())


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

    def _path(self, name: str) -> Path:
        return self.lock_dir / f"gpu-{_file_safe(name)}.lock"

    def _open(self, name: str) -> IO[bytes]:
        """The lock file of GPU ``name``, created for every user of the machine (the lock is what matters)."""
        path = self._path(name)
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

    def try_claim(self, n: int, holder: GpuHolder | None = None) -> ClaimedGpus | None:
        """The first ``n`` free GPUs, locked, with ``holder`` written into their lock files; None (and
        nothing held) when fewer are free."""
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
        if holder is not None:
            record = json.dumps(asdict(holder)).encode()
            for fh in taken._files:
                with contextlib.suppress(OSError):  # who holds it is for people: never fail a claim over it
                    fh.seek(0)
                    fh.truncate()
                    fh.write(record)
                    fh.flush()
        return taken

    def holders(self) -> dict[str, GpuHolder | None]:
        """Each GPU of this machine and the job holding it (None: free)."""
        out: dict[str, GpuHolder | None] = {}
        if self.lock_dir.exists() and not self.lock_dir.is_dir():
            raise SpecError("the worker's environment", [Problem(
                LOCK_DIR_ENV, f"{self.lock_dir} is not a directory: set {LOCK_DIR_ENV} to the directory the "
                              "workers on this machine claim GPUs in")])
        for name in self.gpus:
            if not self._path(name).exists():
                out[name] = None  # never claimed on this machine (nothing is created to find that out)
                continue
            with self._open(name) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    fh.seek(0)
                    out[name] = GpuHolder.parse(fh.read(4096)) or UNKNOWN
                    continue
                out[name] = None  # closing the file drops the lock just taken
        return out

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
        me = GpuHolder(job=job, site=site, pid=os.getpid(), host=socket.gethostname(),
                       since=datetime.now(UTC).isoformat(timespec="seconds"))
        said = False
        while True:
            got = self.try_claim(n, me)
            if got is not None:
                return got
            held = self.holders()
            free = sum(h is None for h in held.values())
            if time.monotonic() >= deadline:
                raise NoFeasiblePlacement(job, {site: f"{free} of the {len(self.gpus)} GPUs of site {site}'s worker "
                                                      f"machine free; the job needs {n} (waited {wait:.0f} s); "
                                                      f"held: {holding_summary(held)}"},
                                          hint=f"wait for the machine's other jobs to end, raise {WAIT_ENV}, or "
                                               "place the job elsewhere")
            if not said and say is not None:
                say(f"waiting for GPUs on this machine: {free} of {len(self.gpus)} free; the job needs {n}; "
                    f"held: {holding_summary(held)}")
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
