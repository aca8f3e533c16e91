"""Stage: one step of the training lifecycle as a plain function from versioned inputs to versioned outputs.

preprocess → anonymize → sync → train → evaluate → promote. Each takes and returns DVC dataset
versions or registry entries (never hidden globals), so a stage can run at any site that can
reach the stores, and a Prefect task wraps exactly one of these calls. The same functions,
called in sequence, are the plain-Python baseline of the orchestration benchmark.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field

from hybridtrain import partitioned
from hybridtrain.dvc_repo import DatasetVersion, DvcRepo
from hybridtrain.errors import DataError, Preempted, Problem, SpecError
from hybridtrain.lineage import Lineage, code_version
from hybridtrain.object_store import ObjectStore
from hybridtrain.preprocess import Preprocessor
from hybridtrain.registry import CHAMPION, Registry
from hybridtrain.sites import Site, SitesCatalog
from hybridtrain.spec import JobSpec
from hybridtrain.transfer import DataMover, TransferRecord, egress_cost
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    from hybridtrain.ssh_site import SshCredentials

M = TypeVar("M", bound=BaseModel)
DVC_SUBDIR = "dvc"
CHECKPOINT_SUBDIR = "objects"


# -- results ---------------------------------------------------------------------------------


class PreprocessResult(BaseModel):
    raw: DatasetVersion
    curated: DatasetVersion
    report: dict[str, Any]
    site: str
    seconds: float


class AnonymizeResult(BaseModel):
    approved: DatasetVersion
    report: dict[str, Any]
    leak_scan: dict[str, Any]
    rows_sampled_out: int
    site: str
    seconds: float


class SyncResult(BaseModel):
    dataset: DatasetVersion
    transfer: TransferRecord | None = Field(None, description="None when the data was already at the site.")
    site: str
    seconds: float


class TrainOutput(BaseModel):
    site: str
    model_uri: str
    model_id: str | None
    run_key: str
    history: list[dict[str, float]]
    global_step: int
    epochs_completed: int
    resumed_from_step: int | None
    checkpoints_written: int
    last_checkpoint: str | None
    device: str
    seconds: float
    samples_per_second: float
    gpu_seconds: float = Field(0.0, description="Wall seconds x GPUs used (0 on CPU-only training).")
    checkpoint_sha256: str | None = Field(None, description="SHA-256 of the final checkpoint (lineage gate).")
    checkpoint_bytes: int = 0
    attempts: list[Any] = Field(default_factory=list, description="Earlier attempts of this run (ledger records).")
    transfers: list[TransferRecord] = Field(default_factory=list, description="Model upload to the control site.")


class EvaluateResult(BaseModel):
    metrics: dict[str, float]
    champion_version: str | None
    champion_metrics: dict[str, float] | None
    better: bool
    delta: float | None
    reason: str
    threshold_failures: list[str]
    site: str
    seconds: float


class PromoteResult(BaseModel):
    model_name: str
    version: str
    promoted: bool
    champion_version: str | None
    previous_version: str | None
    reasons: list[str]
    gates: dict[str, str] = Field(default_factory=dict, description="Each gate's verdict.")
    cost_usd: float = Field(0.0, description="The version's ledger total.")
    released_to: list[str] = Field(default_factory=list)
    bundle_sha256: str | None = None
    seconds: float


# -- environment -----------------------------------------------------------------------------


def audit(ws: Workspace) -> Any:
    """The workspace's append-only audit log."""
    from hybridtrain.audit_log import AuditLog

    return AuditLog.in_workspace(ws.root)


def load_sites(ws: Workspace) -> SitesCatalog:
    """The sites catalog of the workspace, with the credentials it carries in memory merged in."""
    catalog = SitesCatalog.load(ws.sites_file)
    return ws.secrets.apply(catalog) if ws.secrets is not None else catalog


def control_site(ws: Workspace, sites: SitesCatalog) -> Site:
    """The site hosting the control plane (Prefect server, MLflow): ``HYBRIDTRAIN_CONTROL_SITE`` or the
    first on-prem site of the catalog. Bytes sent to it from another site cross a boundary."""
    if ws.control_site:
        return sites.get(ws.control_site)
    return next((x for x in sites.sites if x.kind.value == "onprem"), sites.sites[0])


def remotes_for(ws: Workspace, sites: SitesCatalog) -> dict[str, dict[str, str]]:
    """Every site's store as a DVC remote section (no secrets) named after the site."""
    return {s.dvc_remote: s.dvc_remote_config(ws.root, DVC_SUBDIR) for s in sites.sites}


def remote_secrets_for(sites: SitesCatalog) -> dict[str, dict[str, str]]:
    """Credentials of every site's store, per DVC remote — handed to DvcRepo in memory only."""
    return {s.dvc_remote: secrets for s in sites.sites if (secrets := s.dvc_remote_secrets())}


