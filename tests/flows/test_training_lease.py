"""The job's training lease: a dead holder's lease is revoked by the next stage, a live holder's never is."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from tests.fixtures.prefect_api import ended_flow_run_id


def take_lease_without_a_run(job: str):
    """A holder that will never release: acquired outside any flow run, as by a process since killed."""
    from prefect.concurrency._sync import acquire_concurrency_slots_with_lease

    from orchestration.training_lease import LEASE_S, ensure_lease

    return acquire_concurrency_slots_with_lease([ensure_lease(job)], 1, lease_duration=LEASE_S, strict=True)


def record_old_holder(job: str, flow_run: str, lease_id, released: bool = False) -> None:
    """The holder record as ``flow_run`` wrote it an hour ago (``released``: and marked when it gave the lease back)."""
    from orchestration.training_lease import record_holder

    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    record = {"flow_run": flow_run, "root_flow_run": "", "lease_id": str(lease_id), "since": since}
    record_holder(job, {**record, "released": datetime.now(UTC).isoformat()} if released else record)


def take_slot_of_a_lost_lease(job: str) -> str:
    """The job's slot taken by a lease its server no longer has (the embedded server of a ``kill -9``'d run keeps
    leases in memory, the slot count in the database): a slot held by no lease; returns a lease id never granted."""
    from prefect.client.orchestration import get_client

    from orchestration.training_lease import ensure_lease

    with get_client(sync_client=True) as client:
        client.increment_concurrency_slots(names=[ensure_lease(job)], slots=1, mode="concurrency")
    return str(uuid4())


def active_slots(job: str) -> int:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(f"train-{job}").active_slots


def holder_record(job: str) -> dict:
    from prefect.variables import Variable

    from orchestration.training_lease import holder_name

    return Variable.get(holder_name(job))


@pytest.fixture
def quick_lease(monkeypatch):
    import orchestration.training_lease as training

    monkeypatch.setattr(training, "REAP_AFTER_S", 1.0)
    monkeypatch.setattr(training, "LEASE_WAIT_S", 3.0)
    return training


def test_a_dead_holders_lease_is_revoked_and_the_waiting_stage_trains(prefect_server, quick_lease):
    from prefect import flow

    job = "lease-dead-holder"
    dead = take_lease_without_a_run(job)
    record_old_holder(job, ended_flow_run_id(), dead.lease_id)

    @flow
    def second_training() -> int:
        with ExitStack() as held:
            quick_lease.acquire_lease(held, job)
            return active_slots(job)

    state = second_training(return_state=True)
    assert state.result() == 1  # the dead holder's slot was freed and this stage holds the only one
    assert active_slots(job) == 0  # and released it on the way out
    record = holder_record(job)  # the stage recorded itself over the dead holder's record
    assert record["flow_run"] == str(state.state_details.flow_run_id)
    assert record["lease_id"] not in ("", str(dead.lease_id))


def test_the_first_holder_of_a_job_creates_its_record(prefect_server, quick_lease):
    from prefect import flow

    job = "lease-first-holder"

    @flow
    def first_training() -> str:
        with ExitStack() as held:
            quick_lease.acquire_lease(held, job)
            return holder_record(job)["lease_id"]

    state = first_training(return_state=True)
    record = holder_record(job)
    assert record["flow_run"] == str(state.state_details.flow_run_id)
    assert record["lease_id"] == state.result() and record["since"]


def test_a_live_holder_is_never_freed_even_with_a_stale_record(prefect_server, quick_lease):
    from prefect import flow
    from prefect.client.orchestration import get_client

    job = "lease-live-holder"
    released = take_lease_without_a_run(job)
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(released.lease_id)
    live = take_lease_without_a_run(job)  # a new holder that has not written its record yet
    record_old_holder(job, ended_flow_run_id(), released.lease_id, released=True)  # the old holder's, left behind

    @flow
    def duplicate_training() -> None:
        with ExitStack() as held:
            quick_lease.acquire_lease(held, job)

    with pytest.raises(quick_lease.AlreadyTraining, match="already training in another run"):
        duplicate_training()
    assert active_slots(job) == 1  # the live holder keeps its lease
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(live.lease_id)


def test_a_slot_whose_lease_went_with_a_killed_server_is_given_back_once(prefect_server, quick_lease, caplog):
    """A ``kill -9``'d run's embedded server takes the lease along; the slot count stays. The next stage gives it
    back by name, and says for whom it waited."""
    from prefect import flow

    job = "lease-lost-with-server"
    lost = take_slot_of_a_lost_lease(job)
    gone = ended_flow_run_id()
    record_old_holder(job, gone, lost)

    @flow
    def after_a_kill() -> int:
        with ExitStack() as held:
            quick_lease.acquire_lease(held, job)
            return active_slots(job)

    state = after_a_kill(return_state=True)
    assert state.result() == 1  # the lost lease's slot was given back and this stage holds the only one
    assert active_slots(job) == 0  # never below zero: given back once, then released by this stage
    assert f"freed the training lease of job '{job}': its holder, flow run {gone}, has ended without giving it back" \
        in caplog.text
    assert f"waiting for the training lease of job '{job}' (train-{job}), held by flow run {gone}" in caplog.text
    record = holder_record(job)
    assert record["flow_run"] == str(state.state_details.flow_run_id) and record["released"]


def test_a_failed_stage_keeps_its_error_when_its_lease_cannot_be_given_back(prefect_server, quick_lease,
                                                                           monkeypatch, caplog):
    """Unwinding from an error (or Ctrl-C's KeyboardInterrupt) with the server out of reach: that error goes on,
    the failed give-back is a warning, not a ConnectError in its place."""
    import httpx
    from prefect import flow

    job = "lease-unreachable-on-the-way-out"

    def unreachable(lease_id) -> None:
        raise httpx.ConnectError("All connection attempts failed")

    @flow
    def failing_training() -> None:
        with ExitStack() as held:
            quick_lease.acquire_lease(held, job)
            monkeypatch.setattr(quick_lease, "release_concurrency_slots_with_lease", unreachable)
            raise RuntimeError("the stage failed")

    state = failing_training(return_state=True)
    with pytest.raises(RuntimeError, match="the stage failed"):
        state.result()
    assert f"could not release the training lease of job '{job}' while stopping (ConnectError" in caplog.text
    monkeypatch.undo()
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:  # leave the session's server as it was
        client.release_concurrency_slots_with_lease(holder_record(job)["lease_id"])
    assert active_slots(job) == 0
