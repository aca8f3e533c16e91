"""Training stage: fit at the placed site (on the worker's machine, on SSH hosts, or on cloud instances it starts) from its newest checkpoint, and move checkpoints between sites."""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import TransferRecord, egress_cost
from hybridtrain.errors import Preempted, Problem, SpecError
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import CapacityClass, S3Store, Site, SitesCatalog, SshHost
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    from hybridtrain.remote.cloud_instances import Ec2Credentials
    from hybridtrain.remote.ssh_site import SshCredentials

from hybridtrain.stages.results import TrainOutput
from hybridtrain.stages.site_access import audit, checkpoint_store, control_site, dataset_at

log = logging.getLogger(__name__)

#: Added to a job's ``max_hours`` and its instances' boot time in their ``hybridtrain:expires`` tag: the
#: time to save the last checkpoint and log the model before ``recover-runs`` may terminate them.
INSTANCE_GRACE = timedelta(minutes=30)
ENDED_RUN_STATES = ("FINISHED", "FAILED", "KILLED")
#: What a run key may be: the characters job ids on SSH hosts and object keys allow (a flow run id, an MLflow run id,
#: ``nightly-2026-12-02``), starting with a letter or digit, so that no ``/``, ``.`` or ``..`` reaches a store's keys.
RUN_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_key(run_key: str | None, field: str = "run_key") -> None:
    """Refuse a run key that could not name a checkpoint series, naming ``field`` (the caller's name for it).

    ``None`` (the run picks its own key) passes. Checked before a run starts: the store's own key check
    (``storage.object_store.check_key``) would catch ``../x`` only at the first checkpoint, after the data
    was prepared and synced and training ran that far.
    """
    if run_key is None or RUN_KEY_RE.fullmatch(run_key):
        return
    shown = repr(run_key) if len(run_key) <= 80 else f"{run_key[:77]!r}... ({len(run_key)} characters)"
    raise SpecError("parameters", [Problem(field, (
        f"{shown} is not a run key; use up to 128 letters, digits, . _ - starting with a letter or digit "
        "(e.g. the flow run id of the run to resume)"))])


