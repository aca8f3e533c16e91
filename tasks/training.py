"""Training tasks: train at the placed site and evaluate against the champion, one core call each."""

from __future__ import annotations

from prefect import get_run_logger, task

from hybridtrain import stages
from hybridtrain.dvc_repo import DatasetVersion
from hybridtrain.spec import JobSpec
from hybridtrain.workspace import Workspace
from tasks.retry import BACKOFF_S, only_transient


@task(name="train", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def train(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, run_id: str,
          run_key: str) -> stages.TrainOutput:
    # A retry resumes from the newest valid checkpoint of the same run_key (and, on an SSH host,
    # re-attaches to the job if it is still running there). Host log lines go to the run log.
    return stages.train(ws, spec, approved, site, run_id, run_key, on_line=get_run_logger().info)


@task(name="evaluate", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def evaluate(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str,
             model_uri: str) -> stages.EvaluateResult:
    return stages.evaluate(ws, spec, approved, site, model_uri)
