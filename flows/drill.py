"""Failover drill flow: the core drill (``hybridtrain.drill.runner``) on a schedule, its report as a Prefect artifact."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain.drill.report import DEFAULT_STEPS
from hybridtrain.drill.runner import FLOW_NAMES, option_problems, run_drill
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

    ``scenarios``: kill-9, preempt, corrupt-checkpoint, s3-down, ssh-down (default: all); ``steps``: 40 to
    ``MAX_STEPS`` (10000) optimizer steps per run; ``interval``: steps between checkpoints. The
    report becomes the markdown artifact ``failover-drill``, an MLflow run in experiment
    ``hybridtrain-drills`` and files under ``.hybridtrain/drills/``. The flow run fails
    (``RecoveryFailed``) when any scenario's recovery failed; skipped scenarios say why.
    """
    # Wrong parameters, named as in the run form, are refused with the workspace's before anything is read.
    ws = run_workspace(workspace, problems=option_problems(scenarios, steps=steps, interval=interval, names=FLOW_NAMES),
                       source=FLOW_NAMES.source)
    logger = get_run_logger()
    report = run_drill(ws, scenarios, steps=steps, interval=interval, say=logger.info, names=FLOW_NAMES)
    create_markdown_artifact(markdown=report.to_markdown(), key="failover-drill",
                             description="Failover drill: RTO and RPO per injected fault")
    if report.failed:
        raise RecoveryFailed(report)
    return report.model_dump(mode="json")
