"""Lifecycle flow: preprocess → anonymize → sync → train → evaluate → promote, for one job spec.

Data stages run in the work pool of the site holding the data, training in the pool of the
placed site (see ``orchestration.dispatch``); promotion runs here, at the control plane. A job whose data
is split across sites, or that asks for it, is handed to ``flows.federated`` when its training
mode comes out federated (it then returns a ``FederatedSummary``).
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, pause_flow_run, runtime, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from prefect.input import RunInput
from pydantic import Field

from flows.data import Prepared, prepare_data, sync_data
from flows.supervise import train_with_recovery
from hybridtrain import stages
from hybridtrain.cli.preflight import check_dataset
from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.policy import Policy
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.stages.summary import RunSummary
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.validation import load_job, parse_job
from hybridtrain.workspace import Workspace
from orchestration.context import run_workspace
from orchestration.dispatch import Mode, deployment_name, has_deployment, run_stage
from orchestration.progress import bind_progress
from tasks.burst import Relocation
from tasks.placement import place
from tasks.tracking import close_run, open_run, promote, record_data

# How long a dispatched stage may wait for a worker and run, beyond the job's own time limit.
QUEUE_ALLOWANCE_S = 3600


@task(name="validate-spec")
def validate_spec(ws: Workspace, spec_path: str, spec: JobSpec | None, dispatch: Mode | None = None) -> JobSpec:
    """The job to run: the ``spec`` form when filled in, else the file ``spec_path``, checked against the sites
    catalog and the policy.

    ``spec_path`` is relative to the workspace; in a deployment run (a UI form, a schedule) it must stay
    inside it, so the worker host's other files are neither read nor probed. A direct call (``hybridtrain
    run``, Python) may name any file its caller can read. With ``dispatch``, the pinned raw dataset is
    checked too (``hybridtrain.cli.preflight.check_dataset``, as ``hybridtrain run`` does) when prepare-data
    will run on this host: a wrong ``dataset.md5`` is refused before an MLflow run is opened.
    """
    sites = ws.load_sites()
    policy = Policy.load(ws.policy_file, sites) if ws.policy_file.is_file() else None
    if spec is not None:
        job = parse_job(spec.to_dict(), source="spec parameter", sites=sites, policy=policy)
    else:
        job = load_job(spec_file(ws, spec_path, inside_only=bool(runtime.deployment.id)), sites, policy)
    if dispatch is not None and _prepares_here(job, sites, dispatch):
        check_dataset(ws, job, sites, spec_path if spec is None else "the spec form")
    return job


def spec_file(ws: Workspace, spec_path: str, inside_only: bool) -> Path:
    """The job spec file ``spec_path`` names (relative to the workspace); ``inside_only``: refuse one outside it."""
    if not spec_path or not spec_path.strip():
        raise SpecError("parameters", [Problem("spec_path", "spec_path is empty: give a job spec file under jobs/ "
                                                            "(e.g. jobs/churn.yaml), or fill in the spec form")])
    path = Path(spec_path)
    path = path if path.is_absolute() else ws.root / path
    root = ws.root.resolve()
    if inside_only and not path.resolve().is_relative_to(root):
        raise SpecError("parameters", [Problem("spec_path", f"{spec_path} is outside the workspace {root}; give a "
                                                            "file under jobs/ (e.g. jobs/churn.yaml)")])
    return path


def _prepares_here(job: JobSpec, sites: SitesCatalog, dispatch: Mode) -> bool:
    """Whether prepare-data will run on this host, seeing the checkout and the data site's store this process sees:
    inline, in the data site's own pool, or (auto) where no prepare-data deployment exists. A federated job's
    parts are prepared by each site's own flow run, where they are."""
    if len(job.site_datasets()) > 1 or job.training.mode == "federated":
        return False
    if dispatch == "inline":
        return True
    pool = sites.get(job.dataset.site).work_pool
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and context.flow_run.work_pool_name == pool:
        return True
    return dispatch == "auto" and not has_deployment(deployment_name(prepare_data, pool))


class Approval(RunInput):
    """The reviewer's answer: approve (with your name) or reject the promotion."""

    approve: bool = Field(description="Move the champion alias to this version?")
    approved_by: str = Field(description="Who approves (recorded on the model version and in the audit log).")
    note: str = ""


def ask_approval(job: JobSpec, trained: stages.TrainOutput, evaluated: stages.EvaluateResult) -> str | None:
    """Pause the flow run until a person approves or rejects in the Prefect UI (Resume form)."""
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in evaluated.metrics.items() if k in ("auc", "accuracy", "f1"))
    text = (f"Approve promoting **{job.registry.model_name}** trained at {trained.site}? Test metrics: {metrics}; "
            f"{evaluated.reason}.")
    answer = pause_flow_run(wait_for_input=Approval.with_initial_data(description=text, approve=False,
                                                                      approved_by=""),
                            timeout=int(job.promotion.approval_timeout_s))
    if not answer.approve:
        return None  # the approval gate then fails and records the rejection
    return answer.approved_by.strip() or None


