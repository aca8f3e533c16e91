"""LocalTraining: a job of several GPUs at a site without SSH hosts — torchrun on the worker's own machine.

A site without SSH hosts trains on the machine its worker runs on. A one-GPU job trains in the
worker's process; a job of ``resources.gpus: N > 1`` needs N processes, one per GPU, joined by
DDP — the same program an SSH host runs (``hybridtrain.remote.host_training`` under ``torchrun
--standalone``), started here as a child process. An example, ``gpus: 4`` at ``cloud-eu``:

1. ``local_train`` writes the JobBundle into ``<workspace>/.hybridtrain/jobs/<job_id>/bundle``
   (an earlier attempt's directory is removed first: training resumes from the checkpoint store,
   not from it) and starts ``python -m torch.distributed.run --standalone --nproc_per_node=4 -m
   hybridtrain.remote.host_training <bundle>``, seeing only the GPUs the job holds
   (``CUDA_VISIBLE_DEVICES``); on a machine without CUDA, 4 CPU processes over gloo.
2. Rank 0 fetches the approved data from the site's store, the ranks train, rank 0 checkpoints to
   the site's store (the same series an in-process run of the run key uses) and writes the result
   files. The job writes its own log file (``.hybridtrain/jobs/<job_id>/log``), and every line of it
   goes to ``on_line`` (the Prefect run logger) as it comes.
3. ``should_stop()`` turning true (a preemption notice to the worker) sends the job SIGTERM:
   torchrun passes it on, rank 0 stores a checkpoint and ``preempted.json``, and ``Preempted`` is
   raised here, as from an SSH host. Past ``timeout`` (default ``resources.max_hours`` plus a setup
   allowance) the job is stopped the same way and RemoteJobFailed raised.
4. The job dies with the caller: the child is told by the kernel (``PR_SET_PDEATHSIG``) to stop
   when the thread that started it is gone, and an exception in the caller (a cancelled flow run)
   stops it before propagating. Nothing trains on after the GPUs' lease has ended.
5. Whatever the outcome, the bundle's secrets file and the job's copy of the data are deleted.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import hybridtrain
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import RemoteJobFailed
from hybridtrain.remote.host_training import (
    ERROR_FILES,
    FEATURIZER_FILE,
    MODEL_FILE,
    RESULT_DIR,
    RESULT_FILE,
    HostResult,
    first_error,
    torchrun_command,
)
from hybridtrain.remote.job_bundle import SECRETS_FILE, JobBundle
from hybridtrain.remote.remote_training import SETUP_ALLOWANCE_S, SHUTDOWN_MARGIN_S, TrainResultFiles, portable_site
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import Site
from hybridtrain.tracking.lineage import code_version
from hybridtrain.training.preemption import PreemptionReport
from hybridtrain.workspace import Workspace

LOG_FILE = "log"
WORKDIR = "work"
TAIL_LINES = 40

# Run as ``python -c`` in front of torchrun: ask the kernel for SIGTERM when the parent thread dies
# (Linux; elsewhere a no-op), leave at once if it already has, then become torchrun.
_ORPHAN_GUARD = """\
import ctypes, os, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(143)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def local_argv(bundle_dir: Path, nproc: int, *, preemptions_per_hour: float | None = None) -> list[str]:
    """The command that trains a bundle here: torchrun with ``nproc`` processes, behind the orphan guard."""
    command = torchrun_command(sys.executable, str(bundle_dir), ["--standalone", f"--nproc_per_node={nproc}"],
                               preemptions_per_hour=preemptions_per_hour)
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *command[1:]]


