"""TrainingLease: one training of a job at a time, held as a Prefect global concurrency slot.

The train stage holds a lease on the job (a Prefect global concurrency limit ``train-<job>`` with one
slot, renewed while the stage lives, expiring ``LEASE_S`` after its process dies), so a resubmitted
or duplicated run waits for the first to end instead of training beside it. The holder and its
lease id are written to the Prefect variable ``train-lease-<job>`` when the lease is taken: a server
without the lease reaper (the repossessor service does not run in ephemeral servers) leaves a dead
holder's slot taken, so a waiting stage revokes that very lease itself once the holder's run (or
the lifecycle above it) has ended and the lease is older than ``REAP_AFTER_S`` (its expiry plus the
reaper's period). Revoking by lease id never frees a slot somebody else holds, so the record is
simply left behind on release (no extra write on the way out).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from uuid import UUID

from prefect import get_run_logger, runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, VariableCreate, VariableUpdate
from prefect.concurrency._leases import maintain_concurrency_lease
from prefect.concurrency._sync import acquire_concurrency_slots_with_lease, release_concurrency_slots_with_lease

# Pinned Prefect 3.8.8: the pieces of prefect.concurrency.sync.concurrency(), used directly for the lease id.
from prefect.concurrency.context import ConcurrencyContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
from prefect.variables import Variable

from hybridtrain.errors import HybridtrainError

#: Seconds a dead holder keeps the job's lease (it is renewed while the holder lives; the server's minimum is 60).
LEASE_S = max(60.0, float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_S", "60")))
#: How long a second training of the same job waits for the first to end before it gives up.
LEASE_WAIT_S = float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_WAIT_S", str(6 * 3600)))
#: Age after which a lease whose holder has ended is freed by the waiting stage: past its expiry
#: plus one period of the server's reaper (``server.services.repossessor.loop_seconds``, 15 s).
REAP_AFTER_S = float(os.environ.get("HYBRIDTRAIN_TRAIN_LEASE_REAP_S", str(LEASE_S + 15.0)))


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


def holder_ended_long_ago(record: dict) -> bool:
    """Whether a recorded lease holder may be freed: its lease is older than ``REAP_AFTER_S`` (it should
    have expired) and its run, or the run above it, has ended. The GPU leases use the same rule."""
    age = (datetime.now(UTC) - datetime.fromisoformat(record["since"])).total_seconds()
    return age >= REAP_AFTER_S and holder_is_gone(record)


def reap_dead_holder(job: str, tried: set[str]) -> str | None:
    """Revoke the recorded holder's lease if that holder has ended and its lease should have expired.

    The record names the lease: revoking it is a no-op when that lease was released normally (the
    slot is then held by a newer holder, whose record follows), so a live holder is never freed.
    Each lease is revoked once (``tried``); after that the record is stale and the wait goes on.
    """
    record = Variable.get(holder_name(job), default=None)
    if not isinstance(record, dict) or not record.get("lease_id") or record["lease_id"] in tried:
        return None
    if not holder_ended_long_ago(record):
        return None
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(UUID(record["lease_id"]))
    tried.add(record["lease_id"])
    return f"freed the training lease of job {job!r}: its holder, flow run {record.get('flow_run')}, has ended"


def release_lease(lease_id: UUID) -> None:
    release_concurrency_slots_with_lease(lease_id)
    ctx = ConcurrencyContext.get()  # released: the run's context need not release it again on exit
    if ctx is not None and lease_id in ctx.cleanup_lease_ids:
        ctx.cleanup_lease_ids.remove(lease_id)


def acquire_lease(held: ExitStack, job: str) -> None:
    """Take the job's training lease, waiting (and freeing a dead holder's) up to ``LEASE_WAIT_S``.

    Prefect's ``concurrency()`` context manager does not expose the lease id, which the holder
    record needs; this is its body (acquire, renew in the background, release) with the id kept.
    """
    name = ensure_lease(job)
    deadline = time.monotonic() + LEASE_WAIT_S
    tried: set[str] = set()
    while True:
        try:
            granted = acquire_concurrency_slots_with_lease(
                [name], 1, lease_duration=LEASE_S, strict=True,
                timeout_seconds=max(1.0, min(REAP_AFTER_S, 30.0, LEASE_WAIT_S)))
            break
        except TimeoutError as exc:
            freed = reap_dead_holder(job, tried)
            if freed:
                get_run_logger().warning(freed)
            elif time.monotonic() >= deadline:
                raise AlreadyTraining(job, LEASE_WAIT_S) from exc
    held.callback(release_lease, granted.lease_id)
    held.enter_context(maintain_concurrency_lease(granted.lease_id, LEASE_S, raise_on_lease_renewal_failure=True))
    root = runtime.flow_run.root_flow_run_id if hasattr(runtime.flow_run, "root_flow_run_id") else None
    record_holder(job, {"flow_run": str(runtime.flow_run.id or ""), "root_flow_run": str(root or ""),
                        "lease_id": str(granted.lease_id), "since": datetime.now(UTC).isoformat()})


def record_holder(job: str, record: dict[str, str]) -> None:
    """Write the holder record: one request when it exists (every run after a job's first), as
    ``Variable.set(overwrite=True)`` takes three (read, update, read back)."""
    name = holder_name(job)
    with get_client(sync_client=True) as client:
        try:
            client.update_variable(VariableUpdate(name=name, value=record))
            return
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code != 404:
                raise
        try:
            client.create_variable(VariableCreate(name=name, value=record))
        except ObjectAlreadyExists:  # another stage created it in between: the newest holder writes last
            client.update_variable(VariableUpdate(name=name, value=record))