def workspace_repo(ws: Workspace, sites: SitesCatalog, data_site: str) -> DvcRepo:
    """The workspace's DVC repo (the on-prem gateway checkout), remotes from the sites catalog.

    Local state (site working copies, MLflow artifacts) lives under ``.hybridtrain/`` inside the
    workspace; it holds DVC repos and pointers of its own, which the workspace repo must ignore.
    """
    repo = DvcRepo.ensure(ws.root, remotes_for(ws, sites), default_remote=sites.get(data_site).dvc_remote,
                          secrets=remote_secrets_for(sites))
    repo.ignore(f"/{ws.state_dir.name}/")
    return repo


def site_repo(ws: Workspace, site: Site) -> DvcRepo:
    """A site's own working copy: what a host at that site would have — its cache, its store."""
    remote = {site.dvc_remote: site.dvc_remote_config(ws.root, DVC_SUBDIR)}
    return DvcRepo.ensure(ws.site_workdir(site.name), remote, default_remote=site.dvc_remote, scm=False,
                          secrets={site.dvc_remote: site.dvc_remote_secrets()})


def checkpoint_store(ws: Workspace, site: Site) -> ObjectStore:
    """The site's object store (checkpoints, artifacts) as an ObjectStore: a directory or an S3 bucket."""
    from hybridtrain.object_store import open_store

    return open_store(site.store, ws.root, CHECKPOINT_SUBDIR, site=site.name)


def dataset_at(ws: Workspace, sites: SitesCatalog, version: DatasetVersion, site: str, data_site: str) -> Path:
    """Local directory holding ``version`` for a stage running at ``site``."""
    if site == data_site:
        repo = workspace_repo(ws, sites, data_site)
        if not repo.is_present(version):
            repo.checkout(version, remote=sites.get(data_site).dvc_remote)
        return ws.path(version.path)
    s = sites.get(site)
    return site_repo(ws, s).pull_pointer(version, remote=s.dvc_remote)


# -- stages ----------------------------------------------------------------------------------


def resolve_raw(ws: Workspace, spec: JobSpec, sites: SitesCatalog) -> tuple[DatasetVersion, Path]:
    """The pinned raw version and a local path holding exactly it (pulled by pointer if needed)."""
    ref = spec.dataset
    repo = workspace_repo(ws, sites, ref.site)
    current = repo.version(ref.path, "raw", ref.site)
    if current is not None and current.md5 == ref.md5:
        if not repo.is_present(current):
            repo.checkout(current, remote=sites.get(ref.site).dvc_remote)
        return current, ws.path(ref.path)
    if current is None and not ws.path(ref.path).exists():
        raise DataError(ref.path, [Problem("dataset.path", f"{ref.path} is not tracked by DVC in {ws.root}; "
                                                           "run `hybridtrain data add` (or `make demo`) first")])
    pinned = DatasetVersion(path=ref.path, md5=ref.md5, size=0, tier="raw", site=ref.site)
    # The workspace holds another version: fetch the pinned one by its hash into the site copy.
    site = sites.get(ref.site)
    try:
        path = site_repo(ws, site).pull_pointer(pinned, remote=site.dvc_remote)
    except DataError:
        have = current.md5 if current else "nothing"
        raise DataError(
            ref.path,
            [Problem("dataset.md5", f"pinned version {ref.md5} is not in the store of site {ref.site} "
                                    f"(the workspace has {have}); set dataset.md5 to {have} or push the pinned "
                                    "version")],
        ) from None
    return pinned, path


def preprocess(ws: Workspace, spec: JobSpec) -> PreprocessResult:
    """Raw (pinned) → curated: validate, clean, split, partition; version and store on-prem."""
    started = time.perf_counter()
    sites = load_sites(ws)
    site = spec.dataset.site
    raw, raw_path = resolve_raw(ws, spec, sites)
    curated_path = ws.tier_path("curated", spec.name)
    report = Preprocessor(spec).run(raw_path, ws.path(curated_path))
    repo = workspace_repo(ws, sites, site)
    curated = repo.add(curated_path, "curated", site)
    repo.push(curated, remote=sites.get(site).dvc_remote)  # within the site: versioned, not a crossing
    audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {curated_path}",
                     inputs={"path": curated_path, "tier_from": "raw", "tier_to": "curated", "from_md5": raw.md5,
                             "to_md5": curated.md5, "spec_hash": spec.spec_hash(), "site": site,
                             "reason": "schema validated, cleaned, split and partitioned", "report": report.as_dict()},
                     outcome=f"curated {curated.md5}")
    return PreprocessResult(raw=raw, curated=curated, report=report.as_dict(), site=site,
                            seconds=time.perf_counter() - started)


