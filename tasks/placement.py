"""Placement task: gather live queue state from Prefect, then one call of the pure placement engine."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import task
from prefect.artifacts import create_markdown_artifact

from hybridtrain import stages
from hybridtrain.specs.job import JobSpec
from hybridtrain.workspace import Workspace
from orchestration.queues import PrefectQueues
from tasks.retry import BACKOFF_S, only_transient


@task(name="place", retries=3, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def place(ws: Workspace, spec: JobSpec, dataset_bytes: int, run_id: str,
          unavailable: dict[str, str] | None = None, run_hours: float | None = None,
          artifact: bool = True) -> stages.PlacementOutcome:
    """Place the training; ``unavailable`` (site → reason: unhealthy, just lost the run) is left out.

    ``run_hours``: the engine's run-time estimate when the caller has it (a sweep asks MLflow once,
    not once per trial); default: estimated now from the job's recent runs. ``artifact``: publish the
    decision as the ``placement-<job>`` markdown artifact (a sweep's table shows each trial's site
    instead; the audit log and the run's tags record every decision either way).
    """
    now = datetime.now(UTC)
    queues = PrefectQueues(ws.load_sites()).snapshot(now)
    hours = run_hours if run_hours is not None else stages.estimate_run_hours(ws, spec)
    outcome = stages.place(ws, spec, dataset_bytes, queues, now, hours, unavailable)
    stages.record_placement(ws, run_id, outcome, spec.name)
    if artifact:
        create_markdown_artifact(outcome.to_markdown(), key=f"placement-{spec.name}",
                                 description=f"Why the engine chose {outcome.site} ({outcome.capacity_class}), "
                                             "with every candidate")
    return outcome
