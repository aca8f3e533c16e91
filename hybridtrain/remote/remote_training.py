"""RemoteTraining: one training job run on an on-prem host over SSH — bundle up, torchrun there, result files back.

``ssh_train`` is the executor behind the train stage for sites with SSH hosts. An example:

1. It connects to the host (pinned host key, the block's private key) and looks for job
   ``job_id`` there. None yet: it writes the JobBundle (spec, approved dataset pointer, site
   with its store, run key), uploads it to ``<workdir>/jobs/<job_id>/bundle`` and launches
   ``<python> -m torch.distributed.run --standalone --nproc_per_node=<the job's gpus, or 1> -m
   hybridtrain.remote.host_training <bundle>`` detached.
2. It follows the job's log line by line into ``on_line`` (the Prefect run logger). The network
   drops for a few seconds: the job keeps training; the executor reconnects, re-attaches and
   continues at the byte where it stopped.
3. The flow process itself dies and Prefect retries the task: the retry finds job ``job_id``
   still running and attaches to it instead of starting a second one. Had the job failed, the
   retry would move the failed job aside and launch again; training resumes from the newest
   checkpoint of ``run_key`` in the site's store.
4. Exit status 0: ``result.json``, ``model.pt`` and ``featurizer.json`` are downloaded and
   returned as TrainResultFiles, for the caller to log the model to MLflow. Non-zero:
   RemoteJobFailed with the status, the job's own error message and the last lines of the log.
   Either way the bundle's secrets file is deleted from the host once the job has ended.
5. The host is told to give the GPUs back (spot notice, pool shutdown: SIGTERM to the job):
   torchrun passes the signal on, the workers finish their step, rank 0 writes a checkpoint and
   ``preempted.json``, the workers exit 75 and torchrun 1. The executor finds the report and
   raises ``Preempted(job, step, checkpoint, site=...)`` — a preemption, not a failure; calling
   ``ssh_train`` again (same job id: the ended attempt is moved aside) resumes from that
   checkpoint, and so does a run on another site after ``CheckpointStore.copy_latest``.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import SecretStr

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import RemoteJobFailed, TransientError
from hybridtrain.placement.node_fit import visible_devices
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
from hybridtrain.remote.ssh_site import SshSite, Timeouts
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import LocalStore, Site, SshHost
from hybridtrain.tracking.lineage import code_version
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.model import TabularMLP
from hybridtrain.training.preemption import REPORT_FILE, PreemptionReport
from hybridtrain.training.trainer import TrainResult
from hybridtrain.workspace import Workspace

log = logging.getLogger(__name__)

# Time for connecting, fetching data and starting torchrun, on top of the spec's max_hours.
SETUP_ALLOWANCE_S = 900.0
# How much longer than the preemption grace torchrun waits for its workers before SIGKILL.
SHUTDOWN_MARGIN_S = 5


@dataclass(frozen=True)
class TrainResultFiles:
    """The result of a remote training job, downloaded: ``result.json``, ``model.pt``, ``featurizer.json``."""

    job_id: str
    host: str
    directory: Path
    result: HostResult

    @property
    def model_path(self) -> Path:
        return self.directory / MODEL_FILE

    @property
    def featurizer_path(self) -> Path:
        return self.directory / FEATURIZER_FILE

    def model(self) -> TabularMLP:
        """The trained network on the CPU, in eval mode."""
        blob = torch.load(self.model_path, map_location="cpu", weights_only=True)
        model = TabularMLP.from_config(blob["config"])
        model.load_state_dict(blob["state_dict"])
        return model.eval()

    def featurizer(self) -> dict[str, Any]:
        """The fitted featurizer (``Featurizer.to_dict()`` form)."""
        return json.loads(self.featurizer_path.read_text())

    def train_result(self) -> TrainResult:
        """The same TrainResult an in-process ``Trainer.fit`` returns (timings are the host's)."""
        r = self.result
        return TrainResult(
            model=self.model(), featurizer=Featurizer.from_dict(self.featurizer()), history=r.history,
            global_step=r.global_step, epochs_completed=r.epochs_completed, resumed_from_step=r.resumed_from_step,
            checkpoints_written=r.checkpoints_written, last_checkpoint=r.last_checkpoint, seconds=r.seconds,
            samples_per_second=r.samples_per_second, best_epoch=r.best_epoch, best_val_metric=r.best_val_metric,
            checkpoint_seconds=r.checkpoint_seconds,
        )


def torchrun_argv(host: SshHost, bundle_dir: str, nproc_per_node: int, *,
                  preemptions_per_hour: float | None = None) -> list[str]:
    """The command that trains a bundle on ``host``: ``nproc_per_node`` processes, one per GPU of the job."""
    return torchrun_command(host.python, bundle_dir, ["--standalone", f"--nproc_per_node={nproc_per_node}"],
                            preemptions_per_hour=preemptions_per_hour)


def portable_site(ws: Workspace, site: Site) -> Site:
    """``site`` with a local store path made absolute (relative paths mean nothing on the host)."""
    if isinstance(site.store, LocalStore):
        return site.model_copy(update={"store": LocalStore(path=site.store_url(ws.root))})
    return site


def attach_or_retire(remote: SshSite, job_id: str, emit: Callable[[str], None], relaunch_note: str) -> Any:
    """Job ``job_id`` on ``remote`` to attach to: a running or finished earlier attempt; None when there is
    none, or when it failed (it is moved aside and the caller launches again)."""
    job = remote.find(job_id)
    if job is None:
        return None
    try:
        status = remote.poll(job)
        ended = f"ended with status {status}"
    except RemoteJobFailed:
        status, ended = -1, "vanished without an exit status"
    if status not in (None, 0):
        aside = remote.retire(job)
        emit(f"hybridtrain: earlier attempt of job {job_id} {ended}; moved to {aside}, launching again ({relaunch_note})")
        return None
    emit(f"hybridtrain: job {job_id} already {'running' if status is None else 'finished'} on {remote.label}; "
         "attaching")
    return job


def ssh_train(
    ws: Workspace,
    spec: JobSpec,
    approved: DatasetVersion,
    site: Site,
    host: SshHost,
    private_key: str | SecretStr,
    known_hosts: str,
    run_key: str,
    job_id: str,
    on_line: Callable[[str], None] | None = None,
    *,
    mlflow_run_id: str | None = None,
    nproc_per_node: int | None = None,
    poll_interval: float = 1.0,
    timeout: float | None = None,
    timeouts: Timeouts = Timeouts(),
    preemptions_per_hour: float | None = None,
    devices: Mapping[str, Sequence[int]] | None = None,
) -> TrainResultFiles:
    """Train ``spec`` on ``host`` of ``site`` as job ``job_id`` and bring the result files back.

    ``on_line`` gets every line the job prints (default: this module's logger). ``timeout``
    bounds the wait for the job (default ``resources.max_hours`` plus a setup allowance); past
    it the job is cancelled and RemoteJobFailed raised. Raises SiteUnavailable when the host
    cannot be reached, HostKeyRejected / AuthRefused for a wrong block, RemoteJobFailed when the
    job fails, and Preempted (step, checkpoint key, site) when it stopped for a preemption notice
    after writing its checkpoint. ``preemptions_per_hour`` (the site's observed rate) goes to the
    trainer for ``checkpoint.auto_interval``. ``devices`` (``host_key`` → GPU indices, the GPUs held for
    the job) limit it to its GPUs there (``CUDA_VISIBLE_DEVICES``); a CPU job (``resources.gpus: 0``) sees
    none. It runs ``nproc_per_node`` processes (default: one per GPU of the job, at least one). Result files
    land in ``<workspace>/.hybridtrain/jobs/<job_id>/result``.
    """
    emit = on_line or (lambda line: log.info("[%s] %s", job_id, line))
    limit = timeout if timeout is not None else spec.resources.max_hours * 3600 + SETUP_ALLOWANCE_S
    local = ws.state_dir / "jobs" / job_id
    with SshSite(host, private_key, known_hosts, site=site.name, timeouts=timeouts) as remote:
        job = attach_or_retire(remote, job_id, emit, "training resumes from its newest checkpoint")
        if job is None:
            bundle = JobBundle(
                job_id=job_id, code_version=code_version(ws.root), spec=spec.to_dict(), approved=approved,
                site=portable_site(ws, site), workdir=remote.workdir, run_key=run_key, mlflow_run_id=mlflow_run_id,
            )
            # Staged in a private temp dir, so the store's credentials do not stay on this disk.
            with tempfile.TemporaryDirectory(prefix=f"hybridtrain-{job_id}-") as staging:
                remote_bundle = remote.upload_dir(bundle.write(Path(staging) / "bundle"),
                                                  f"{remote.job_dir(job_id)}/bundle")
            # torchrun passes a SIGTERM (here also a SIGUSR1) on to its workers and SIGKILLs them
            # after TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds: give them the spec's grace to store
            # their checkpoint. (Launchers without these settings ignore the variables.)
            shutdown_s = math.ceil(spec.checkpoint.preemption_grace_s) + SHUTDOWN_MARGIN_S
            job = remote.launch(
                job_id, torchrun_argv(host, remote_bundle, nproc_per_node or max(1, spec.resources.gpus),
                                      preemptions_per_hour=preemptions_per_hour),
                workdir=remote.job_dir(job_id),
                env={"PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1",
                     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_s),
                     "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                     **visible_devices(devices, host, cpu_only=spec.resources.gpus == 0)},
            )
        try:
            remote.stream(job, emit, poll_interval=poll_interval, timeout=limit)
        except RemoteJobFailed as exc:
            _forget_secrets(remote, job.dir)
            preempted = _preemption_report(remote, job.dir)
            if preempted is not None:
                emit(f"hybridtrain: job {job_id} on {remote.label} was preempted at step {preempted.step} "
                     f"(exit status {exc.exit_status}); checkpoint {preempted.checkpoint}")
                raise preempted.error(site=site.name) from None
            # Under torchrun the log ends with the launcher's traceback; the job's own message is in a file.
            reported = first_error(_error_files(remote, job.dir))
            if not reported:
                raise
            raise RemoteJobFailed(job_id, remote.label, exc.exit_status, exc.log_tail,
                                  hint=f"it reported: {reported}") from None
        except TransientError:
            status = remote.cancel(job)
            _forget_secrets(remote, job.dir)
            raise RemoteJobFailed(job_id, remote.label, status, remote.tail_text(job.log),
                                  hint=f"it was still running after {limit:g} s (resources.max_hours is "
                                       f"{spec.resources.max_hours:g}) and was cancelled") from None
        _forget_secrets(remote, job.dir)
        result_dir = local / RESULT_DIR
        remote_result = f"{job.dir}/bundle/{RESULT_DIR}"
        for name in (MODEL_FILE, FEATURIZER_FILE, RESULT_FILE):
            remote.download(f"{remote_result}/{name}", result_dir / name)
        result = HostResult.model_validate_json((result_dir / RESULT_FILE).read_text())
        return TrainResultFiles(job_id=job_id, host=remote.label, directory=result_dir, result=result)


def _preemption_report(remote: SshSite, job_dir: str) -> PreemptionReport | None:
    """The job's ``preempted.json`` (written by rank 0 once its checkpoint was stored), or None."""
    try:
        with remote.sftp().open(f"{job_dir}/bundle/{REPORT_FILE}", "r") as fh:
            return PreemptionReport.model_validate_json(fh.read())
    except FileNotFoundError:
        return None


def _error_files(remote: SshSite, job_dir: str) -> dict[str, str]:
    """The ranks' ``error.<rank>.txt`` in the job's bundle on the host (name -> text)."""
    sftp, bundle = remote.sftp(), f"{job_dir}/bundle"
    out = {}
    try:
        names = [n for n in sftp.listdir(bundle) if fnmatch.fnmatch(n, ERROR_FILES)]
        for name in names:
            with sftp.open(f"{bundle}/{name}", "r") as fh:
                out[name] = fh.read().decode(errors="replace")
    except FileNotFoundError:
        pass
    return out


def _forget_secrets(remote: SshSite, job_dir: str) -> None:
    """Remove the bundle's secrets file from the host once the job has ended (it read them at start)."""
    try:
        remote.sftp().remove(f"{job_dir}/bundle/{SECRETS_FILE}")
    except FileNotFoundError:
        return  # removed after an earlier attempt, or never written