def anonymize(ws: Workspace, spec: JobSpec, curated: DatasetVersion, key: bytes) -> AnonymizeResult:
    """Curated → approved: treatments, k-anonymity, sampling, then a leak scan of what was written."""
    from hybridtrain.anonymizer import Anonymizer
    from hybridtrain.leak_scan import LeakScan

    started = time.perf_counter()
    sites = load_sites(ws)
    site = spec.dataset.site
    repo = workspace_repo(ws, sites, site)
    source_dir = dataset_at(ws, sites, curated, site, site)
    source = partitioned.read(source_dir)
    scan = LeakScan.from_source(source, spec)
    result = Anonymizer(spec, key).apply(source)
    frame = result.frame
    keys = source.loc[frame.index, spec.data_schema.entity_key]
    keep = partitioned.unit_interval(keys, "sync-sample") < spec.sync.sample_fraction
    approved_frame = frame[keep]
    approved_path = ws.tier_path("approved", spec.name)
    written = partitioned.write(approved_frame, ws.path(approved_path), sort_by=None)
    # Scan exactly the bytes that may leave: the files as written, read back.
    import pyarrow.parquet as pq

    leak = None
    for f in written:
        part = scan.scan(pq.read_table(f).to_pandas(), where=str(f.relative_to(ws.root)))
        leak = part if leak is None else leak.merge(part)
    assert leak is not None
    promotion_inputs = {"path": approved_path, "tier_from": "curated", "tier_to": "approved",
                        "from_md5": curated.md5, "spec_hash": spec.spec_hash(), "site": site,
                        "k_achieved": result.report.k_achieved, "rows_suppressed": result.report.rows_suppressed,
                        "leak_scan_hits": leak.hits, "reason": "anonymized, k-anonymous, leak scan of the "
                                                              "written files"}
    if not leak.clean:
        audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {approved_path}",
                         inputs=promotion_inputs, outcome="refused: raw sensitive values found by the leak scan")
    leak.raise_if_leaky(approved_path)
    approved = repo.add(approved_path, "approved", site)
    repo.push(approved, remote=sites.get(site).dvc_remote)
    audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {approved_path}",
                     inputs={**promotion_inputs, "to_md5": approved.md5}, outcome=f"approved {approved.md5}")
    return AnonymizeResult(
        approved=approved,
        report=result.report.model_dump(mode="json"),
        leak_scan=leak.model_dump(mode="json") if hasattr(leak, "model_dump") else dict(leak.__dict__),
        rows_sampled_out=int((~keep).sum()),
        site=site,
        seconds=time.perf_counter() - started,
    )


def check_destination(ws: Workspace, spec: JobSpec, approved: DatasetVersion, destination: str,
                      sites: SitesCatalog) -> None:
    """Refuse to send ``spec``'s data to a site the placement policy does not allow for it."""
    from hybridtrain.policy import Policy, capacity_options
    from hybridtrain.request import request_from_spec

    policy = Policy.load(ws.policy_file, sites)
    request = request_from_spec(spec, dataset_bytes=approved.size, now=datetime.now(UTC))
    site = sites.get(destination)
    verdicts = [policy.evaluate(request, site, k) for k in capacity_options(site)]
    if not any(v.allowed for v in verdicts):
        why = "; ".join(f"{v.rule}: {v.reason}" for v in verdicts)
        raise SpecError(f"job {spec.name}", [Problem(
            "placement", f"the policy does not allow this job's data at site {destination} ({why}); nothing was "
                         "synced")])


def sync(ws: Workspace, approved: DatasetVersion, destination: str, spec: JobSpec | None = None) -> SyncResult:
    """Make ``approved`` available in ``destination``'s store; only missing objects move.

    Only approved data may leave its site (DataMover enforces the tier) and, given the job's
    ``spec``, only to a site the placement policy allows for it. Every sync is audited.
    """
    started = time.perf_counter()
    sites = load_sites(ws)
    if approved.site == destination:
        return SyncResult(dataset=approved, transfer=None, site=destination, seconds=0.0)
    DataMover.check_tier(approved, approved.site, destination)
    if spec is not None:
        check_destination(ws, spec, approved, destination, sites)
    repo = workspace_repo(ws, sites, approved.site)
    moved, record = DataMover(repo).sync_dataset(approved, sites.get(approved.site), sites.get(destination))
    audit(ws).append(actor=ws.actor, action="sync", subject=f"dataset {approved.path}@{approved.md5}",
                     inputs=record.as_row(), outcome=f"{record.bytes} bytes to {destination}")
    return SyncResult(dataset=moved, transfer=record, site=destination, seconds=time.perf_counter() - started)


