"""MultiNodeTraining: one training job over N SSH hosts of a site — torchrun on each, c10d rendezvous, DDP, restarts from the checkpoint.

``ssh_train_nodes`` is the executor for ``resources.nodes > 1`` (the hosts come from
``placement.node_fit.reserve_hosts``). An example with two hosts ``gpu1`` and ``gpu2``:

1. It asks ``gpu1`` (the rendezvous host) for a free TCP port, uploads the same JobBundle to
   ``<workdir>/jobs/<job_id>/bundle`` on both hosts and launches, detached, on each::

       <python> -m torch.distributed.run --nnodes=2 --nproc_per_node=<gpus or 1>
           --rdzv_backend=c10d --rdzv_endpoint=gpu1:<port> --rdzv_id=<job_id>-a<attempt>
           --rdzv_conf=is_host=<1 on gpu1> --local_addr=<this host> --max_restarts=0
           -m hybridtrain.remote.host_training <bundle>

   The agents meet at the rendezvous, hand out ranks and start the workers: DDP with NCCL on
   GPUs, gloo on CPUs (``training.distributed``). Every global batch is split over all ranks;
   rank 0 — on whichever host the rendezvous put it — writes the checkpoints to the site's store
   and the result files to its own bundle directory. Each host fetches its own data copy.
2. It follows every host's log (lines prefixed ``[node i]``) until all jobs end.
3. ``gpu2`` dies (its torchrun killed, the machine gone): its job ends without a status, the
   ranks on ``gpu1`` fail on the next all-reduce. The executor cancels what is left on every host
   (SIGTERM, then SIGKILL), moves the attempts aside and launches all nodes again with a new
   rendezvous id; the trainer resumes every rank from the newest verified checkpoint. After
   ``restarts`` relaunches it gives up with ``RemoteJobFailed`` (retryable when the last failure
   was a lost node) — a Prefect retry starts again from the checkpoint, on these hosts or, after
   re-placement, others.
4. A preemption notice (SIGTERM to the jobs) reaches every rank; they agree to stop after the
   same step, rank 0 stores the checkpoint and ``preempted.json`` and all exit 75. The executor
   finds the report on rank 0's host and raises ``Preempted`` — not restarted here.
5. All jobs exit 0: the result files are downloaded from the host whose bundle holds them.

The checkpoint store must be one every host reaches (S3, or one shared filesystem path): every
rank reads the checkpoint it resumes from. A job id still present on a host from an earlier
call is cancelled and moved aside first — multi-node attempts are relaunched, never re-attached.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from pydantic import SecretStr

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import Preempted, RemoteJobFailed
from hybridtrain.placement.node_fit import visible_devices
from hybridtrain.remote.host_training import (
    FEATURIZER_FILE,
    MODEL_FILE,
    RESULT_DIR,
    RESULT_FILE,
    HostResult,
    torchrun_command,
)
from hybridtrain.remote.job_bundle import SECRETS_FILE, JobBundle
from hybridtrain.remote.remote_training import SETUP_ALLOWANCE_S, SHUTDOWN_MARGIN_S, TrainResultFiles, portable_site
from hybridtrain.remote.ssh_site import RemoteJob, SshSite, Timeouts
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import Site, SshHost
from hybridtrain.tracking.lineage import code_version
from hybridtrain.training.preemption import REPORT_FILE, PreemptionReport
from hybridtrain.workspace import Workspace

log = logging.getLogger(__name__)

FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def torchrun_nodes_argv(host: SshHost, bundle_dir: str, *, nodes: int, nproc_per_node: int, endpoint: str,
                        rdzv_id: str, is_host: bool, preemptions_per_hour: float | None = None) -> list[str]:
    """The command one node of a multi-node job runs: torchrun joining the c10d rendezvous at ``endpoint``.

    ``is_host``: this node serves the rendezvous store (said explicitly: torchrun's guess from the
    hostname fails behind NAT, and on one machine every node would claim it).
    """
    launch = [f"--nnodes={nodes}", f"--nproc_per_node={nproc_per_node}",
              "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={rdzv_id}",
              f"--rdzv_conf=is_host={'1' if is_host else '0'}",
              f"--local_addr={host.hostname}", "--max_restarts=0"]
    return torchrun_command(host.python, bundle_dir, launch, preemptions_per_hour=preemptions_per_hour)


class _Node:
    """One host of the job: a connection for following its log and one for commands."""

    def __init__(self, index: int, host: SshHost, private_key: str | SecretStr, known_hosts: str, site: str,
                 timeouts: Timeouts):
        self.index = index
        self.host = host
        self.follow = SshSite(host, private_key, known_hosts, site=site, timeouts=timeouts)
        self.control = SshSite(host, private_key, known_hosts, site=site, timeouts=timeouts)
        self.job: RemoteJob | None = None

    def connect(self) -> None:
        self.follow.connect()
        self.control.connect()

    def close(self) -> None:
        self.follow.close()
        self.control.close()


def ssh_train_nodes(
    ws: Workspace,
    spec: JobSpec,
    approved: DatasetVersion,
    site: Site,
    hosts: Sequence[SshHost],
    private_key: str | SecretStr,
    known_hosts: str,
    run_key: str,
    job_id: str,
    on_line: Callable[[str], None] | None = None,
    *,
    mlflow_run_id: str | None = None,
    nproc_per_node: int | None = None,
    restarts: int = 2,
    poll_interval: float = 1.0,
    timeout: float | None = None,
    timeouts: Timeouts | None = None,
    preemptions_per_hour: float | None = None,
    on_launch: Callable[[int, list[RemoteJob]], None] | None = None,
    devices: Mapping[str, Sequence[int]] | None = None,
) -> TrainResultFiles:
    """Train ``spec`` on all ``hosts`` of ``site`` together as job ``job_id``; bring rank 0's result files back.

    ``hosts[0]`` hosts the rendezvous. A node lost mid-run stops every node and relaunches them
    all (up to ``restarts`` times), resuming from the newest checkpoint. ``on_launch(attempt,
    jobs)`` is called after each launch (tests use it to find the processes). Raises
    ``Preempted`` for a preemption notice, ``RemoteJobFailed`` when a job fails for another
    reason or the restarts are used up, SiteUnavailable / HostKeyRejected / AuthRefused from
    the connections. ``devices`` (``host_key`` → GPU indices, the GPUs held for the job) limit
    each node to its GPUs (``CUDA_VISIBLE_DEVICES``).
    """
    if len(hosts) < 2:
        raise ValueError("give two hosts or more (one host: remote_training.ssh_train)")
    emit = on_line or (lambda line: log.info("[%s] %s", job_id, line))
    limit = timeout if timeout is not None else spec.resources.max_hours * 3600 + SETUP_ALLOWANCE_S
    nproc = nproc_per_node if nproc_per_node is not None else max(1, spec.resources.gpus)
    deadline = time.monotonic() + limit
    nodes = [_Node(i, h, private_key, known_hosts, site.name, timeouts or Timeouts()) for i, h in enumerate(hosts)]
    try:
        for node in nodes:
            node.connect()
        for node in nodes:
            _clear(node, emit)
        attempt = 0
        while True:
            failure = _attempt(ws, spec, approved, site, nodes, run_key, job_id, attempt, nproc, emit,
                               mlflow_run_id, poll_interval, deadline, preemptions_per_hour, on_launch, devices)
            if failure is None:
                return _collect(ws, nodes, job_id)
            if isinstance(failure, Preempted) or attempt >= restarts:
                raise failure
            attempt += 1
            how = "lost" if failure.exit_status is None else f"failed with exit status {failure.exit_status}"
            emit(f"hybridtrain: job {job_id} {how} on {failure.host}; all "
                 f"{len(nodes)} nodes stopped, relaunching (attempt {attempt + 1} of {restarts + 1}) from the "
                 "newest checkpoint")
            for node in nodes:
                _clear(node, emit)
    finally:
        for node in nodes:
            node.close()


def _clear(node: _Node, emit: Callable[[str], None]) -> None:
    """Cancel and move aside whatever ran under this job id on the node, so it can be launched again."""
    remote = node.control
    job = remote.find(node.job.job_id) if node.job is not None else None
    if job is None:
        return
    try:
        running = remote.poll(job) is None
    except RemoteJobFailed:
        running = False  # gone without a status
    if running:
        remote.cancel(job)
    emit(f"hybridtrain: moved attempt on {remote.label} to {remote.retire(job)}")
    node.job = None


def _attempt(ws, spec, approved, site, nodes, run_key, job_id, attempt, nproc, emit, mlflow_run_id,
             poll_interval, deadline, preemptions_per_hour, on_launch,
             devices=None) -> RemoteJobFailed | Preempted | None:
    """Launch every node, follow them all; None when all succeeded, else the error to raise or recover from."""
    head = nodes[0].control
    for node in nodes:
        existing = node.control.find(job_id)
        if existing is not None:
            node.job = existing
            _clear(node, emit)
    status, out = head.run([nodes[0].host.python, "-c", FREE_PORT])
    if status != 0:
        return RemoteJobFailed(job_id, head.label, status, out, hint="could not pick a rendezvous port there")
    endpoint = f"{nodes[0].host.hostname}:{int(out.strip().splitlines()[-1])}"
    shutdown_s = math.ceil(spec.checkpoint.preemption_grace_s) + SHUTDOWN_MARGIN_S
    env = {"PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_s),
           "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"}
    for node in nodes:
        remote = node.control
        bundle = JobBundle(job_id=job_id, code_version=code_version(ws.root), spec=spec.to_dict(), approved=approved,
                           site=portable_site(ws, site), workdir=remote.workdir, run_key=run_key,
                           mlflow_run_id=mlflow_run_id)
        with tempfile.TemporaryDirectory(prefix=f"hybridtrain-{job_id}-") as staging:
            remote_bundle = remote.upload_dir(bundle.write(Path(staging) / "bundle"), f"{remote.job_dir(job_id)}/bundle")
        argv = torchrun_nodes_argv(node.host, remote_bundle, nodes=len(nodes), nproc_per_node=nproc,
                                   endpoint=endpoint, rdzv_id=f"{job_id}-a{attempt}", is_host=node.index == 0,
                                   preemptions_per_hour=preemptions_per_hour)
        node.job = remote.launch(job_id, argv, workdir=remote.job_dir(job_id),
                                 env={**env, **visible_devices(devices, node.host,
                                                                cpu_only=spec.resources.gpus == 0)})
    emit(f"hybridtrain: job {job_id} launched on {len(nodes)} nodes "
         f"({', '.join(n.control.label for n in nodes)}), rendezvous at {endpoint}")
    if on_launch is not None:
        on_launch(attempt, [n.job for n in nodes])
    outcome = _follow(nodes, emit, poll_interval, deadline, job_id)
    for node in nodes:
        _forget_secrets(node)
    if outcome is None:
        return None
    for node in nodes:  # a preemption report on any node (rank 0's) means a notice, not a lost node
        report = _preemption_report(node)
        if report is not None:
            emit(f"hybridtrain: job {job_id} was preempted at step {report.step}; checkpoint {report.checkpoint}")
            return report.error(site=site.name)
    return outcome


def _follow(nodes: list[_Node], emit: Callable[[str], None], poll_interval: float, deadline: float,
            job_id: str) -> RemoteJobFailed | None:
    """Stream every node's log until all end; at the first failure, cancel the others. None when all exited 0."""
    lock = threading.Lock()

    def say(i: int) -> Callable[[str], None]:
        def line(text: str) -> None:
            with lock:
                emit(f"[node {i}] {text}")
        return line

    def follow(node: _Node) -> int | None:
        try:
            return node.follow.stream(node.job, say(node.index), poll_interval=poll_interval,
                                      timeout=max(1.0, deadline - time.monotonic()), check=False)
        except RemoteJobFailed:
            return None  # ended without an exit status: the node (or its launcher) is gone

    failure: RemoteJobFailed | None = None
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix=f"follow-{job_id}") as pool:
        running: dict[Future, _Node] = {pool.submit(follow, n): n for n in nodes}
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                node = running.pop(fut)
                status = fut.result()  # TransientError (past the deadline) / SiteUnavailable propagate
                if status == 0 or failure is not None:
                    continue
                remote = node.control
                failure = RemoteJobFailed(job_id, remote.label, status, remote.tail_text(node.job.log),
                                          hint="its node was lost" if status is None else "")
                failure.retryable = True  # the checkpoint survives: relaunching resumes from it
                for other in running.values():  # the other ranks cannot go on without this one
                    other.control.cancel(other.job)
    return failure


