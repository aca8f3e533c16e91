"""Training stage flow, run in the work pool of the placed site: train there, evaluate there against the champion.

One training of a job at a time: the stage holds the job's training lease
(``orchestration.training_lease``) while it trains. How an attempt ended is saved in the lifecycle
run (``train-attempt-<n>``), so the lifecycle can tell a preemption from a failure even when the
stage ran in another worker's process.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated

from prefect import flow, get_run_logger

# Pinned Prefect 3.8.8: the pieces of prefect.concurrency.sync.concurrency(), used directly for the lease id.
from pydantic import BaseModel, Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import Preempted, SiteUnavailable, is_retryable
from hybridtrain.specs.job import JobSpec
from hybridtrain.training.preemption import preemption_trap
from hybridtrain.workspace import Workspace
from orchestration.context import run_workspace
from orchestration.progress import bind_progress
from orchestration.training_lease import acquire_lease
from tasks.training import evaluate, train


#: The highest ``attempt``: far above a recovery policy's attempts (``recovery.max_preemptions`` +
#: ``max_failures`` + 1; 23 by default). A bound in the parameter's type, for the form and the server (see ``flows``).
MAX_ATTEMPTS = 10_000


class Trained(BaseModel):
    trained: stages.TrainOutput
    evaluated: stages.EvaluateResult


class AttemptEnd(BaseModel):
    """How a training attempt that did not succeed ended, as the stage saw it."""

    kind: str  # preempted | site-lost | failed | fatal
    message: str
    site: str
    step: int | None = None
    checkpoint: str | None = None

    @classmethod
    def of(cls, exc: BaseException, site: str) -> AttemptEnd:
        if isinstance(exc, Preempted):
            return cls(kind="preempted", message=str(exc), site=site, step=exc.step, checkpoint=exc.checkpoint)
        if isinstance(exc, SiteUnavailable):
            return cls(kind="site-lost", message=exc.reason, site=exc.site)
        return cls(kind="failed" if is_retryable(exc) else "fatal", message=str(exc), site=site)


@flow(name="train-stage", flow_run_name="train-{spec.metadata.name}-at-{site}", log_prints=True)
def train_stage(spec: JobSpec, approved: DatasetVersion, site: str, run_id: str, run_key: str,
                workspace: str | None = None, attempt: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] = 1,
                capacity_class: str | None = None) -> Trained:
    """Train at the placed site (holding the job's training lease), then evaluate against the champion.

    Args:
        spec: The job spec.
        approved: The approved dataset version to train on (already in the site's store).
        site: The site this stage runs at.
        run_id: MLflow run of the lifecycle this stage belongs to (checked first: a stage is started by
            training-lifecycle).
        run_key: Names the checkpoint series (letters, digits, . _ -): the same key resumes from its newest
            checkpoint.
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
        attempt: Which training attempt of the lifecycle this is (1 for the first; at most 10000).
        capacity_class: The placement's capacity class at the site (``opportunistic``: spot). Instances a
            multi-node job starts follow it; empty: the site's own class.
    """
    bind_progress()
    stages.check_run_key(run_key)
    ws = run_workspace(workspace)
    stages.check_run(ws, run_id)  # before the lease and the training: the result goes back through this run
    # One trap for the whole stage: a notice while the lease is taken stops training after its first step
    # (a preemption, resumed), and one after training ended is recorded while the stage finishes.
    with preemption_trap(spec.checkpoint.preemption_grace_s):
        try:
            with ExitStack() as held:
                acquire_lease(held, spec.name)
                trained = train(ws, spec, approved, site, run_id, run_key, capacity_class)
            evaluated = evaluate(ws, spec, approved, site, trained.model_uri)
        except Exception as exc:
            save_attempt_end(ws, run_id, f"train-attempt-{attempt}", AttemptEnd.of(exc, site))
            raise
        out = Trained(trained=trained, evaluated=evaluated)
        stages.save_result(ws, run_id, "train-stage", out)  # a plain call, as in flows.data
    return out


def save_attempt_end(ws: Workspace, run_id: str, name: str, end: AttemptEnd) -> None:
    """Record how an attempt that raised ended, for the run that started it; called while its error propagates.

    The attempt's own error is what the user must see: when the record cannot be written (MLflow
    does not answer), that is logged and the caller re-raises the original error, which a failing
    ``save_result`` would otherwise replace. The starting run then finds no record and judges the
    attempt by its flow run's state.
    """
    try:
        stages.save_result(ws, run_id, name, end)
    except Exception as lost:  # noqa: BLE001 - logged; the attempt's error, re-raised by the caller, wins
        get_run_logger().warning("could not record how the attempt ended (%s) in MLflow run %s: %s", end.kind,
                                 run_id, lost)