def train(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, run_id: str, run_key: str,
          *, ssh: SshCredentials | None = None, on_line: Callable[[str], None] | None = None,
          should_stop: Callable[[], bool] | None = None,
          preemptions_per_hour: float | None = None) -> TrainOutput:
    """Train at ``site`` on its copy of the approved data; checkpoints go to that site's store.

    ``run_key`` names the checkpoint series: a retry or a resubmission of the same run resumes
    from its newest valid checkpoint; a new run starts fresh.

    With ``ssh`` (the site block's private key and known_hosts) training runs on the site's
    first SSH host under torchrun (``remote_training.ssh_train``, job id ``<job>-<run_key>``,
    so a retry re-attaches to a job still running there), its log lines going to ``on_line``;
    without it, in this process.

    Preemption raises ``Preempted`` (step, checkpoint key, site): over SSH when the job stopped
    for a notice (SIGTERM to it) after writing its checkpoint; in this process when
    ``should_stop()`` (e.g. a ``PreemptionNotice`` entered by the main thread) said so after a
    step. Resume by calling ``train`` again with the same ``run_key`` — here, or at another site
    after ``move_checkpoint``. ``preemptions_per_hour`` (the site's observed rate) sets the
    interval of ``checkpoint.auto_interval``.
    """
    from hybridtrain.checkpoint import CheckpointStore
    from hybridtrain.trainer import Trainer

    started = time.perf_counter()
    sites = load_sites(ws)
    s = sites.get(site)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        registry.log_metrics(run_id, {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=epoch)

    if ssh is None and s.hosts and ws.secrets is not None:
        secret = ws.secrets.get(site)
        if secret is not None and secret.has_ssh:
            from hybridtrain.ssh_site import SshCredentials

            ssh = SshCredentials(private_key=secret.ssh_private_key, known_hosts=secret.ssh_known_hosts or "")
    if s.hosts and ssh is None:
        raise SpecError("site credentials", [Problem(
            f"{site}.ssh_private_key", f"site {site} trains on SSH hosts but its block holds no SSH key: "
            f"run `hybridtrain credentials {site} --ssh-key FILE --known-hosts FILE`")])
    if ssh is not None:
        from hybridtrain.remote_training import ssh_train

        if not s.hosts:
            raise SpecError("sites catalog", [Problem(f"sites.{site}.hosts", "SSH credentials were given but the "
                                                                              "site lists no hosts to train on")])
        job_id = re.sub(r"[^A-Za-z0-9._-]", "-", f"{spec.name}-{run_key}")[:128]
        from hybridtrain.ssh_site import Timeouts

        host = s.hosts[0]
        files = ssh_train(ws, spec, approved, s, host, ssh.private_key, ssh.known_hosts, run_key, job_id,
                          on_line, mlflow_run_id=run_id, preemptions_per_hour=preemptions_per_hour,
                          timeouts=Timeouts(connect=host.connect_timeout_s, command=host.command_timeout_s,
                                            reconnect=host.reconnect_s))
        result, device = files.train_result(), files.result.device
        for h in result.history:
            on_epoch(int(h["epoch"]), {k: v for k, v in h.items() if k not in ("epoch", "global_step")})
    else:
        data_dir = dataset_at(ws, sites, approved, site, spec.dataset.site)
        train_df = partitioned.read(data_dir, ["train"])
        val_df = partitioned.read(data_dir, ["val"])
        store = CheckpointStore.for_run(checkpoint_store(ws, s), spec.name, run_key,
                                        keep_last=spec.checkpoint.keep_last)
        trainer = Trainer(spec.model, spec.checkpoint, store, spec.data_schema.label,
                          threads=spec.model.threads or spec.resources.cpus, job=spec.name,
                          preemptions_per_hour=preemptions_per_hour)
        try:
            result = trainer.fit(train_df, val_df, on_epoch=on_epoch, should_stop=should_stop)
        except Preempted as exc:
            exc.site = site
            raise
        device = str(trainer.device)
    upload_started = time.perf_counter()
    ref = registry.log_model(run_id, result.model, result.featurizer.to_dict(), result.featurizer.n_features)
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
        gpu_seconds=seconds * max(1, spec.resources.gpus) if device.startswith("cuda") else 0.0,
        transfers=transfers,
    )


def move_checkpoint(ws: Workspace, spec: JobSpec, run_key: str, source: str,
                    destination: str) -> TransferRecord | None:
    """Copy the newest valid checkpoint of ``run_key`` from ``source``'s store to ``destination``'s.

    For a run that resumes at another site (preempted, or its site failed): only that one
    checkpoint moves (``CheckpointStore.copy_latest``), and the crossing is returned as a
    ``TransferRecord`` (egress charged by ``source``). None when ``source`` holds no valid
    checkpoint of the run (it starts afresh) or the sites are the same; a record with 0 bytes
    when ``destination`` already had it. ``SiteUnavailable`` when either store cannot be reached.
    """
    from hybridtrain.checkpoint import CheckpointStore

    if source == destination:
        return None
    sites = load_sites(ws)
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
    from hybridtrain.checkpoint import CheckpointStore

    out = {}
    for site in load_sites(ws).sites:
        try:
            found = CheckpointStore.for_run(checkpoint_store(ws, site), spec.name, run_key).list()
        except Exception:  # noqa: BLE001 - an unreachable store holds nothing we can use now
            continue
        if found:
            out[site.name] = found[-1].step
    return out