def _preemption_report(node: _Node) -> PreemptionReport | None:
    try:
        with node.control.sftp().open(f"{node.job.dir}/bundle/{REPORT_FILE}", "r") as fh:
            return PreemptionReport.model_validate_json(fh.read())
    except FileNotFoundError:
        return None


def _forget_secrets(node: _Node) -> None:
    try:
        node.control.sftp().remove(f"{node.job.dir}/bundle/{SECRETS_FILE}")
    except FileNotFoundError:
        return


def _collect(ws: Workspace, nodes: list[_Node], job_id: str) -> TrainResultFiles:
    """Download the result files from the node whose bundle holds them (the one rank 0 ran on)."""
    local = ws.state_dir / "jobs" / job_id / RESULT_DIR
    for node in nodes:
        remote_result = f"{node.job.dir}/bundle/{RESULT_DIR}"
        if not node.control.exists(f"{remote_result}/{RESULT_FILE}"):
            continue
        for name in (MODEL_FILE, FEATURIZER_FILE, RESULT_FILE):
            node.control.download(f"{remote_result}/{name}", local / name)
        result = HostResult.model_validate_json((local / RESULT_FILE).read_text())
        return TrainResultFiles(job_id=job_id, host=node.control.label, directory=local, result=result)
    raise RemoteJobFailed(job_id, ", ".join(n.control.label for n in nodes), 0, "",
                          hint="every node exited 0 but none holds result files (rank 0 writes them)")


