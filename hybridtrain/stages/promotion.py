"""Promotion stage: gates → signed bundle → champion alias → release targets, with the ledger and audit records."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.tracking.lineage import Lineage
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from hybridtrain.governance.ledger import RUN_RECORD_ARTIFACT, AttemptRecord, RunRecord, StorageRecord
from hybridtrain.governance.release import BundleArchive, Releaser, open_targets
from hybridtrain.stages.results import EvaluateResult, PromoteResult, TrainOutput
from hybridtrain.stages.site_access import control_site
from hybridtrain.storage import open_store

#: Lineage tags a model version keeps (the rest stay on its run).
VERSION_LINEAGE_TAGS = frozenset({
    "hybridtrain.job", "hybridtrain.spec_hash", "hybridtrain.code_version", "hybridtrain.site",
    "hybridtrain.dataset.raw.md5", "hybridtrain.dataset.curated.md5", "hybridtrain.dataset.approved.md5",
    "hybridtrain.checkpoint.sha256"})
#: Cost tags a model version keeps; the full breakdown is on its run (and in ``hybridtrain ledger``).
VERSION_COST_TAGS = frozenset({"hybridtrain.cost.total_usd", "hybridtrain.cost.gpu_hours"})


def log_pictures(registry: Registry, run_id: str, trained: TrainOutput, line: Any, metric: str,
                 label: str) -> dict[str, str]:
    """Learning curves and the cost breakdown as PNGs in the run (``plots/``); title -> artifact path."""
    from hybridtrain.reporting import plots

    registry.log_bytes(run_id, plots.learning_curves(trained.history, metric, f"{label} trained at {trained.site}"),
                       plots.LEARNING_CURVES)
    registry.log_bytes(run_id, plots.cost_breakdown(plots.cost_groups(line.cost), f"what {label} cost: "
                                                                                  f"${line.total_usd:.4f}"),
                       plots.COST_BREAKDOWN)
    return {"Learning curves": plots.LEARNING_CURVES, "Cost breakdown": plots.COST_BREAKDOWN}


def releaser_for(ws: Workspace, spec: JobSpec, sites: SitesCatalog, trusted_key: Any) -> Any:
    """The spec's release targets (each trusting ``trusted_key``) and the bundle archive at the control site."""

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

    sites = ws.load_sites()
    attempts = [*trained.attempts, AttemptRecord(site=trained.site, capacity_class=capacity_class,
                                                 gpus=spec.resources.total_gpus, seconds=trained.seconds,
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

    The version is registered with a promotion mark (``governance.promotion.PromotionIntent``) that stays until its
    promotion is done. A re-run of the same lifecycle (same job and ``trained.run_key``) after an interruption
    settles that first: the same model (same final checkpoint) finishes the marked version's promotion — no second
    version, each audit record once — and a different model leaves the marked one ``abandoned``, with the reason.
    """
    import mlflow  # lazy: heavy (mlflow)

    from hybridtrain.errors import GateFailed
    from hybridtrain.governance import promotion
    from hybridtrain.governance.audit_key import workspace_log
    from hybridtrain.governance.bundle import BundleDataset, ModelBundle
    from hybridtrain.governance.gates import GateInputs, evaluate_gates
    from hybridtrain.governance.ledger import CostLedger
    from hybridtrain.governance.signing_key import SigningKey

    started = time.perf_counter()
    sites = ws.load_sites()
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    name = spec.registry.model_name
    primary = spec.evaluation.primary_metric
    metric_tags = {f"hybridtrain.metric.{k}": f"{v:.6f}" for k, v in result.metrics.items() if k == primary}
    lineage_tags = {**lineage.tags(), "hybridtrain.checkpoint.sha256": trained.checkpoint_sha256 or ""}
    # The version carries what a reader of the registry needs (hashes, primary metric; gates and cost
    # follow); everything else about the run stays on the run (close_run), one click away.
    version_tags = {k: v for k, v in lineage_tags.items() if k in VERSION_LINEAGE_TAGS}

    key = SigningKey.from_pem(signing_key_pem)
    publish_public_key(ws, key.public.to_pem())
    releaser = releaser_for(ws, spec, sites, key.public)
    audit = workspace_log(ws.root)
    # A run of this lifecycle stopped part-way through its promotion (Ctrl-C, kill -9) left its version marked: the
    # same model is finished as that version, a different one leaves it abandoned (governance.promotion).
    intent = promotion.settle_pending(registry, releaser, audit, name, job=spec.name, run_key=trained.run_key,
                                      checkpoint_sha256=trained.checkpoint_sha256, actor=actor)
    resumed = intent is not None
    if intent is not None:
        version = str(intent.version)
        model_uri = registry.version(name, version).source  # the bundle holds the files the version points at
    else:
        current = registry.by_alias(name, CHAMPION)  # what the gates compare against
        intent = promotion.PromotionIntent.new(job=spec.name, run_key=trained.run_key,
                                               checkpoint_sha256=trained.checkpoint_sha256, run_id=run_id,
                                               champion=current.version if current else None)
        version = registry.register(trained.model_uri, name, run_id, {**version_tags, **metric_tags},
                                    creation_tags=intent.tag()).version
        intent = dataclasses.replace(intent, version=version)
        model_uri = trained.model_uri

    record = run_record(ws, spec, run_id, version, trained, capacity_class, transfers,
                        registry.model_bytes_uri(trained.model_uri))
    registry.log_text(run_id, record.model_dump_json(indent=2), "ledger/run_record.json")
    registry.set_tags(run_id, {"hybridtrain.ledger.model": name, "hybridtrain.model_version": version})
    earlier = _earlier_record(registry, intent.run_id) if resumed and intent.run_id != run_id else None
    # A version's cost is every run that made it: the interrupted one too.
    line = CostLedger(sites).for_model([r for r in (earlier, record) if r is not None], model=name).line(version)
    registry.set_tags(run_id, line.tags())
    registry.set_version_tags(name, version, {k: v for k, v in line.tags().items() if k in VERSION_COST_TAGS})
    pictures = log_pictures(registry, run_id, trained, line, f"val_{primary}", f"{name} v{version}")

    champion = registry.by_alias(name, CHAMPION)
    with tempfile.TemporaryDirectory(prefix="hybridtrain-bundle-") as tmp:
        mlflow.set_tracking_uri(ws.tracking_uri)
        weights = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=f"{tmp}/model"))
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
        built_sha = bundle.manifest_sha256  # the bundle directory is temporary
        try:
            outcome = promotion.promote(registry, releaser, audit, bundle=bundle, report=report,
                                        trusted_key=key.public, actor=actor, intent=intent, resumed=resumed)
        except GateFailed as exc:
            outcome = None
            report = getattr(exc, "report", report)  # a resumed promotion's recorded verdict
    # A resumed promotion released the bundle the interrupted run had staged; the version's tag names it.
    bundle_sha = (outcome.release.manifest_sha256 if outcome is not None and outcome.release.manifest_sha256
                  else built_sha)
    if outcome is None:
        reasons = [f"gate {r.name}: {r.reason}" for r in report.failures]
    else:
        report = outcome.report
        reasons = [f"promoted: {result.reason}"]
    if resumed:
        reasons.append(f"finished the promotion of v{version} that an interrupted run of run key {trained.run_key} "
                       "had left unfinished")
    champ = registry.by_alias(name, CHAMPION)
    failed = [r.name for r in report.results if not r.passed]
    progress.report("promote", "verdict",
                    f"promote gates for {name} v{version}: {len(report.results) - len(failed)} passed, {len(failed)} failed"
                    + (f" ({', '.join(failed)})" if failed else "") + "; "
                    + (f"champion -> v{version}" + (f" (previous v{outcome.previous})" if outcome.previous else "")
                       if outcome is not None else f"champion stays {'v' + champ.version if champ else 'unset'}")
                    + (" (resumed)" if resumed else "")
                    + f"; cost ${line.total_usd:.4f}", site=control_site(ws, sites).name, promoted=outcome is not None)
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
        pictures=pictures,
        resumed=resumed,
    )


def _earlier_record(registry: Registry, run_id: str | None) -> RunRecord | None:
    """The cost record of the interrupted run that registered a resumed version; None when it stopped before
    writing one (its cost is then unknown to the ledger, as before)."""
    if not run_id:
        return None
    try:
        return RunRecord.model_validate_json(registry.read_text(run_id, RUN_RECORD_ARTIFACT))
    except Exception:  # noqa: BLE001 - MLflow raises many kinds for a missing artifact or run
        return None