def evaluate(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, model_uri: str) -> EvaluateResult:
    """Test-set metrics of the candidate and of the current champion, on the same rows."""
    from hybridtrain import evaluation
    from hybridtrain.featurizer import Featurizer

    started = time.perf_counter()
    sites = load_sites(ws)
    data_dir = dataset_at(ws, sites, approved, site, spec.dataset.site)
    test_df = partitioned.read(data_dir, ["test"])
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    label = spec.data_schema.label
    model, feat = registry.load_uri(model_uri)
    metrics = evaluation.evaluate(model, Featurizer.from_dict(feat), test_df, label)
    champ = registry.by_alias(spec.registry.model_name, CHAMPION)
    champ_metrics = None
    if champ is not None:
        cmodel, cfeat = registry.load(champ.name, champ.version)
        champ_metrics = evaluation.evaluate(cmodel, Featurizer.from_dict(cfeat), test_df, label)
    cmp = evaluation.compare(metrics, champ_metrics, spec.evaluation.primary_metric, spec.evaluation.min_improvement)
    failures = evaluation.check_thresholds(metrics, spec.evaluation.thresholds)
    return EvaluateResult(
        metrics=metrics,
        champion_version=champ.version if champ else None,
        champion_metrics=champ_metrics,
        better=cmp.better,
        delta=cmp.delta,
        reason=cmp.reason,
        threshold_failures=failures,
        site=site,
        seconds=time.perf_counter() - started,
    )


def releaser_for(ws: Workspace, spec: JobSpec, sites: SitesCatalog, trusted_key: Any) -> Any:
    """The spec's release targets (each trusting ``trusted_key``) and the bundle archive at the control site."""
    from hybridtrain.object_store import open_store
    from hybridtrain.release import BundleArchive, Releaser, open_targets

    control = control_site(ws, sites)
    archive = BundleArchive(open_store(control.store, ws.root, "bundles", site=control.name))
    return Releaser(open_targets(spec.promotion.release_targets, root=ws.root, sites=sites, trusted_key=trusted_key),
                    archive)


def publish_public_key(ws: Workspace, pem: bytes) -> None:
    """Keep the workspace's copy of the release public key (what the CLI and targets trust) current."""
    path = ws.release_public_key
    if path.is_file() and path.read_bytes() == pem:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pem)
    tmp.replace(path)


def run_record(ws: Workspace, spec: JobSpec, run_id: str, version: str | None, trained: TrainOutput,
               capacity_class: str, transfers: list[TransferRecord], model_bytes: int) -> Any:
    """What this lifecycle run consumed, for the cost ledger: every training attempt (the wasted ones
    too), every crossing, and the bytes it left in storage."""
    from hybridtrain.ledger import AttemptRecord, RunRecord, StorageRecord

    sites = load_sites(ws)
    attempts = [*trained.attempts, AttemptRecord(site=trained.site, capacity_class=capacity_class,
                                                 gpus=spec.resources.gpus, seconds=trained.seconds,
                                                 outcome="succeeded")]
    storage = [StorageRecord(kind="artifact", site=control_site(ws, sites).name, bytes=model_bytes)]
    if trained.checkpoint_bytes:
        storage.append(StorageRecord(kind="checkpoint", site=trained.site, bytes=trained.checkpoint_bytes))
    return RunRecord(model=spec.registry.model_name, version=version, run_id=run_id, job=spec.name,
                     finished_at=datetime.now(UTC), attempts=attempts, transfers=transfers, storage=storage)