def local_train(
    ws: Workspace,
    spec: JobSpec,
    approved: DatasetVersion,
    site: Site,
    run_key: str,
    job_id: str,
    on_line: Callable[[str], None],
    *,
    nproc: int,
    devices: Sequence[str] | None = None,
    mlflow_run_id: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    preemptions_per_hour: float | None = None,
    timeout: float | None = None,
    poll_interval: float = 0.5,
) -> TrainResultFiles:
    """Train ``spec`` at ``site`` on this machine with ``nproc`` processes and return the result files.

    ``devices`` (GPU names for ``CUDA_VISIBLE_DEVICES``, from ``LocalGpus.claim``) limit the job to
    the GPUs it holds. Raises ``Preempted`` when it stopped for ``should_stop`` after storing its
    checkpoint, RemoteJobFailed when it failed or ran past ``timeout``.
    """
    limit = timeout if timeout is not None else spec.resources.max_hours * 3600 + SETUP_ALLOWANCE_S
    label = f"{socket.gethostname()} (the worker's machine)"
    job_dir = ws.state_dir / "jobs" / job_id
    shutil.rmtree(job_dir, ignore_errors=True)  # an earlier attempt's files; its checkpoints are in the store
    job_dir.mkdir(parents=True)
    bundle_dir = JobBundle(
        job_id=job_id, code_version=code_version(ws.root), spec=spec.to_dict(), approved=approved,
        site=portable_site(ws, site), workdir=str(job_dir / WORKDIR), run_key=run_key, mlflow_run_id=mlflow_run_id,
    ).write(job_dir / "bundle")
    shutdown_s = math.ceil(spec.checkpoint.preemption_grace_s) + SHUTDOWN_MARGIN_S
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_s),
           "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
           # The job imports this very hybridtrain, installed or not.
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(hybridtrain.__file__).parent.parent),
                                                       os.environ.get("PYTHONPATH")]))}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    on_line(f"hybridtrain: job {job_id} starting on {label}: {nproc} process(es)"
            + (f" on GPU(s) {','.join(devices)}" if devices else ""))
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    try:
        # The job writes its own log file, not a pipe to this process: if this process dies, the job's
        # next line must not fail on a broken pipe before it has stored its checkpoint.
        with open(job_dir / LOG_FILE, "wb") as log_file:
            proc = subprocess.Popen(local_argv(bundle_dir, nproc, preemptions_per_hour=preemptions_per_hour),
                                    cwd=job_dir, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        status, why = _follow(proc, job_dir / LOG_FILE, tail, on_line, should_stop, limit, shutdown_s,
                              poll_interval)
        if why:  # stopped for running too long: a failure, even if it stored a checkpoint on the way out
            raise RemoteJobFailed(job_id, label, status, "\n".join(tail), hint=why)
        if status != 0:
            preempted = PreemptionReport.read(bundle_dir)
            if preempted is not None:
                on_line(f"hybridtrain: job {job_id} was preempted at step {preempted.step} (exit status {status}); "
                        f"checkpoint {preempted.checkpoint}")
                raise preempted.error(site=site.name)
            reported = first_error({p.name: p.read_text(errors="replace") for p in bundle_dir.glob(ERROR_FILES)})
            raise RemoteJobFailed(job_id, label, status, "\n".join(tail),
                                  hint=f"it reported: {reported}" if reported else "")
        result_dir = bundle_dir / RESULT_DIR
        for name in (MODEL_FILE, FEATURIZER_FILE, RESULT_FILE):
            if not (result_dir / name).is_file():
                raise RemoteJobFailed(job_id, label, status, "\n".join(tail), hint=f"it left no {RESULT_DIR}/{name}")
        result = HostResult.model_validate_json((result_dir / RESULT_FILE).read_text())
        return TrainResultFiles(job_id=job_id, host=label, directory=result_dir, result=result)
    finally:
        (bundle_dir / SECRETS_FILE).unlink(missing_ok=True)
        shutil.rmtree(job_dir / WORKDIR, ignore_errors=True)


def _follow(proc: subprocess.Popen[bytes], log_path: Path, tail: deque[str], on_line: Callable[[str], None],
            should_stop: Callable[[], bool] | None, limit: float, shutdown_s: float,
            poll_interval: float) -> tuple[int, str]:
    """Pass the job's log lines on as they are written, until it ends; (exit status, why we stopped it or "")."""
    deadline = time.monotonic() + limit
    why, stopped_at, partial = "", None, ""

    def emit(text: str, *, final: bool = False) -> None:
        nonlocal partial
        *lines, partial = (partial + text).split("\n")
        if final and partial:
            lines, partial = [*lines, partial], ""
        for line in lines:
            tail.append(line)
            on_line(line)

    try:
        with open(log_path, errors="replace") as log:
            while True:
                chunk = log.read()
                ended = proc.poll() is not None
                if chunk:
                    emit(chunk)
                if ended:
                    emit(log.read(), final=True)  # what it wrote between the read and its end
                    break
                now = time.monotonic()
                if stopped_at is None and should_stop is not None and should_stop():
                    on_line(f"hybridtrain: preemption notice: stopping job (pid {proc.pid}) after its checkpoint")
                    proc.send_signal(signal.SIGTERM)
                    stopped_at = now
                elif stopped_at is None and now > deadline:
                    why = f"it was still running after {limit:g} s (resources.max_hours plus setup) and was stopped"
                    proc.send_signal(signal.SIGTERM)
                    stopped_at = now
                elif stopped_at is not None and now > stopped_at + shutdown_s + SHUTDOWN_MARGIN_S:
                    _kill_group(proc)
                if not chunk:
                    time.sleep(poll_interval)
    except BaseException:  # the caller is going away (cancelled, interrupted): the job goes with it
        _stop(proc, shutdown_s)
        raise
    return proc.wait(), why


def _stop(proc: subprocess.Popen[bytes], shutdown_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=shutdown_s + SHUTDOWN_MARGIN_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun and its workers (its own process group) when the grace for SIGTERM is spent."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
