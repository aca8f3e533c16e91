"""Training stage flow: train at the placed site, then evaluate there against the champion."""

from __future__ import annotations

from prefect import flow

from hybridtrain.dvc_repo import DatasetVersion
from hybridtrain.spec import JobSpec
from hybridtrain.workspace import Workspace
from tasks.training import evaluate, train


@flow(name="train-stage", flow_run_name="train-{spec.metadata.name}-at-{site}", log_prints=True)
def train_stage(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, run_id: str,
                run_key: str) -> dict:
    trained = train(ws, spec, approved, site, run_id, run_key)
    evaluated = evaluate(ws, spec, approved, site, trained.model_uri)
    return {"trained": trained, "evaluated": evaluated}
