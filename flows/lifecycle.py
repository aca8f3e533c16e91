"""Lifecycle flow: preprocess → anonymize → sync → train → evaluate → promote, for one job spec."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, runtime, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from hybridtrain import stages
from hybridtrain.registry import Registry
from hybridtrain.spec import JobSpec, load_spec, parse_spec
from hybridtrain.summary import RunSummary
from hybridtrain.workspace import Workspace
from flows.training import train_stage
from tasks.data import anonymize, preprocess, sync
from tasks.tracking import close_run, open_run, promote, record_data


@task(name="validate-spec")
def validate_spec(ws: Workspace, spec_path: str, spec: JobSpec | None) -> JobSpec:
    sites = stages.load_sites(ws)
    if spec is not None:
        return parse_spec(spec.to_dict(), source="spec parameter", sites=sites)
    path = Path(spec_path)
    return load_spec(path if path.is_absolute() else ws.root / path, sites)


@flow(name="training-lifecycle", log_prints=True)
def lifecycle(
    spec_path: str = "jobs/churn.yaml",
    spec: JobSpec | None = None,
    workspace: str | None = None,
    run_key: str | None = None,
) -> RunSummary:
    """Run the whole lifecycle of one job.

    spec_path: job spec file, relative to the workspace (ignored when ``spec`` is given).
    spec: the job spec itself (typed form in the Prefect UI).
    workspace: workspace root; default HYBRIDTRAIN_HOME or the worker's working directory.
    run_key: names the checkpoint series to resume; default this flow run's id, so a retried
        run resumes and a new run trains afresh.
    """
    started = time.perf_counter()
    ws = Workspace.resolve(workspace)
    job = validate_spec(ws, spec_path, spec)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    run_id = open_run(ws, job, flow_run_id)
    try:
        prep = preprocess(ws, job)
        anon = anonymize(ws, job, prep.curated)
        site = job.placement.site or job.dataset.site
        synced = sync(ws, anon.approved, site)
        record_data(ws, job, run_id, prep, anon, synced)
        out = train_stage(ws, job, synced.dataset, site, run_id, run_key or flow_run_id or run_id)
        trained, evaluated = out["trained"], out["evaluated"]
        lineage = stages.build_lineage(ws, job, prep, anon, synced, site, started, flow_run_id)
        promoted = promote(ws, job, run_id, trained.model_uri, lineage, evaluated)
        close_run(ws, run_id, lineage, evaluated, promoted)
    except BaseException:
        Registry(ws.tracking_uri, ws.mlflow_artifacts).end_run(run_id, "FAILED")
        raise
    summary = RunSummary.build(job=job.name, flow_run_id=flow_run_id, mlflow_run_id=run_id, prep=prep, anon=anon,
                               synced=synced, trained=trained, evaluated=evaluated, promoted=promoted)
    create_markdown_artifact(summary.to_markdown(), key=f"lifecycle-{job.name}", description="Lifecycle summary")
    create_table_artifact([s.model_dump() for s in summary.stages], key=f"stages-{job.name}",
                          description="Where each stage ran")
    if synced.transfer is not None:
        create_table_artifact([synced.transfer.as_row()], key=f"transfers-{job.name}",
                              description="Bytes that crossed a site boundary")
    return summary