def train(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, run_id: str, run_key: str,
          *, ssh: SshCredentials | None = None, on_line: Callable[[str], None] | None = None,
          should_stop: Callable[[], bool] | None = None,
          preemptions_per_hour: float | None = None,
          on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
          capacity_class: str | None = None, gpus: Mapping[str, Sequence[int]] | None = None) -> TrainOutput:
    """Train at ``site`` on its copy of the approved data; checkpoints go to that site's store.

    ``run_key`` names the checkpoint series: a retry or a resubmission of the same run resumes
    from its newest valid checkpoint; a new run starts fresh.

    With ``ssh`` (the site block's private key and known_hosts) training runs on the site's
    first SSH host — or, with ``resources.nodes: N``, on N of its hosts together
    (``multinode_training.ssh_train_nodes``) — under torchrun (``remote_training.ssh_train``, job id ``<job>-<run_key>``,
    so a retry re-attaches to a job still running there), its log lines going to ``on_line``;
    without it, on this machine (``_train_on_this_machine``: in this process, or with ``resources.gpus``
    above 1 in one process per GPU under torchrun). A job of N nodes at a cloud site with ``instances:`` first
    terminates what an earlier attempt of the same job id left running, starts N instances
    (``remote.cloud_instances.provision``, pinned by the image's host key), trains on them the same
    way and terminates them whatever happens; their ids go to the MLflow tag ``cloud.instances``
    and ``TrainOutput.instances``. ``capacity_class`` is the placement's: ``opportunistic`` starts
    spot instances, any other on-demand ones (None: the site's own class decides).

    Preemption raises ``Preempted`` (step, checkpoint key, site): over SSH when the job stopped
    for a notice (SIGTERM to it) after writing its checkpoint; in this process when
    ``should_stop()`` (e.g. a ``PreemptionNotice`` entered by the main thread) said so after a
    step. Resume by calling ``train`` again with the same ``run_key`` — here, or at another site
    after ``move_checkpoint``. ``preemptions_per_hour`` (the site's observed rate) sets the
    interval of ``checkpoint.auto_interval``. ``on_epoch_end(epoch, metrics)`` hears each epoch after
    it is logged (a sweep's pruner; an exception it raises ends training there, without a model).
    ``gpus`` (``host_key`` → GPU indices) are the GPUs of the site's hosts the caller holds for it
    (``orchestration.gpu_lease``): the job trains on those hosts and sees only those GPUs
    (``CUDA_VISIBLE_DEVICES``); without them, on the first hosts, seeing every GPU.
    """
    started = time.perf_counter()
    sites = ws.load_sites()
    s = sites.get(site)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)

    shown = progress.TrainingProgress(site, spec.model.epochs, metric=f"val_{spec.evaluation.primary_metric}")

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        # Streamed while training (MLflow shows the curves as they grow), from this process or a host's lines.
        registry.log_metrics(run_id, {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=epoch)
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics)

    cloud_nodes = spec.resources.nodes > 1 and s.instances is not None
    if ssh is None and (s.hosts or cloud_nodes) and ws.secrets is not None:
        secret = ws.secrets.get(site)
        if secret is not None and secret.has_ssh:
            from hybridtrain.remote.ssh_site import SshCredentials  # lazy: heavy (paramiko)

            ssh = SshCredentials(private_key=secret.ssh_private_key, known_hosts=secret.ssh_known_hosts or "")
    if (s.hosts or cloud_nodes) and ssh is None:
        where = "on SSH hosts" if s.hosts else "on the instances it starts"
        raise SpecError("site credentials", [Problem(
            f"{site}.ssh_private_key", f"site {site} trains {where} but its block holds no SSH key: "
            f"run `hybridtrain credentials {site} --ssh-key FILE{' --known-hosts FILE' if s.hosts else ''}`")])
    if spec.resources.nodes > 1 and not s.hosts and s.instances is None:
        raise SpecError("job spec", [Problem(
            "resources.nodes", f"site {site} lists no SSH hosts and starts no instances, and a job of "
            f"{spec.resources.nodes} nodes runs on several machines: add hosts to sites.{site}.hosts (on-prem), "
            f"an instances: block to sites.{site} (cloud), or set resources.nodes: 1")])
    instance_ids: list[str] = []
    job_id = re.sub(r"[^A-Za-z0-9._-]", "-", f"{spec.name}-{run_key}")[:128]
    streamed: dict[int, set[str]] = {}

    def host_line(line: str) -> None:
        # A line of a job in other processes (an SSH host's, or torchrun's here): epoch lines feed MLflow.
        epoch_line = shown.host_line(line)
        if epoch_line is None:
            (on_line or (lambda text: log.info("[%s] %s", job_id, text)))(line)
            return
        epoch, metrics = epoch_line
        on_epoch(epoch, metrics)
        streamed.setdefault(epoch, set()).update(metrics)

    def log_rest(result: Any) -> None:
        for h in result.history:  # what the job's lines did not carry
            epoch = int(h["epoch"])
            rest = {k: v for k, v in h.items() if k not in ("epoch", "global_step") and k not in streamed.get(epoch, ())}
            if rest:
                registry.log_metrics(run_id, rest, step=epoch)

    if ssh is not None:
        from hybridtrain.remote.remote_training import ssh_train  # lazy: heavy (torch, paramiko)

        if not s.hosts and not cloud_nodes:
            raise SpecError("sites catalog", [Problem(f"sites.{site}.hosts", "SSH credentials were given but the "
                                                                              "site lists no hosts to train on")])
        from hybridtrain.placement.node_fit import held_hosts, reserve_hosts  # lazy: heavy (paramiko)
        from hybridtrain.remote.multinode_training import ssh_train_nodes  # lazy: heavy (paramiko)
        from hybridtrain.remote.ssh_site import Timeouts  # lazy: heavy (paramiko)

        def timeouts_of(host: SshHost) -> Timeouts:
            return Timeouts(connect=host.connect_timeout_s, command=host.command_timeout_s, reconnect=host.reconnect_s)

        if cloud_nodes:
            from hybridtrain.remote import cloud_instances  # lazy: heavy (boto3)

            credentials = ec2_credentials(ws, s)
            say = on_line or (lambda text: log.info("[%s] %s", job_id, text))

            def record(ids: list[str], outcome: str) -> None:
                audit(ws).append(actor=ws.actor, action="cloud_instances", subject=f"job {spec.name}",
                                 inputs={"mlflow_run_id": run_id, "run_key": run_key, "site": site, "job_id": job_id,
                                         "instance_type": s.instances.instance_type, "instances": ids},
                                 outcome=outcome)

            # A resumed attempt never pays for the machines of the one before it (killed before its cleanup).
            left = cloud_instances.terminate_orphans(s, job_id, credentials)
            if left:
                say(f"hybridtrain: terminated {', '.join(left)}, left running by an earlier attempt of job {job_id}")
                record(left, "terminated: left running by an earlier attempt")
            shown.start(f"starting {spec.resources.nodes} instances at {site}, job {job_id}")
            spot = None if capacity_class is None else capacity_class == CapacityClass.opportunistic.value
            expires = (datetime.now(UTC) + timedelta(seconds=s.instances.boot_timeout_s)
                       + timedelta(hours=spec.resources.max_hours) + INSTANCE_GRACE)
            fleet = cloud_instances.provision(s, spec.resources.nodes, job_id, credentials, spot=spot,
                                              mlflow_run=run_id, expires_at=expires)
            instance_ids = list(fleet.instance_ids)
            try:
                with fleet:
                    market = "spot" if fleet.spot else "on-demand"
                    registry.set_tags(run_id, {"cloud.instances": ",".join(instance_ids),
                                               "cloud.instance_type": s.instances.instance_type,
                                               "cloud.market": market})
                    say(f"hybridtrain: instances {', '.join(instance_ids)} are up at "
                        f"{', '.join(h.hostname for h in fleet.hosts)}")
                    files = ssh_train_nodes(ws, spec, approved, s, fleet.hosts, ssh.private_key, fleet.known_hosts,
                                            run_key, job_id, host_line, mlflow_run_id=run_id,
                                            preemptions_per_hour=preemptions_per_hour,
                                            timeouts=timeouts_of(fleet.hosts[0]))
            finally:
                record(instance_ids, "terminated" if fleet.terminated else
                       f"NOT terminated: terminate {', '.join(instance_ids)} (tag hybridtrain:job={job_id})")
        elif spec.resources.nodes > 1:
            hosts = (held_hosts(s, gpus) if gpus else
                     reserve_hosts(s, spec.resources.nodes, spec.resources.gpus, job=spec.name).hosts)
            shown.start(f"on {len(hosts)} SSH hosts ({', '.join(h.hostname for h in hosts)}), job {job_id}")
            files = ssh_train_nodes(ws, spec, approved, s, hosts, ssh.private_key, ssh.known_hosts, run_key, job_id,
                                    host_line, mlflow_run_id=run_id, preemptions_per_hour=preemptions_per_hour,
                                    timeouts=timeouts_of(s.hosts[0]), devices=gpus)
        else:
            host = held_hosts(s, gpus)[0] if gpus else s.hosts[0]
            shown.start(f"on SSH host {host.hostname}, job {job_id}")
            files = ssh_train(ws, spec, approved, s, host, ssh.private_key, ssh.known_hosts, run_key, job_id,
                              host_line, mlflow_run_id=run_id, preemptions_per_hour=preemptions_per_hour,
                              timeouts=timeouts_of(host), devices=gpus)
        result, device = files.train_result(), files.result.device
        log_rest(result)
    else:
        result, device = _train_on_this_machine(ws, sites, spec, approved, s, run_id, run_key, job_id, shown, on_epoch,
                                                host_line, log_rest, should_stop, preemptions_per_hour,
                                                on_line or (lambda text: log.info("[%s] %s", job_id, text)))
    upload_started = time.perf_counter()
    from hybridtrain.training.record_model import feature_columns

    ref = registry.log_model(run_id, result.model, result.featurizer.to_dict(), result.featurizer.n_features,
                             columns=feature_columns(spec))
    transfers = []
    control = control_site(ws, sites)
    if control.name != site:
        # The model travels from the training site to the registry at the control site.
        nbytes = registry.model_bytes(ref)
        transfers.append(TransferRecord(
            source=site, destination=control.name, what=f"model {ref.model_uri}", bytes=nbytes, files=1,
            seconds=time.perf_counter() - upload_started, egress_per_gb=s.egress_per_gb,
            cost_usd=egress_cost(nbytes, s)))
    seconds = time.perf_counter() - started
    shown.end(result.global_step, seconds, result.samples_per_second, result.resumed_from_step)
    registry.log_metrics(run_id, {"train_seconds": seconds})  # feeds the engine's duration estimates
    return TrainOutput(
        site=site,
        model_uri=ref.model_uri,
        model_id=ref.model_id,
        run_key=run_key,
        history=result.history,
        global_step=result.global_step,
        epochs_completed=result.epochs_completed,
        resumed_from_step=result.resumed_from_step,
        checkpoints_written=result.checkpoints_written,
        last_checkpoint=result.last_checkpoint.key if result.last_checkpoint else None,
        checkpoint_sha256=result.last_checkpoint.sha256 if result.last_checkpoint else None,
        checkpoint_bytes=result.last_checkpoint.size if result.last_checkpoint else 0,
        device=device,
        seconds=seconds,
        samples_per_second=result.samples_per_second,
        gpu_seconds=seconds * max(1, spec.resources.total_gpus) if device.startswith("cuda") else 0.0,
        transfers=transfers,
        instances=instance_ids,
    )


