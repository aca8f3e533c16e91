"""Tracking tasks: the MLflow run around a lifecycle, lineage and promotion, one core call each."""

from __future__ import annotations

from prefect import task

from blocks.register import release_key_pem
from hybridtrain import stages
from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.lineage import Lineage
from hybridtrain.workspace import Workspace
from tasks.retry import BACKOFF_S, only_transient


@task(name="open-run", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def open_run(ws: Workspace, spec: JobSpec, flow_run_id: str | None) -> str:
    return stages.open_run(ws, spec, flow_run_id)


@task(name="record-data", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def record_data(ws: Workspace, spec: JobSpec, run_id: str, prep: stages.PreprocessResult,
                anon: stages.AnonymizeResult, synced: stages.SyncResult) -> None:
    stages.record_data(ws, spec, run_id, prep, anon, synced)


@task(name="promote", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def promote(ws: Workspace, spec: JobSpec, run_id: str, trained: stages.TrainOutput, capacity_class: str,
            lineage: Lineage, result: stages.EvaluateResult, transfers: list[TransferRecord], actor: str,
            approved_by: str | None = None) -> stages.PromoteResult:
    # The signing key is read here, from its Secret block, and never passed around or logged.
    return stages.promote(ws, spec, run_id, trained, capacity_class, lineage, result, transfers,
                          release_key_pem(ws.release_key_block), actor, approved_by)


@task(name="close-run", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def close_run(ws: Workspace, run_id: str, lineage: Lineage, result: stages.EvaluateResult,
              promotion: stages.PromoteResult, transfers: list[TransferRecord] | None = None) -> None:
    stages.close_run(ws, run_id, lineage, result, promotion, transfers)
