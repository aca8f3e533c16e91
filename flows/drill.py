"""Failover drill flow: the core drill (``hybridtrain.drill.runner``) on a schedule, its report as a Prefect artifact."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from hybridtrain.drill.report import DEFAULT_STEPS
from hybridtrain.drill.runner import run_drill
from hybridtrain.drill.scenarios import check_scenarios
from hybridtrain.drill.timeline import RecoveryFailed
from orchestration.context import run_workspace


@flow(name="failover-drill")
def failover_drill(
    scenarios: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    interval: int | None = None,
    workspace: str | None = None,
) -> dict[str, Any]:
    """Inject faults into a real training run and measure time to resume (RTO) and lost steps (RPO).

    ``scenarios``: kill-9, preempt, corrupt-checkpoint, s3-down, ssh-down (default: all). The
    report becomes the markdown artifact ``failover-drill``, an MLflow run in experiment
    ``hybridtrain-drills`` and files under ``.hybridtrain/drills/``. The flow run fails
    (``RecoveryFailed``) when any scenario's recovery failed; skipped scenarios say why.
    """
    names = check_scenarios(scenarios)
    ws = run_workspace(workspace)
    logger = get_run_logger()
    report = run_drill(ws, names, steps=steps, interval=interval, say=logger.info)
    create_markdown_artifact(markdown=report.to_markdown(), key="failover-drill",
                             description="Failover drill: RTO and RPO per injected fault")
    if report.failed:
        raise RecoveryFailed(report)
    return report.model_dump(mode="json")
