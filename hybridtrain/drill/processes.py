"""Processes: finding and stopping a process tree, and a host job by its id, from ``/proc``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

from hybridtrain.drill.timeline import wait_until

log = logging.getLogger(__name__)



def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (e.g. sshd's per-connection processes)."""
    return [p for p in _pids() if _ppid(p) == pid]


def descendant_pids(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        parent = _ppid(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    found: list[int] = []
    frontier = [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found += frontier
    return found


def kill_tree(*procs: subprocess.Popen) -> None:
    """SIGKILL each of ``procs`` and every process below it, all at once (the machine went down), and reap them."""
    pids = [pid for proc in procs for pid in (proc.pid, *descendant_pids(proc.pid))]
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=30)


def stop_with_children(*procs: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate each of ``procs`` at once, SIGKILL what is left after ``grace_s`` (one grace for all),
    then SIGKILL the children they had: those outlive them otherwise."""
    children = [pid for proc in procs for pid in child_pids(proc.pid)]
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for pid in children:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None  # ended while we looked


def kill_host_job(workdir: Path, job_id: str) -> int:
    """SIGKILL every process of a job on a loopback host (its wrapper's group and torchrun's workers); how many."""
    marker = f"{workdir / 'jobs' / job_id}/bundle".encode()

    def has_marker(pid: int) -> bool:
        try:
            return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False  # ended while we looked

    pids = [p for p in _pids() if p != os.getpid() and has_marker(p)]
    pid_file = workdir / "jobs" / job_id / "pid"
    if pid_file.exists():
        with suppress(ProcessLookupError, ValueError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(has_marker(p) for p in pids), f"the processes of job {job_id} to end", timeout=30,
               every=0.01)
    return len(pids)
