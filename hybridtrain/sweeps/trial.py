"""SweepTrial: one trial of a sweep — train the job's model with the trial's values at its placed site, reporting each epoch to the study.

A trial is a series of attempts like any training run (``hybridtrain.training.recovery``): its
checkpoints live under its own ``run_key`` (``<study>-t<number>``), so a preempted attempt resumes
where it stopped, here or at another site. Each trial has one MLflow run (a child of the sweep's
run, found again by its run key on a resume) with its values as parameters and its per-epoch metrics.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.specs.job import JobSpec
from hybridtrain.sweeps.plan import trial_job
from hybridtrain.sweeps.space import trial_spec
from hybridtrain.sweeps.study import TrialPruned, TrialTicket, open_for_trial
from hybridtrain.tracking.model_registry import FLOW_RUN_TAG, Registry
from hybridtrain.workspace import Workspace

TrialState = Literal["complete", "pruned", "failed"]
TRIAL_KEY_TAG = "hybridtrain.sweep.trial_key"


class TrialOutcome(BaseModel):
    """How one attempt of a trial that ran to an end (complete, or pruned) ended."""

    number: int
    state: TrialState
    value: float | None = Field(None, description="Objective at the last epoch reported.")
    epochs: int = Field(0, description="Epochs trained (a pruned trial: up to where it was stopped).")
    site: str
    seconds: float = Field(0.0, description="Seconds this attempt took in the trial's process, study and MLflow "
                                            "bookkeeping included.")
    mlflow_run_id: str
    message: str = ""
    trained: stages.TrainOutput | None = Field(None, description="The trained model (complete trials).")


def run_key(study_name: str, number: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{study_name}-t{number}")


def trial_run(ws: Workspace, spec: JobSpec, parent_run_id: str, study_name: str, ticket: TrialTicket,
              params: dict[str, Any], flow_run_id: str | None = None) -> str:
    """The trial's MLflow run: created on its first attempt (a child of the sweep's run), found again after.

    Tagged with the flow run of the attempt that trains in it now (``FLOW_RUN_TAG``, as a lifecycle's run is):
    when that flow run's process dies, the stale-run reaper finds the run by it and ends it KILLED.
    """
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    key = run_key(study_name, ticket.number)
    attempt = {FLOW_RUN_TAG: flow_run_id} if flow_run_id else {}
    found = registry.tagged_run_ids(ws.experiment, TRIAL_KEY_TAG, key)
    if found:
        if attempt:
            registry.set_tags(found[-1], attempt)
        return found[-1]
    run_id = registry.start_run(ws.experiment, f"{spec.name}-trial-{ticket.number}", tags={
        "mlflow.parentRunId": parent_run_id, "hybridtrain.job": trial_job(spec.name),
        "hybridtrain.sweep": study_name, "hybridtrain.sweep.trial": str(ticket.number), TRIAL_KEY_TAG: key, **attempt})
    registry.log_params(run_id, {f"model.{k}": v for k, v in params.items()})
    return run_id


def train_trial(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, parent_run_id: str,
                storage: str, study_name: str, ticket: TrialTicket,
                should_stop: Callable[[], bool] | None = None, capacity_class: str | None = None,
                gpus: Mapping[str, Sequence[int]] | None = None, flow_run_id: str | None = None) -> TrialOutcome:
    """Train trial ``ticket`` of the sweep in ``spec`` at ``site`` (resuming its newest checkpoint).

    Returns a complete outcome (with the model in MLflow) or a pruned one (stopped after the epoch
    the pruner said so; no model). ``Preempted`` and real failures propagate, for the sweep's
    recovery to resume or retry the trial. ``gpus``: the GPUs of the site's hosts held for it (``stages.train``).
    ``flow_run_id``: the Prefect flow run of this attempt, tagged on the trial's MLflow run (``trial_run``).
    """
    import time

    started = time.perf_counter()
    if spec.sweep is None:
        raise ValueError(f"job {spec.name} has no sweep section")
    study = open_for_trial(storage, study_name, spec.sweep)
    params = study.space.decode(ticket.params)
    tspec = trial_spec(spec, ticket.params)
    run_id = trial_run(ws, spec, parent_run_id, study_name, ticket, params, flow_run_id)
    reporter = study.reporter(ticket, prune=spec.sweep.pruner.name != "none")
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    training = time.perf_counter()
    try:
        out = stages.train(ws, tspec, approved, site, run_id, run_key(study_name, ticket.number),
                           should_stop=should_stop, on_epoch_end=reporter, capacity_class=capacity_class,
                           gpus=gpus)
    except TrialPruned as exc:
        # as stages.train does for a complete trial: the engine learns the trials' durations from it
        registry.log_metrics(run_id, {"train_seconds": time.perf_counter() - training})
        registry.set_tags(run_id, {"hybridtrain.sweep.state": "pruned"})
        registry.end_run(run_id, "FINISHED")
        return TrialOutcome(number=ticket.number, state="pruned", value=exc.value, epochs=exc.epoch, site=site,
                            seconds=time.perf_counter() - started, mlflow_run_id=run_id, message=str(exc))
    metric = spec.sweep.objective.metric
    value = float(out.history[-1][metric]) if out.history else None
    registry.set_tags(run_id, {"hybridtrain.sweep.state": "complete"})
    registry.end_run(run_id, "FINISHED")
    return TrialOutcome(number=ticket.number, state="complete", value=value, epochs=out.epochs_completed, site=site,
                        seconds=time.perf_counter() - started, mlflow_run_id=run_id, trained=out)
