"""RemoteRound: a data site's federated round run on the site's SSH host — round bundle up, the host trains, its report back.

``ssh_train_round`` is what ``site.train_round`` calls for a data site that lists SSH hosts (the
host whose GPUs the round holds, ``orchestration.gpu_lease``; the first one for a CPU job or
hosts that declare no GPUs, as a centralized job of that site would use). An example, round 2 of site ``dc2``:

1. It connects to the host (pinned host key, the site block's key) and looks for job
   ``<job>-<run_key>-r0002-dc2`` there. None yet: it writes the RoundBundle (spec, the pointer to
   dc2's approved part, dc2 and the aggregation site with their stores, round 2, the global
   featurizer), uploads it to ``<workdir>/jobs/<job_id>/bundle`` and launches
   ``<python> -m hybridtrain.federated.host_round <bundle>`` detached.
2. It follows the job's log into ``on_line``; a dropped connection is re-established and the
   log continues where it stopped (``SshSite.stream``).
3. The host fetches the approved part from dc2's store, the global model of round 1 from the
   round store, trains, and writes the update to the round store itself. Exit status 0: only
   ``round.json`` (RoundReport: rows, metrics, epsilon, sha256, crossings) is downloaded. Non-zero:
   RemoteJobFailed with the job's own message — the site drops out of the round like any other
   failure, and is asked again next round.
4. Called again for the same round (a retried flow run): a job that finished is attached to and
   its report read, a job still running is followed, a failed one is moved aside and launched again.

The bundle's secrets file (store keys) is deleted from the host once the job has ended.
"""

from __future__ import annotations

import logging
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import SecretStr

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import RemoteJobFailed, TransientError
from hybridtrain.federated.host_round import ENTRY_POINT, REPORT_FILE, RoundBundle, RoundReport
from hybridtrain.placement.node_fit import visible_devices
from hybridtrain.remote.host_training import ERROR_FILES
from hybridtrain.remote.job_bundle import SECRETS_FILE
from hybridtrain.remote.remote_training import SETUP_ALLOWANCE_S, attach_or_retire, portable_site
from hybridtrain.remote.ssh_site import SshSite, Timeouts
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import Site, SshHost
from hybridtrain.tracking.lineage import code_version
from hybridtrain.workspace import Workspace

log = logging.getLogger(__name__)


def round_job_id(job: str, run_key: str, rnd: int, site: str) -> str:
    """The host's name for one site's round: the same round of the same run re-attaches."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{job}-{run_key}-r{rnd:04d}-{site}")[-128:].lstrip("._-")


def ssh_train_round(ws: Workspace, spec: JobSpec, site: Site, aggregation_site: Site, host: SshHost,
                    private_key: str | SecretStr, known_hosts: str, run_key: str, rnd: int, approved: DatasetVersion,
                    featurizer: dict, on_line: Callable[[str], None] | None = None, *,
                    poll_interval: float = 0.5, timeout: float | None = None,
                    keep_at_site: bool = False,
                    devices: Mapping[str, Sequence[int]] | None = None) -> tuple[RoundReport, str]:
    """Round ``rnd`` of ``site`` on ``host``; returns the host's report and the host's label (``user@host:port``).
    ``keep_at_site`` (secure aggregation): the host keeps the update in the site's own store instead of sending it.
    ``devices`` (``host_key`` → GPU indices, the GPUs held for the round) limit the round to its GPUs
    (``CUDA_VISIBLE_DEVICES``); it trains on the first of them when CUDA is there.

    Raises SiteUnavailable when the host cannot be reached, HostKeyRejected / AuthRefused for a
    wrong block, RemoteJobFailed when the job fails or outlives ``timeout`` (default
    ``resources.max_hours`` plus a setup allowance; it is then cancelled).
    """
    job_id = round_job_id(spec.name, run_key, rnd, site.name)
    emit = on_line or (lambda line: log.info("[%s] %s", job_id, line))
    limit = timeout if timeout is not None else spec.resources.max_hours * 3600 + SETUP_ALLOWANCE_S
    timeouts = Timeouts(connect=host.connect_timeout_s, command=host.command_timeout_s, reconnect=host.reconnect_s)
    with SshSite(host, private_key, known_hosts, site=site.name, timeouts=timeouts) as remote:
        job = attach_or_retire(remote, job_id, emit, "the round trains again from its global model")
        if job is None:
            bundle = RoundBundle(
                job_id=job_id, code_version=code_version(ws.root), spec=spec.to_dict(), approved=approved,
                site=portable_site(ws, site), workdir=remote.workdir, run_key=run_key, round=rnd,
                featurizer=featurizer, aggregation_site=portable_site(ws, aggregation_site),
                keep_at_site=keep_at_site)
            # Staged in a private temp dir, so the stores' credentials do not stay on this disk.
            with tempfile.TemporaryDirectory(prefix=f"hybridtrain-{job_id}-") as staging:
                remote_bundle = remote.upload_dir(bundle.write(Path(staging) / "bundle"),
                                                  f"{remote.job_dir(job_id)}/bundle")
            job = remote.launch(job_id, [host.python, "-m", ENTRY_POINT, remote_bundle],
                                workdir=remote.job_dir(job_id),
                                env={"PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1",
                                     **visible_devices(devices, host, cpu_only=spec.resources.gpus == 0)})
        try:
            remote.stream(job, emit, poll_interval=poll_interval, timeout=limit)
        except RemoteJobFailed as exc:
            _forget_secrets(remote, job.dir)
            _, reported = remote.run(f"cat {shlex.quote(job.dir)}/bundle/{ERROR_FILES} 2>/dev/null; true")
            if not reported.strip():
                raise
            raise RemoteJobFailed(job_id, remote.label, exc.exit_status, exc.log_tail,
                                  hint=f"it reported: {reported.strip()}") from None
        except TransientError:
            status = remote.cancel(job)
            _forget_secrets(remote, job.dir)
            raise RemoteJobFailed(job_id, remote.label, status, remote.tail_text(job.log),
                                  hint=f"it was still running after {limit:g} s and was cancelled") from None
        _forget_secrets(remote, job.dir)
        local = remote.download(f"{job.dir}/bundle/{REPORT_FILE}", ws.state_dir / "jobs" / job_id / REPORT_FILE)
        return RoundReport.model_validate_json(local.read_text()), remote.label


def _forget_secrets(remote: SshSite, job_dir: str) -> None:
    """Remove the bundle's secrets file from the host once the job has ended (it read them at start)."""
    try:
        remote.sftp().remove(f"{job_dir}/bundle/{SECRETS_FILE}")
    except FileNotFoundError:
        return  # removed after an earlier attempt, or never written