@flow(name="training-lifecycle", log_prints=True)
def lifecycle(
    spec_path: str = "jobs/churn.yaml",
    spec: JobSpec | None = None,
    workspace: str | None = None,
    run_key: str | None = None,
    dispatch: Mode = "auto",
) -> RunSummary:
    """Run the whole lifecycle of one job: preprocess, anonymize, place, sync, train, evaluate, promote.

    Args:
        spec_path: Job spec file, relative to the workspace (e.g. jobs/churn.yaml); a deployment run
            reads only files inside the workspace. Ignored when the spec form below is filled in.
        spec: The job spec itself, as a form: leave empty to use spec_path.
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME, else the worker's
            working directory.
        run_key: Names the checkpoint series to resume (letters, digits, . _ -). Empty: this flow
            run's id, so a retried run resumes and a new run trains afresh.
        dispatch: Where stages run. auto: in the work pool of their site when stage deployments
            exist, else here; inline: every stage in this process; pools: always via the pools.
    """
    bind_progress()
    started = time.perf_counter()
    stages.check_run_key(run_key or None)  # before anything: a bad key would fail only at the first checkpoint
    ws = run_workspace(workspace)
    job = validate_spec(ws, spec_path, spec, dispatch)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    run_id = open_run(ws, job, flow_run_id)
    limit_s = job.resources.max_hours * 3600 + QUEUE_ALLOWANCE_S
    data_site = job.dataset.site
    try:
        if len(job.site_datasets()) > 1 or job.training.mode == "federated":
            # Lazy: the federated path imports torch (3-4 s of CPU), which a lifecycle run that dispatches its
            # stages to pools, and `prefect deploy` loading this entrypoint, never need.
            from flows.federated import run_federated
            from tasks.federated import training_mode

            mode = training_mode(ws, job)  # auto may still say centralized (one site)
            if mode.federated:
                return run_federated(ws, job, mode, run_id, run_key or flow_run_id or run_id, dispatch, flow_run_id,
                                     f"prefect flow run {flow_run_id}" if flow_run_id else "hybridtrain")
        prepared = run_stage(prepare_data, Prepared, site=data_site, params={"spec": job, "run_id": run_id},
                             ws=ws, run_id=run_id, mode=dispatch, timeout_s=limit_s)
        prep, anon = prepared.prep, prepared.anon
        decision = place(ws, job, anon.approved.size, run_id)
        site = decision.site
        if site == data_site:
            synced = stages.SyncResult(dataset=anon.approved, transfer=None, site=site, seconds=0.0)
        else:
            synced = run_stage(sync_data, stages.SyncResult, site=data_site,
                               params={"approved": anon.approved, "destination": site, "run_id": run_id,
                                       "spec": job},
                               ws=ws, run_id=run_id, mode=dispatch, timeout_s=limit_s)
        record_data(ws, job, run_id, prep, anon, synced)
        supervised = train_with_recovery(ws, job, anon.approved, synced, decision, run_id,
                                         run_key or flow_run_id or run_id, dispatch, limit_s)
        trained, evaluated = supervised.out.trained, supervised.out.evaluated
        decision = supervised.placement if supervised.placement.site == trained.site else decision
        site = trained.site  # recovery or the burst controller may have moved the training elsewhere
        # Only the burst controller relocates, and only runs waiting in a pool: inline, nothing moved.
        moved = None if dispatch == "inline" else stages.find_result(ws, run_id, "relocation", Relocation)
        lineage = stages.build_lineage(ws, job, prep, anon, synced, site, started, flow_run_id)
        crossings = ([synced.transfer] if synced.transfer else []) + supervised.transfers + trained.transfers
        if moved is not None and moved.transfer is not None:
            crossings.append(moved.transfer)
        approved_by = ask_approval(job, trained, evaluated) if job.promotion.require_approval else None
        actor = f"prefect flow run {flow_run_id}" if flow_run_id else "hybridtrain"
        promoted = promote(ws, job, run_id, trained, decision.capacity_class, lineage, evaluated, crossings, actor,
                           approved_by)
        close_run(ws, run_id, lineage, evaluated, promoted, crossings)
    except BaseException:
        Registry(ws.tracking_uri, ws.mlflow_artifacts).end_run(run_id, "FAILED")
        raise
    summary = RunSummary.build(job=job.name, flow_run_id=flow_run_id, mlflow_run_id=run_id, prep=prep, anon=anon,
                               placement=decision, synced=synced, trained=trained, evaluated=evaluated,
                               promoted=promoted)
    # One artifact: where each stage ran, datasets, metrics, gates and every site crossing.
    create_markdown_artifact(summary.render(Registry(ws.tracking_uri, ws.mlflow_artifacts)), key=f"lifecycle-{job.name}",
                             description="Lifecycle summary")
    return summary