def _train_on_this_machine(ws: Workspace, sites: SitesCatalog, spec: JobSpec, approved: DatasetVersion, s: Site,
                           run_id: str,
                           run_key: str, job_id: str, shown: progress.TrainingProgress,
                           on_epoch: Callable[[int, dict[str, float]], None], host_line: Callable[[str], None],
                           log_rest: Callable[[Any], None], should_stop: Callable[[], bool] | None,
                           preemptions_per_hour: float | None, say: Callable[[str], None]) -> tuple[Any, str]:
    """Train at a site without SSH hosts, on the worker's machine: (TrainResult, device).

    On a machine with CUDA the job first claims ``resources.gpus`` of its GPUs no other job holds
    (``training.local_gpus``). One GPU (or none): in this process. Several: one process per GPU
    under torchrun (``remote.local_training``); on a machine without CUDA, as many CPU processes.
    """
    from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch)
    from hybridtrain.training.local_gpus import hold_for_job, job_device
    from hybridtrain.training.trainer import Trainer  # lazy: heavy (torch, scipy)

    n = max(1, spec.resources.gpus)
    with hold_for_job(spec.resources.gpus, job=spec.name, site=s.name, say=say) as held:
        if n > 1:
            from hybridtrain.remote.local_training import local_train  # lazy: heavy (torch)

            where = f"GPU(s) {','.join(held.names)}" if held is not None else "the CPU (no CUDA here)"
            shown.start(f"{n} processes under torchrun on this machine, {where}, job {job_id}")
            files = local_train(ws, spec, approved, s, run_key, job_id, host_line, nproc=n,
                                devices=held.names if held is not None else None, mlflow_run_id=run_id,
                                should_stop=should_stop, preemptions_per_hour=preemptions_per_hour)
            result = files.train_result()
            log_rest(result)
            return result, files.result.device
        data_dir = dataset_at(ws, sites, approved, s.name, spec.dataset.site)
        train_df = partitioned.read(data_dir, ["train"])
        val_df = partitioned.read(data_dir, ["val"])
        store = CheckpointStore.for_run(checkpoint_store(ws, s), spec.name, run_key,
                                        keep_last=spec.checkpoint.keep_last)
        trainer = Trainer(spec.model, spec.checkpoint, store, spec.data_schema.label,
                          device=job_device(spec.resources.gpus, held),
                          threads=spec.model.threads or spec.resources.cpus, job=spec.name,
                          preemptions_per_hour=preemptions_per_hour)
        shown.rows = len(train_df)
        shown.start(f"run key {run_key}" + (f", GPU {held.names[0]}" if held is not None else ""))

        def epoch_done(epoch: int, metrics: dict[str, float]) -> None:
            on_epoch(epoch, metrics)
            shown.epoch(epoch, metrics)

        try:
            result = trainer.fit(train_df, val_df, on_epoch=epoch_done, should_stop=should_stop,
                                 on_checkpoint=lambda info: shown.checkpoint(info.step, info.size))
        except Preempted as exc:
            exc.site = s.name
            raise
        return result, str(trainer.device)