def promote(ws: Workspace, spec: JobSpec, run_id: str, trained: TrainOutput, capacity_class: str,
            lineage: Lineage, result: EvaluateResult, transfers: list[TransferRecord], signing_key_pem: str,
            actor: str, approved_by: str | None = None) -> PromoteResult:
    """Register the version with its lineage and cost; build and sign its bundle; evaluate every
    promotion gate; move ``champion`` and release to the spec's targets only if all pass.

    A gate saying no is a normal outcome (the version stays registered, the alias where it was);
    each gate's verdict is recorded on the version and in the audit log.
    """
    import mlflow

    from hybridtrain import promotion
    from hybridtrain.audit_log import AuditLog
    from hybridtrain.bundle import BundleDataset, ModelBundle
    from hybridtrain.errors import GateFailed
    from hybridtrain.gates import GateInputs, evaluate_gates
    from hybridtrain.ledger import CostLedger
    from hybridtrain.signing_key import SigningKey

    started = time.perf_counter()
    sites = load_sites(ws)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    name = spec.registry.model_name
    metric_tags = {f"hybridtrain.metric.{k}": f"{v:.6f}" for k, v in result.metrics.items()}
    lineage_tags = {**lineage.tags(), "hybridtrain.checkpoint.sha256": trained.checkpoint_sha256 or ""}
    version = registry.register(trained.model_uri, name, run_id, {**lineage_tags, **metric_tags}).version

    record = run_record(ws, spec, run_id, version, trained, capacity_class, transfers,
                        registry.model_bytes_uri(trained.model_uri))
    registry.log_text(run_id, record.model_dump_json(indent=2), "ledger/run_record.json")
    registry.set_tags(run_id, {"hybridtrain.ledger.model": name, "hybridtrain.model_version": version})
    line = CostLedger(sites).for_model([record], model=name).line(version)
    registry.set_version_tags(name, version, line.tags())

    key = SigningKey.from_pem(signing_key_pem)
    publish_public_key(ws, key.public.to_pem())
    releaser = releaser_for(ws, spec, sites, key.public)
    audit = AuditLog.in_workspace(ws.root)
    champion = registry.by_alias(name, CHAMPION)
    with tempfile.TemporaryDirectory(prefix="hybridtrain-bundle-") as tmp:
        mlflow.set_tracking_uri(ws.tracking_uri)
        weights = Path(mlflow.artifacts.download_artifacts(artifact_uri=trained.model_uri, dst_path=f"{tmp}/model"))
        bundle = ModelBundle.build(
            Path(tmp) / "bundle", model=name, version=version, weights=weights, spec=spec.to_dict(),
            datasets=[BundleDataset.of(v) for v in (lineage.raw, lineage.curated, lineage.approved)],
            evaluation={"metrics": result.metrics, "champion_version": result.champion_version,
                        "champion_metrics": result.champion_metrics, "reason": result.reason},
            lineage=lineage_tags, checkpoint_sha256=trained.checkpoint_sha256, signing_key=key,
            checkpoint_uri=trained.last_checkpoint)
        report = evaluate_gates(GateInputs.for_spec(
            spec, version, version_tags=registry.version(name, version).tags,
            datasets={v.tier: v.md5 for v in (lineage.raw, lineage.curated, lineage.approved)},
            checkpoint_sha256=trained.checkpoint_sha256, bundle=bundle, trusted_key=key.public,
            metrics=result.metrics,
            champion_version=champion.version if champion else None, champion_metrics=result.champion_metrics,
            cost_usd=line.total_usd, rollback_versions=releaser.available_versions(name), approved_by=approved_by,
        ), spec.promotion.gates)
        bundle_sha = bundle.manifest_sha256  # the bundle directory is temporary
        try:
            outcome = promotion.promote(registry, releaser, audit, bundle=bundle, report=report,
                                        trusted_key=key.public, actor=actor)
        except GateFailed:
            outcome = None
    if outcome is None:
        reasons = [f"gate {r.name}: {r.reason}" for r in report.failures]
        registry.set_version_tags(name, version, {"hybridtrain.promotion": "not-promoted",
                                                  "hybridtrain.promotion.reasons": "; ".join(reasons)})
    else:
        reasons = [f"promoted: {result.reason}"]
    champ = registry.by_alias(name, CHAMPION)
    return PromoteResult(
        model_name=name,
        version=version,
        promoted=outcome is not None,
        champion_version=champ.version if champ else None,
        previous_version=outcome.previous if outcome else None,
        reasons=reasons,
        gates={r.name: ("passed" if r.passed else "failed: " + r.reason) for r in report.results},
        cost_usd=line.total_usd,
        released_to=[t.target for t in outcome.release.targets] if outcome else [],
        bundle_sha256=bundle_sha,
        seconds=time.perf_counter() - started,
    )


def build_lineage(ws: Workspace, spec: JobSpec, prep: PreprocessResult, anon: AnonymizeResult,
                  synced: SyncResult, site: str, started: float, flow_run_id: str | None = None) -> Lineage:
    return Lineage(
        job=spec.name,
        spec_hash=spec.spec_hash(),
        code_version=code_version(ws.root),
        raw=prep.raw,
        curated=prep.curated,
        approved=anon.approved,
        train_site=site,
        bytes_synced=synced.transfer.bytes if synced.transfer else 0,
        duration_s=time.perf_counter() - started,
        flow_run_id=flow_run_id,
    )


# -- tracking around the stages --------------------------------------------------------------


