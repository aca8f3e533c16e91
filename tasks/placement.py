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
          unavailable: dict[str, str] | None = None) -> stages.PlacementOutcome:
    """Place the training; ``unavailable`` (site → reason: unhealthy, just lost the run) is left out."""
    now = datetime.now(UTC)
    queues = PrefectQueues(ws.load_sites()).snapshot(now)
    outcome = stages.place(ws, spec, dataset_bytes, queues, now, stages.estimate_run_hours(ws, spec), unavailable)
    stages.record_placement(ws, run_id, outcome, spec.name)
    create_markdown_artifact(outcome.to_markdown(), key=f"placement-{spec.name}",
                             description=f"Why the engine chose {outcome.site} ({outcome.capacity_class}), "
                                         "with every candidate")
    return outcome
