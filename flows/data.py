"""Data stage flows, run in the work pool of the site holding the data: prepare (preprocess + anonymize) and sync.

Each stage records its result in the lifecycle's MLflow run (``stages/<stage>.json``): that is how a
result comes back from a pool's worker, and the run keeps it. It is a plain call, not a task: the
MLflow client retries its own transient failures, and a task would only add Prefect bookkeeping.
Because the result has nowhere else to go, a stage refuses a ``run_id`` that names no run before
it does any work (a stage deployment run by hand from the UI, with a made-up run id).
"""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.specs.job import JobSpec
from orchestration.context import run_workspace
from orchestration.progress import bind_progress
from tasks.data import anonymize, preprocess, sync


class Prepared(BaseModel):
    prep: stages.PreprocessResult
    anon: stages.AnonymizeResult


@flow(name="prepare-data", flow_run_name="prepare-{spec.metadata.name}", log_prints=True)
def prepare_data(spec: JobSpec, run_id: str, workspace: str | None = None) -> Prepared:
    """Raw → curated → approved at the data's own site (raw data never leaves it).

    Args:
        spec: The job spec (its dataset is prepared).
        run_id: MLflow run of the lifecycle this stage belongs to (checked first; the result is stored there).
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
    """
    bind_progress()
    ws = run_workspace(workspace)
    stages.check_run(ws, run_id)  # before any work: the result goes back through this run
    prep = preprocess(ws, spec)
    anon = anonymize(ws, spec, prep.curated)
    out = Prepared(prep=prep, anon=anon)
    stages.save_result(ws, run_id, "prepare-data", out)
    return out


@flow(name="sync-data", flow_run_name="sync-{approved.path}-to-{destination}", log_prints=True)
def sync_data(approved: DatasetVersion, destination: str, run_id: str, spec: JobSpec,
              workspace: str | None = None) -> stages.SyncResult:
    """Push the approved version from its site to ``destination``'s store (if the policy allows the
    job's data there); only missing objects move.

    Args:
        approved: The approved dataset version (DVC path and md5) to send: one that prepare-data made in this
            workspace (its audit log's tier promotion decides, not the tier written here).
        destination: Site whose store receives it.
        run_id: MLflow run of the lifecycle this stage belongs to (checked first; the result is stored there).
        spec: The job spec; the placement policy must allow its data at the destination.
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
    """
    bind_progress()
    ws = run_workspace(workspace)
    stages.check_run(ws, run_id)  # before anything moves: the result goes back through this run
    out = sync(ws, approved, destination, spec)
    stages.save_result(ws, run_id, "sync-data", out)
    return out