def open_run(ws: Workspace, spec: JobSpec, flow_run_id: str | None = None) -> str:
    """Start the MLflow run of one lifecycle execution; log the spec and its parameters."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    tags = {"hybridtrain.job": spec.name, "hybridtrain.team": spec.metadata.team,
            "hybridtrain.spec_hash": spec.spec_hash()}
    if flow_run_id:
        tags["hybridtrain.prefect_flow_run_id"] = flow_run_id
    run_id = registry.start_run(ws.experiment, run_name=f"{spec.name}-lifecycle", tags=tags)
    m = spec.model
    registry.log_params(run_id, {
        "job": spec.name, "model.kind": m.kind, "model.hidden_layers": m.hidden_layers, "model.dropout": m.dropout,
        "model.epochs": m.epochs, "model.batch_size": m.batch_size, "model.learning_rate": m.learning_rate,
        "model.weight_decay": m.weight_decay, "model.seed": m.seed, "sync.sample_fraction": spec.sync.sample_fraction,
        "split.seed": spec.split.seed, "layout.partitions": spec.layout.partitions,
        "dataset.md5": spec.dataset.md5,
    })
    registry.log_dict(run_id, spec.to_dict(), "spec/job.json")
    return run_id


def record_data(ws: Workspace, spec: JobSpec, run_id: str, prep: PreprocessResult, anon: AnonymizeResult,
                synced: SyncResult) -> None:
    """Log the three dataset versions as run inputs (source: their DVC objects) and the data reports."""
    sites = load_sites(ws)
    repo = workspace_repo(ws, sites, spec.dataset.site)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    for version, context in ((prep.raw, "source"), (prep.curated, "curated"), (synced.dataset, "training")):
        remote = sites.get(version.site).dvc_remote
        registry.log_dataset(
            run_id, name=f"{spec.name}-{version.tier}", digest=version.md5,
            source=repo.remote_url(version, remote), context=context,
            tags={"dvc.path": version.path, "dvc.md5": version.md5, "dvc.tier": version.tier,
                  "dvc.site": version.site, "dvc.nfiles": str(version.nfiles)},
        )
        registry.log_text(run_id, version.pointer_text(), f"datasets/{version.tier}.dvc")
    registry.log_dict(run_id, prep.report, "reports/preprocess.json")
    registry.log_dict(run_id, anon.report, "reports/anonymization.json")
    registry.log_dict(run_id, anon.leak_scan, "reports/leak_scan.json")
    if synced.transfer is not None:
        t = synced.transfer
        registry.set_tags(run_id, {"hybridtrain.transfer.bytes": t.bytes, "hybridtrain.transfer.files": t.files,
                                   "hybridtrain.transfer.route": f"{t.source}->{t.destination}",
                                   "hybridtrain.transfer.cost_usd": f"{t.cost_usd:.6f}"})


def close_run(ws: Workspace, run_id: str, lineage: Lineage, evaluation: EvaluateResult,
              promotion: PromoteResult, transfers: list[TransferRecord] | None = None) -> None:
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    if transfers:
        registry.log_dict(run_id, [t.as_row() for t in transfers], "reports/transfers.json")
        registry.set_tags(run_id, {"hybridtrain.transfer.total_bytes": sum(t.bytes for t in transfers),
                                   "hybridtrain.transfer.total_cost_usd": f"{sum(t.cost_usd for t in transfers):.6f}",
                                   "hybridtrain.transfer.count": len(transfers)})
    registry.set_tags(run_id, {**lineage.tags(), "hybridtrain.model_version": promotion.version,
                               "hybridtrain.promoted": str(promotion.promoted).lower()})
    registry.log_metrics(run_id, {f"test_{k}": v for k, v in evaluation.metrics.items()})
    if evaluation.champion_metrics:
        registry.log_metrics(run_id, {f"champion_test_{k}": v for k, v in evaluation.champion_metrics.items()})
    registry.end_run(run_id, "FINISHED")


# -- stage results, handed back through the lifecycle's MLflow run ------------------------------


def save_result(ws: Workspace, run_id: str, stage: str, result: BaseModel) -> None:
    """Store a stage's result in the lifecycle run, so a stage that ran at another site (in another
    worker's process) hands its output back through the one service every site can reach."""
    Registry(ws.tracking_uri, ws.mlflow_artifacts).log_text(run_id, result.model_dump_json(indent=2),
                                                            f"stages/{stage}.json")


def find_result(ws: Workspace, run_id: str, stage: str, model: type[M]) -> M | None:
    """Like ``load_result``, None when the stage recorded nothing (e.g. no relocation happened)."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    names = {f.path for f in registry.client.list_artifacts(run_id, "stages")}
    return load_result(ws, run_id, stage, model) if f"stages/{stage}.json" in names else None


def load_result(ws: Workspace, run_id: str, stage: str, model: type[M]) -> M:
    text = Registry(ws.tracking_uri, ws.mlflow_artifacts).read_text(run_id, f"stages/{stage}.json")
    return model.model_validate_json(text)


# -- placement --------------------------------------------------------------------------------


class PlacementOutcome(BaseModel):
    """The engine's decision for one lifecycle, in a form that travels (Prefect results, MLflow)."""

    site: str
    capacity_class: str
    strategy: str
    cost_usd: float
    finish_at: datetime
    deadline: datetime | None
    meets_deadline: bool
    needs_sync: bool
    must_stay: bool
    queue_tier: str
    queue_wait_s: float
    run_hours: float
    reasons: list[str]
    breakdown: list[str]
    candidates: list[dict[str, str]]
    rejected: dict[str, str]
    tags: dict[str, str]

    def to_markdown(self) -> str:
        lines = [f"# Placement: **{self.site}** ({self.capacity_class}, strategy {self.strategy})", "",
                 f"Estimated cost ${self.cost_usd:.2f}, finish {self.finish_at:%Y-%m-%d %H:%M} UTC"
                 + (f", deadline {self.deadline:%Y-%m-%d %H:%M} UTC" if self.deadline else "")
                 + (" — meets it." if self.meets_deadline else " — **misses it** (least late option)."), ""]
        lines += [f"- {r}" for r in self.reasons]
        lines += ["", "## Cost breakdown", ""] + [f"- {b}" for b in self.breakdown]
        if self.rejected:
            lines += ["", "## Rejected", ""] + [f"- {k}: {v}" for k, v in self.rejected.items()]
        if self.candidates:
            cols = list(self.candidates[0])
            lines += ["", "## Every candidate", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(str(c.get(k, "")).replace("|", "\\|") for k in cols) + " |"
                      for c in self.candidates]
        return "\n".join(lines)


