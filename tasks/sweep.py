"""Sweep tasks: open the study, train one trial, evaluate the best, publish the plots — one core call each."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import task

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sweep import SweepSpec
from hybridtrain.sweeps import trial as sweep_trial
from hybridtrain.sweeps.results import write_plots
from hybridtrain.sweeps.study import SweepStudy, TrialTicket, open_for_trial
from hybridtrain.sweeps.trial import TrialOutcome
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training.preemption import preemption_trap
from hybridtrain.workspace import Workspace
from orchestration.gpu_lease import hold_gpus
from tasks.retry import BACKOFF_S, only_transient


@task(name="open-study", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def open_study(url: str, name: str, sweep: SweepSpec) -> SweepStudy:
    return SweepStudy.open(url, name, sweep)


@task(name="train-trial")
def train_trial(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, parent_run_id: str, storage: str,
                study: str, ticket: TrialTicket, capacity_class: str | None = None,
                flow_run_id: str | None = None) -> TrialOutcome:
    """Train one trial (resuming its checkpoints). No task retries: the sweep's recovery decides.

    In a worker's process SIGTERM/SIGUSR1 (a spot notice, the pool shutting down) is a preemption
    notice: the step in progress ends, a checkpoint is written and ``Preempted`` raised. A GPU trial first
    takes its GPUs at the site (``orchestration.gpu_lease``: on SSH hosts, or a share of a site without
    hosts; it waits while they are busy).
    """
    with preemption_trap(spec.checkpoint.preemption_grace_s) as notice, \
            hold_gpus(ws.load_sites().get(site), spec) as gpus:
        return sweep_trial.train_trial(ws, spec, approved, site, parent_run_id, storage, study, ticket,
                                       should_stop=notice, capacity_class=capacity_class, gpus=gpus,
                                       flow_run_id=flow_run_id)


@task(name="evaluate-best", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def evaluate_best(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str,
                  model_uri: str) -> stages.EvaluateResult:
    return stages.evaluate(ws, spec, approved, site, model_uri)


@task(name="publish-plots", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def publish_plots(ws: Workspace, run_id: str, url: str, name: str, sweep: SweepSpec) -> list[str]:
    """Optuna's optimization history and parameter importances, as PNGs in the sweep's MLflow run (``sweep/``)."""
    study = open_for_trial(url, name, sweep).study
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    with tempfile.TemporaryDirectory(prefix="hybridtrain-sweep-") as tmp:
        paths = write_plots(study, Path(tmp))
        for p in paths:
            registry.client.log_artifact(run_id, str(p), "sweep")
    base = registry.client.get_run(run_id).info.artifact_uri
    return [f"{base}/sweep/{p.name}" for p in paths]
