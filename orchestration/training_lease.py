"""TrainingLease: one training of a job at a time, held as a Prefect global concurrency slot.

The train stage holds a lease on the job (a Prefect global concurrency limit ``train-<job>`` with one
slot, renewed while the stage lives, expiring ``LEASE_S`` after its process dies), so a resubmitted
or duplicated run waits for the first to end instead of training beside it, saying once whom it
waits for. The holder and its lease id are written to the Prefect variable ``train-lease-<job>``
when the lease is taken, and marked ``released`` just before the holder gives the slot back. A
server without the lease reaper (the repossessor service does not run in ephemeral servers) leaves
a dead holder's slot taken, so a waiting stage frees it itself once the holder's run (or the
lifecycle above it) has ended and the lease is older than ``REAP_AFTER_S`` (its expiry plus the
reaper's period):

- the server still has the lease: the stage revokes that very lease, which never frees a slot
  somebody else holds;
- the server no longer has it and the record is not marked released: the lease went with the
  server that granted it (the embedded default keeps leases in its process's memory, and a
  ``kill -9`` of ``hybridtrain run`` takes its server along), while the slot count is kept in the
  database, so the stage gives the slot back by name (``give_back_slots``), after deleting the
  record (so that of several waiting stages only one gives it back);
- marked released: the slot is held by a newer holder that has not written its record yet; the
  stage waits.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from types import TracebackType
from uuid import UUID

from prefect import get_run_logger, runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, VariableCreate, VariableUpdate
from prefect.concurrency._leases import maintain_concurrency_lease
from prefect.concurrency._sync import acquire_concurrency_slots_with_lease, release_concurrency_slots_with_lease

# Pinned Prefect 3.8.8: the pieces of prefect.concurrency.sync.concurrency(), used directly for the lease id.
from prefect.concurrency.context import ConcurrencyContext
from prefect.exceptions import MissingContextError, ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
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

    def __init__(self, job: str, waited_s: float, holder: str = ""):
        held_by = f", by {holder}" if holder else ""
        super().__init__(f"job {job!r} is already training in another run (lease train-{job} held for {waited_s:.0f} s"
                         f"{held_by}); wait for it to end, or cancel it in the Prefect UI")


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


def _age_s(since: str) -> float:
    return (datetime.now(UTC) - datetime.fromisoformat(since)).total_seconds()


def holder_ended_long_ago(record: dict) -> bool:
    """Whether a recorded lease holder may be freed: its lease is older than ``REAP_AFTER_S`` (it should
    have expired) and its run, or the run above it, has ended. The GPU leases use the same rule."""
    return _age_s(record["since"]) >= REAP_AFTER_S and holder_is_gone(record)


def lease_known(lease_id: UUID) -> bool:
    """Whether the server still has the lease ``lease_id``. One it has revoked (released, or expired and reaped),
    or lost with the server process that granted it, is answered ``410 Gone`` on renewal. Renewing the lease of a
    holder that has ended, just before revoking it, changes nothing."""
    with get_client(sync_client=True) as client:
        try:
            client.renew_concurrency_lease(lease_id, lease_duration=LEASE_S)
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code in (404, 410):
                return False
            raise
    return True


def give_back_slots(names: list[str], slots: int, since: str) -> None:
    """Give back ``slots`` of each limit in ``names`` by name: the slots of a lease the server no longer has,
    taken at ``since``, which revoking by lease id cannot give back (the server's decrement stops at 0)."""
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots(names=names, slots=slots, occupancy_seconds=max(1.0, _age_s(since)))


def _forget_holder(job: str) -> bool:
    """Delete the job's holder record; False when it was gone already (another waiting stage deleted it first)."""
    with get_client(sync_client=True) as client:
        try:
            client.delete_variable_by_name(holder_name(job))
        except ObjectNotFound:
            return False
    return True


def reap_dead_holder(job: str, tried: set[str]) -> str | None:
    """Free the job's lease if its recorded holder has ended and its lease should have expired (module docstring).

    A live holder is never freed: a lease still on the server is revoked by its id, and a slot is given back by
    name only when its recorded holder has ended without marking the record released. Each lease is looked at
    once (``tried``); after that the record is stale and the wait goes on. Returns the line to log, or None.
    """
    record = Variable.get(holder_name(job), default=None)
    if not isinstance(record, dict) or not record.get("lease_id") or record["lease_id"] in tried:
        return None
    if not holder_ended_long_ago(record):
        return None
    tried.add(record["lease_id"])
    lease = UUID(record["lease_id"])
    holder = f"flow run {record.get('flow_run')}"
    if lease_known(lease):
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        return f"freed the training lease of job {job!r}: its holder, {holder}, has ended"
    if record.get("released") or not _forget_holder(job):
        return None  # given back already: the slot is a newer holder's; or another waiting stage is freeing it
    give_back_slots([lease_name(job)], 1, record["since"])
    return (f"freed the training lease of job {job!r}: its holder, {holder}, has ended without giving it back, "
            "and the Prefect server that granted it no longer has the lease (its server was stopped with it)")


def describe_holder(record: object) -> str:
    """Who holds the job's lease, from its record: ``flow run R (since T UTC)``, or what is known."""
    if not isinstance(record, dict) or not record.get("lease_id"):
        return "a run that has not recorded itself"
    if record.get("released"):
        return "a run that has not recorded itself yet"
    since = str(record.get("since", ""))[:19].replace("T", " ")
    return f"flow run {record.get('flow_run') or '?'} (since {since} UTC)"


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("hybridtrain.orchestration")


ExitCallback = Callable[[type[BaseException] | None, BaseException | None, TracebackType | None], bool]


def give_back(what: str, action: Callable[[], object]) -> ExitCallback:
    """An ``ExitStack.push`` callback that runs ``action`` (giving back a lease) when the block ends.

    Leaving the block normally, ``action``'s error is raised. Leaving it by an exception (a failed
    stage, Ctrl-C's ``KeyboardInterrupt``) that exception goes on: ``action`` failing too (say, the
    server cannot be reached) is logged as a warning instead of replacing it. A waiting run frees
    what was not given back once this run has ended (``reap_dead_holder``).
    """
    def exit_(exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        try:
            action()
        except Exception as err:
            if exc is None:
                raise
            _logger().warning("could not %s while stopping (%s: %s); the next run that needs it frees it once this "
                              "one has ended", what, type(err).__name__, err)
        return False
    return exit_


def release_lease(lease_id: UUID) -> None:
    release_concurrency_slots_with_lease(lease_id)
    ctx = ConcurrencyContext.get()  # released: the run's context need not release it again on exit
    if ctx is not None and lease_id in ctx.cleanup_lease_ids:
        ctx.cleanup_lease_ids.remove(lease_id)


def acquire_lease(held: ExitStack, job: str) -> None:
    """Take the job's training lease, waiting (and freeing a dead holder's) up to ``LEASE_WAIT_S``.

    Prefect's ``concurrency()`` context manager does not expose the lease id, which the holder
    record needs; this is its body (acquire, renew in the background, release) with the id kept.
    While it waits it logs whom it waits for, once per holder.
    """
    name = ensure_lease(job)
    deadline = time.monotonic() + LEASE_WAIT_S
    tried: set[str] = set()
    said = None
    while True:
        try:
            granted = acquire_concurrency_slots_with_lease(
                [name], 1, lease_duration=LEASE_S, strict=True,
                timeout_seconds=max(1.0, min(REAP_AFTER_S, 30.0, LEASE_WAIT_S)))
            break
        except TimeoutError as exc:
            holder = describe_holder(Variable.get(holder_name(job), default=None))
            if holder != said:
                get_run_logger().info("waiting for the training lease of job %r (train-%s), held by %s; "
                                      "up to %.0f s in all", job, job, holder, LEASE_WAIT_S)
                said = holder
            freed = reap_dead_holder(job, tried)
            if freed:
                get_run_logger().warning(freed)
            elif time.monotonic() >= deadline:
                raise AlreadyTraining(job, LEASE_WAIT_S, holder) from exc
    lease_id = granted.lease_id
    held.push(give_back(f"release the training lease of job {job!r}", lambda: release_lease(lease_id)))
    held.enter_context(maintain_concurrency_lease(lease_id, LEASE_S, raise_on_lease_renewal_failure=True))
    root = runtime.flow_run.root_flow_run_id if hasattr(runtime.flow_run, "root_flow_run_id") else None
    record = {"flow_run": str(runtime.flow_run.id or ""), "root_flow_run": str(root or ""),
              "lease_id": str(lease_id), "since": datetime.now(UTC).isoformat()}
    record_holder(job, record)
    # Marked released before the slot is given back (the block unwinds last in, first out): while the slot is
    # held no other holder writes the record, so the mark never lands on a newer holder's record.
    held.push(give_back(f"mark the training lease of job {job!r} released",
                        lambda: record_holder(job, {**record, "released": datetime.now(UTC).isoformat()})))


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