def _fleet_sites(ws: Workspace, names: Sequence[str] | None) -> list[Site]:
    return [s for s in ws.load_sites().sites if s.instances is not None and (names is None or s.name in names)]


def _run_ended(ws: Workspace) -> Callable[[str], str | None]:
    """How the MLflow run ended (FINISHED, FAILED, KILLED); None while it runs or when the tracking server has none."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)

    @functools.cache  # a job's instances share one run: read it once
    def run_ended(run_id: str) -> str | None:
        status = registry.run_status(run_id)
        return status if status in ENDED_RUN_STATES else None

    return run_ended


def list_instances(ws: Workspace, sites: Sequence[str] | None = None,
                   now: datetime | None = None) -> list[dict[str, Any]]:
    """The live instances of the sites that start instances (all, or those named): one row each, with the
    job, its MLflow run and how it ended, the deadline and ``leftover`` (why ``sweep_instances`` would
    terminate it; empty: a job may still need it); one ``error`` row per site whose EC2 API failed."""
    from hybridtrain.errors import SiteUnavailable
    from hybridtrain.remote import cloud_instances  # lazy: heavy (boto3)

    now = now or datetime.now(UTC)
    run_ended = _run_ended(ws)
    rows: list[dict[str, Any]] = []
    for site in _fleet_sites(ws, sites):
        try:
            found = cloud_instances.live_instances(site, ec2_credentials(ws, site))
        except SiteUnavailable as exc:
            rows.append({"site": site.name, "error": exc.reason})
            continue
        for i in found:
            ended = run_ended(i.mlflow_run) if i.mlflow_run else None
            rows.append({"site": site.name, "instance": i.instance_id, "state": i.state, "type": i.instance_type,
                         "job_id": i.job_id or "", "mlflow_run": i.mlflow_run or "",
                         "run": ended or ("running" if i.mlflow_run else ""),
                         "expires": i.expires.isoformat(timespec="seconds") if i.expires else "",
                         "leftover": cloud_instances.leftover_reason(i, ended, now) or ""})
    return rows


def sweep_instances(ws: Workspace, now: datetime | None = None,
                    sites: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Terminate the leftover instances of every site that starts instances, or of ``sites``
    (``cloud_instances.sweep_orphans``).

    An instance is left over when the MLflow run it was started for has ended, or its deadline
    has passed. One row per instance terminated, and one per site whose EC2 API could not be
    read (``error``), never an exception: the sweep runs again on the next pass. Each termination
    is audited.
    """
    from hybridtrain.errors import SiteUnavailable
    from hybridtrain.remote import cloud_instances  # lazy: heavy (boto3)

    fleet_sites = _fleet_sites(ws, sites)
    if not fleet_sites:
        return []
    run_ended = _run_ended(ws)

    rows: list[dict[str, Any]] = []
    for site in fleet_sites:
        try:
            left = cloud_instances.sweep_orphans(site, run_ended, ec2_credentials(ws, site), now=now)
        except SiteUnavailable as exc:
            log.warning("site %s: instance sweep skipped: %s", site.name, exc.reason)
            rows.append({"site": site.name, "error": exc.reason})
            continue
        for x in left:
            audit(ws).append(actor=ws.actor, action="cloud_instances", subject=f"job {x.job_id}",
                             inputs={"site": site.name, "job_id": x.job_id, "mlflow_run_id": x.mlflow_run,
                                     "instances": [x.instance_id]},
                             outcome=f"terminated by the sweep: {x.reason}")
            rows.append({"site": site.name, "instance": x.instance_id, "job_id": x.job_id, "reason": x.reason})
    return rows


