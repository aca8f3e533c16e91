"""Failover drill flow: the core drill (``hybridtrain.drill.runner``) on a schedule, its report as a Prefect artifact."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain.drill.environment import MIN_INTERVAL, MIN_STEPS
from hybridtrain.drill.report import DEFAULT_STEPS
from hybridtrain.drill.runner import FLOW_NAMES, MAX_STEPS, option_problems, run_drill
from hybridtrain.drill.timeline import RecoveryFailed
from orchestration.context import run_workspace


@flow(name="failover-drill")
def failover_drill(
    scenarios: list[str] | None = None,
    steps: Annotated[int, Field(ge=MIN_STEPS, le=MAX_STEPS)] = DEFAULT_STEPS,
    interval: Annotated[int, Field(ge=MIN_INTERVAL, le=MAX_STEPS)] | None = None,
    workspace: str | None = None,
) -> dict[str, Any]:
    """Inject faults into a real training run and measure time to resume (RTO) and lost steps (RPO).

    The report becomes the markdown artifact ``failover-drill``, an MLflow run in experiment
    ``hybridtrain-drills`` and files under ``.hybridtrain/drills/``. The flow run fails
    (``RecoveryFailed``) when any scenario's recovery failed; skipped scenarios say why. The numbers' bounds
    are in their types too, so a deployment run outside them is never created (see ``flows``).

    Args:
        scenarios: kill-9, preempt, corrupt-checkpoint, s3-down, ssh-down (default: all).
        steps: Optimizer steps per run, 40 to 10000 (``MAX_STEPS``).
        interval: Steps between checkpoints, at least 2 and room for a fault before the end (default: about a
            twelfth of the run).
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
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
