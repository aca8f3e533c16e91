"""RunTracking: the MLflow run around one lifecycle — opened, fed each stage's data and results, closed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.lineage import Lineage, code_version
from hybridtrain.tracking.model_registry import FLOW_RUN_TAG, Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from hybridtrain.stages.results import AnonymizeResult, EvaluateResult, PreprocessResult, PromoteResult, SyncResult
from hybridtrain.stages.site_access import workspace_repo

M = TypeVar("M", bound=BaseModel)

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
        tags[FLOW_RUN_TAG] = flow_run_id
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
    sites = ws.load_sites()
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


def check_run(ws: Workspace, run_id: str, field: str = "run_id", started_by: str = "training-lifecycle") -> None:
    """Refuse a stage whose ``run_id`` is not an MLflow run of this workspace, before the stage does anything.

    A stage flow hands its result back through the run (``save_result``); with a wrong id it would do
    all its work (prepare data, train) and fail only then. ``field`` names the parameter, ``started_by``
    the flow that starts this stage with its own run's id (what the user should run instead). An
    MLflow server that does not answer raises its own error: that is not the caller's mistake.
    """
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    fix = f"this flow is started by {started_by} with its MLflow run's id: run that deployment instead"
    if not run_id or not run_id.strip():
        raise SpecError("parameters", [Problem(field, f"{field} is empty; {fix}")])
    try:
        run = Registry(ws.tracking_uri, ws.mlflow_artifacts).client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise SpecError("parameters", [Problem(field, f"no MLflow run {run_id!r}; {fix}")]) from None
    if run.info.lifecycle_stage == "deleted":
        raise SpecError("parameters", [Problem(field, f"MLflow run {run_id!r} was deleted; {fix}")])


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