def ec2_credentials(ws: Workspace, site: Site) -> Ec2Credentials | None:
    """The AWS keys that start ``site``'s instances: its block's, else its S3 store's; None: boto3's own chain."""
    from hybridtrain.remote.cloud_instances import Ec2Credentials  # lazy: heavy (boto3)

    secret = ws.secrets.get(site.name) if ws.secrets is not None else None
    if secret is not None and secret.aws_access_key_id and secret.aws_secret_access_key is not None:
        return Ec2Credentials(secret.aws_access_key_id, secret.aws_secret_access_key)
    store = site.store
    if isinstance(store, S3Store) and store.access_key_id and store.secret_access_key is not None:
        return Ec2Credentials(store.access_key_id, store.secret_access_key)
    return None


def move_checkpoint(ws: Workspace, spec: JobSpec, run_key: str, source: str,
                    destination: str) -> TransferRecord | None:
    """Copy the newest valid checkpoint of ``run_key`` from ``source``'s store to ``destination``'s.

    For a run that resumes at another site (preempted, or its site failed): only that one
    checkpoint moves (``CheckpointStore.copy_latest``), and the crossing is returned as a
    ``TransferRecord`` (egress charged by ``source``). None when ``source`` holds no valid
    checkpoint of the run (it starts afresh) or the sites are the same; a record with 0 bytes
    when ``destination`` already had it. ``SiteUnavailable`` when either store cannot be reached.
    """
    from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch)

    if source == destination:
        return None
    sites = ws.load_sites()
    src, dst = sites.get(source), sites.get(destination)
    keep = spec.checkpoint.keep_last
    copy = CheckpointStore.for_run(checkpoint_store(ws, src), spec.name, run_key, keep_last=keep).copy_latest(
        CheckpointStore.for_run(checkpoint_store(ws, dst), spec.name, run_key, keep_last=keep))
    if copy is None:
        return None
    return TransferRecord(
        source=source, destination=destination, what=f"checkpoint {copy.source.uri} (step {copy.source.step})",
        bytes=copy.bytes, files=copy.files, seconds=copy.seconds, egress_per_gb=src.egress_per_gb,
        cost_usd=egress_cost(copy.bytes, src))


def observed_preemption_rate(ws: Workspace, site: str, min_hours: float = 1.0) -> float | None:
    """Preemptions per hour of training at ``site``, from the training attempts in the audit log
    (``checkpoint.auto_interval`` derives the checkpoint interval from it); None until ``min_hours``
    of training there have been observed."""
    seconds, preempted = 0.0, 0
    for record in audit(ws).records():
        inputs = record.inputs or {}
        if record.action == "training_attempt" and inputs.get("site") == site:
            seconds += float(inputs.get("seconds") or 0.0)
            preempted += record.outcome.startswith("preempted")
    hours = seconds / 3600
    return preempted / hours if hours >= min_hours else None


def checkpoint_sites(ws: Workspace, spec: JobSpec, run_key: str) -> dict[str, int]:
    """Site → step of the newest complete checkpoint of ``run_key`` in its store (sites holding one,
    and reachable now). A resubmitted run uses it to find where its training got to."""
    from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch)

    out = {}
    for site in ws.load_sites().sites:
        try:
            found = CheckpointStore.for_run(checkpoint_store(ws, site), spec.name, run_key).list()
        except Exception:  # noqa: BLE001 - an unreachable store holds nothing we can use now
            continue
        if found:
            out[site.name] = found[-1].step
    return out
