"""Training stage flow, run in the work pool of the placed site: train there, evaluate there against the champion."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel

from hybridtrain import stages
from hybridtrain.dvc_repo import DatasetVersion
from hybridtrain.spec import JobSpec
from blocks.site import with_site_secrets
from hybridtrain.workspace import Workspace
from tasks.tracking import save_result
from tasks.training import evaluate, train


class Trained(BaseModel):
    trained: stages.TrainOutput
    evaluated: stages.EvaluateResult


@flow(name="train-stage", flow_run_name="train-{spec.metadata.name}-at-{site}", log_prints=True)
def train_stage(spec: JobSpec, approved: DatasetVersion, site: str, run_id: str, run_key: str,
                workspace: str | None = None) -> Trained:
    ws = with_site_secrets(Workspace.resolve(workspace))
    trained = train(ws, spec, approved, site, run_id, run_key)
    evaluated = evaluate(ws, spec, approved, site, trained.model_uri)
    out = Trained(trained=trained, evaluated=evaluated)
    save_result(ws, run_id, "train-stage", out)
    return out