def estimate_run_hours(ws: Workspace, spec: JobSpec) -> float | None:
    """The engine's own run-time estimate for ``spec``: a high quantile of what this job's recent
    training runs took (MLflow metric ``train_seconds``), capped by its declared limit; None
    (use the declared limit) until three runs have finished."""
    from hybridtrain.duration_estimator import HistoryQuantile

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    runs = registry.job_runs(ws.experiment, spec.name, limit=50)
    samples = [r.data.metrics["train_seconds"] / 3600 for r in runs if "train_seconds" in r.data.metrics]
    if len(samples) < 3:
        return None
    history = HistoryQuantile(quantile=0.9, min_samples=3)
    for hours in samples:
        history.observe(spec.resources.max_hours, hours)
    return history.estimate(spec.resources.max_hours)


def place(ws: Workspace, spec: JobSpec, dataset_bytes: int, queues: dict | None, now: datetime,
          run_hours: float | None = None, unavailable: dict[str, str] | None = None) -> PlacementOutcome:
    """Decide the training site with the placement engine (pure given its inputs: queues, clock, history).

    ``unavailable`` (site → reason: failed health checks, a site that just lost the run) is left out
    of this decision; when it leaves no site the policy allows, ``NoFeasiblePlacement`` says so.
    """
    from hybridtrain.placement import Placement
    from hybridtrain.policy import Policy
    from hybridtrain.request import request_from_spec

    sites = load_sites(ws)
    policy = Policy.load(ws.policy_file, sites)
    request = request_from_spec(spec, dataset_bytes=dataset_bytes, now=now, run_hours=run_hours)
    decision = Placement(sites, policy).decide(request, now=now.timestamp(), queues=queues, unavailable=unavailable)
    return PlacementOutcome(
        site=decision.site,
        capacity_class=decision.capacity_class.value,
        strategy=decision.strategy,
        cost_usd=decision.cost_usd,
        finish_at=datetime.fromtimestamp(decision.finish_at, UTC),
        deadline=datetime.fromtimestamp(decision.deadline, UTC) if decision.deadline else None,
        meets_deadline=decision.meets_deadline,
        needs_sync=decision.needs_sync,
        must_stay=decision.must_stay,
        queue_tier=decision.queue_tier.name,
        queue_wait_s=decision.queue_wait_s,
        run_hours=request.run_hours,
        reasons=decision.reasons,
        breakdown=decision.estimate.lines(),
        candidates=decision.to_table(),
        rejected=decision.rejected,
        tags={f"hybridtrain.{k}": v for k, v in decision.to_tags().items()},
    )


def site_health(ws: Workspace, workers_online: Callable[[str], int | None] | None = None,
                timeout_s: float = 5.0) -> list[Any]:
    """Health of every site in the catalog (``site_health.check_site``): its SSH hosts with the key
    its block holds, its store, and — when ``workers_online`` (pool → live workers) is given — its
    pool's worker heartbeat. Probes run in parallel threads, each bounded by ``timeout_s``."""
    from concurrent.futures import ThreadPoolExecutor

    from hybridtrain.site_health import check_site

    sites = load_sites(ws)

    def one(site: Site) -> Any:
        secret = ws.secrets.get(site.name) if ws.secrets is not None else None
        ssh = secret is not None and secret.has_ssh and bool(site.hosts)
        workers = workers_online(site.work_pool) if workers_online is not None else None
        return check_site(site, ws.root, private_key=secret.ssh_private_key if ssh else None,
                          known_hosts=(secret.ssh_known_hosts or "") if ssh else None,
                          workers_online=workers, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(sites.sites)))) as pool:
        return list(pool.map(one, sites.sites))


def record_placement(ws: Workspace, run_id: str, outcome: PlacementOutcome, job: str = "") -> None:
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    registry.set_tags(run_id, outcome.tags)
    registry.log_dict(run_id, outcome.model_dump(mode="json"), "reports/placement.json")
    audit(ws).append(actor=ws.actor, action="placement", subject=f"job {job or run_id}",
                     inputs={"mlflow_run_id": run_id, "site": outcome.site, "capacity_class": outcome.capacity_class,
                             "strategy": outcome.strategy, "est_cost_usd": round(outcome.cost_usd, 4),
                             "rejected": outcome.rejected, "reasons": outcome.reasons},
                     outcome=f"{outcome.site} ({outcome.capacity_class})")
