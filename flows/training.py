"""Training stage flow, run in the work pool of the placed site: train there, evaluate there against the champion.

One training of a job at a time: the stage holds a lease on the job (a Prefect global concurrency
limit ``train-<job>`` with one slot, renewed while the stage lives, expiring ``LEASE_S`` after its
process dies), so a resubmitted or duplicated run waits for the first to end instead of training
beside it. The holder is written to the Prefect variable ``train-lease-<job>``: a server without
the lease reaper (the repossessor service does not run in ephemeral servers) leaves a dead
holder's slot taken, so a waiting stage frees it itself once the holder's run (or the lifecycle
above it) has ended and the lease is older than ``REAP_AFTER_S`` (its expiry plus the reaper's
period). How an attempt ended is saved in the lifecycle run
(``train-attempt-<n>``), so the lifecycle can tell a preemption from a failure even when the
stage ran in another worker's process.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from uuid import UUID

from prefect import flow, get_run_logger, runtime
from prefect.variables import Variable
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from pydantic import BaseModel

from hybridtrain import stages
from hybridtrain.dvc_repo import DatasetVersion
from hybridtrain.errors import HybridtrainError, Preempted, SiteUnavailable, is_retryable
from hybridtrain.spec import JobSpec
from flows.context import run_workspace
from tasks.tracking import save_result
from tasks.training import evaluate, train

#: Seconds a dead holder keeps the job's lease (it is renewed while the holder lives; the server's minimum is 60).
LEASE_S = max(60.0, float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_S", "60")))
#: How long a second training of the same job waits for the first to end before it gives up.
LEASE_WAIT_S = float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_WAIT_S", str(6 * 3600)))
#: Age after which a lease whose holder has ended is freed by the waiting stage: past its expiry
#: plus one period of the server's reaper (``server.services.repossessor.loop_seconds``, 15 s).
REAP_AFTER_S = float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_REAP_S", str(LEASE_S + 15.0)))


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


class AlreadyTraining(HybridtrainError):
    """Another run holds the job's training lease."""

    exit_code = 7

    def __init__(self, job: str, waited_s: float):
        super().__init__(f"job {job!r} is already training in another run (lease train-{job} held for {waited_s:.0f} s); "
                         "wait for it to end, or cancel it in the Prefect UI")


def lease_name(job: str) -> str:
    return f"train-{job}"


def ensure_lease(job: str) -> str:
    """The job's one-slot global concurrency limit, created on first use."""
    name = lease_name(job)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
    return name


def holder_name(job: str) -> str:
    return f"train-lease-{job}"


def holder_is_gone(record: dict) -> bool:
    """True when the run holding the lease, or the lifecycle run above it, has ended."""
    with get_client(sync_client=True) as client:
        for run_id in (record.get("flow_run"), record.get("root_flow_run")):
            if not run_id:
                continue
            try:
                state = client.read_flow_run(UUID(run_id)).state
            except ObjectNotFound:
                return True
            if state is not None and state.is_final():
                return True
    return False


def reap_dead_holder(job: str) -> str | None:
    """Free the job's slot if its recorded holder has ended and its lease should have expired."""
    record = Variable.get(holder_name(job), default=None)
    if not isinstance(record, dict):
        return None
    age = (datetime.now(UTC) - datetime.fromisoformat(record["since"])).total_seconds()
    if age < REAP_AFTER_S or not holder_is_gone(record):
        return None
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots(names=[lease_name(job)], slots=1, occupancy_seconds=age)
    Variable.unset(holder_name(job))
    return f"freed the training lease of job {job!r}: its holder, flow run {record.get('flow_run')}, has ended"


def acquire_lease(held: ExitStack, job: str) -> None:
    """Take the job's training lease, waiting (and freeing a dead holder's) up to ``LEASE_WAIT_S``."""
    name = ensure_lease(job)
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        try:
            held.enter_context(concurrency(name, occupy=1, lease_duration=LEASE_S, strict=True,
                                           timeout_seconds=max(1.0, min(REAP_AFTER_S, 30.0, LEASE_WAIT_S))))
            break
        except TimeoutError as exc:
            freed = reap_dead_holder(job)
            if freed:
                get_run_logger().warning(freed)
            elif time.monotonic() >= deadline:
                raise AlreadyTraining(job, LEASE_WAIT_S) from exc
    root = runtime.flow_run.root_flow_run_id if hasattr(runtime.flow_run, "root_flow_run_id") else None
    Variable.set(holder_name(job), {"flow_run": str(runtime.flow_run.id or ""), "root_flow_run": str(root or ""),
                                    "since": datetime.now(UTC).isoformat()}, overwrite=True)
    held.callback(Variable.unset, holder_name(job))


@flow(name="train-stage", flow_run_name="train-{spec.metadata.name}-at-{site}", log_prints=True)
def train_stage(spec: JobSpec, approved: DatasetVersion, site: str, run_id: str, run_key: str,
                workspace: str | None = None, attempt: int = 1) -> Trained:
    ws = run_workspace(workspace)
    try:
        with ExitStack() as held:
            acquire_lease(held, spec.name)
            trained = train(ws, spec, approved, site, run_id, run_key)
        evaluated = evaluate(ws, spec, approved, site, trained.model_uri)
    except Exception as exc:
        save_result(ws, run_id, f"train-attempt-{attempt}", AttemptEnd.of(exc, site))
        raise
    out = Trained(trained=trained, evaluated=evaluated)
    save_result(ws, run_id, "train-stage", out)
    return out
