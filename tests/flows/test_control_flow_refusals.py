"""The control flows refuse wrong parameters before they touch a run, on a real Prefect server.

recover-runs with a heartbeat timeout shorter than a worker's heartbeats used to find a healthy run's pool silent,
force the run CRASHED and train the job a second time; the burst controller took any interval as its margin. A
refused call now leaves every run as it was, starts none and writes no audit record. The run recover-runs does
resubmit is a run of its deployment, not a subflow of the recovery pass (cancelling the pass would cancel it).

A number outside the bounds in a parameter's type is refused by the server for a deployment run
(tests/flows/test_parameter_bounds.py) and by Prefect's validation for a direct call; the flows' own checks below
run with ``validate_parameters=False``, as for a call that skips that validation.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hybridtrain.errors import SpecError

pytestmark = pytest.mark.slow


@pytest.fixture
def lifecycle_pool(prefect_server, workspace):
    """A work pool with a live worker (one heartbeat now) and a deployment of the lifecycle flow in it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"refusals-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = client.create_flow_from_name("training-lifecycle")
        deployment = client.create_deployment(flow_id, f"{pool}-lifecycle", work_pool_name=pool,
                                              entrypoint="flows/lifecycle.py:lifecycle")
        client.send_worker_heartbeat(pool, "alive", heartbeat_interval_seconds=30)
    made: list = []
    yield {"pool": pool, "deployment": deployment, "made": made, "root": workspace}
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs(work_pool_filter=in_pool(pool), limit=200):
            client.delete_flow_run(run.id)
        client.delete_deployment(deployment)
        client.delete_work_pool(pool)


def lifecycle_run(env, state):
    """A run of the lifecycle deployment, started now and put in ``state`` (its own job, so no run hides another)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(env["deployment"],
                                                     parameters={"spec_path": f"jobs/{uuid.uuid4().hex}.yaml"})
        client.set_flow_run_state(run.id, Running(), force=True)
        if state is not None:
            client.set_flow_run_state(run.id, state, force=True)
        return client.read_flow_run(run.id)


def in_pool(pool: str):
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    return WorkPoolFilter(name=WorkPoolFilterName(any_=[pool]))


def pool_runs(env) -> dict:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {r.id: (r.state.type, tuple(sorted(r.tags or [])))
                for r in client.read_flow_runs(work_pool_filter=in_pool(env["pool"]), limit=200)}


def audit(root) -> list:
    from hybridtrain.governance.audit_log import AuditLog

    return list(AuditLog.in_workspace(root).records()) if (root / ".hybridtrain").exists() else []


@pytest.mark.parametrize("params", [
    {"heartbeat_timeout_s": 0}, {"heartbeat_timeout_s": -1}, {"heartbeat_timeout_s": 30},
    {"lookback_hours": -5}, {"flow_name": ""},
])
def test_recover_runs_refuses_before_it_touches_a_healthy_run(lifecycle_pool, params):
    from flows.recovery import recover_runs

    env = lifecycle_pool
    healthy = lifecycle_run(env, None)  # RUNNING, and its pool's worker beat just now
    before = pool_runs(env)
    with pytest.raises(SpecError) as exc:
        recover_runs.with_options(validate_parameters=False)(workspace=str(env["root"]), **params)
    assert [p.path for p in exc.value.problems] == list(params)
    assert pool_runs(env) == before  # not crashed, nothing resubmitted, no tag
    assert before[healthy.id][0].value == "RUNNING"
    assert audit(env["root"]) == []


def test_recover_runs_reports_every_wrong_parameter_and_the_workspace_at_once(lifecycle_pool, tmp_path):
    from flows.recovery import recover_runs

    with pytest.raises(SpecError) as exc:
        recover_runs.with_options(validate_parameters=False)(workspace=str(tmp_path / "nope"), flow_name="",
                                                             heartbeat_timeout_s=0, lookback_hours=0)
    assert [p.path for p in exc.value.problems] == ["workspace", "flow_name", "heartbeat_timeout_s", "lookback_hours"]
    assert f"{tmp_path / 'nope'} does not exist" in str(exc.value)


def test_the_resubmitted_run_is_not_a_subflow_of_the_recovery_pass(lifecycle_pool):
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from flows.recovery import recover_runs

    env = lifecycle_pool
    crashed = lifecycle_run(env, Crashed(message="its host died"))
    alive = lifecycle_run(env, None)
    # A window of the last minute: only this test's runs, whatever else the session's server holds.
    rows = {r["flow_run"]: r for r in recover_runs(workspace=str(env["root"]), lookback_hours=1 / 60)}
    assert str(alive.id) not in rows  # its worker is alive
    new_id = rows[str(crashed.id)]["resubmitted"]
    with get_client(sync_client=True) as client:
        new = client.read_flow_run(new_id)
    assert new.parent_task_run_id is None and new.deployment_id == env["deployment"]
    assert f"recovered-from:{crashed.id}" in new.tags


def test_a_direct_call_with_numbers_out_of_bounds_is_refused_by_prefect_before_it_touches_a_run(lifecycle_pool):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ParameterTypeError

    from flows.recovery import recover_runs

    env = lifecycle_pool
    lifecycle_run(env, None)
    before = pool_runs(env)
    state = recover_runs(workspace=str(env["root"]), heartbeat_timeout_s=30, lookback_hours=169, return_state=True)
    with get_client(sync_client=True) as client:  # a direct call's run exists before it is validated
        client.delete_flow_run(state.state_details.flow_run_id)
    with pytest.raises(ParameterTypeError, match=r"(?m)^ - heartbeat_timeout_s: .*\n - lookback_hours: "):
        state.result()
    assert pool_runs(env) == before
    assert audit(env["root"]) == []


@pytest.mark.parametrize("interval, validated", [(-5, False), (0, False), (1e308, False), (86401, False),
                                                 (1e308, True), (86401, True)])
def test_the_burst_controller_refuses_an_interval_before_it_reads_a_pool(prefect_server, workspace, interval,
                                                                         validated):
    """Validated (a direct call's default), Prefect refuses it naming ``interval_s``; without that validation, the
    flow's own check does, with its one-line message."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.exceptions import ObjectAlreadyExists, ParameterTypeError
    from prefect.states import Scheduled

    from flows.burst import burst_controller

    with get_client(sync_client=True) as client:
        try:  # the on-prem site's pool (deployments/sites.yaml), as a waiting run would be in it
            client.create_work_pool(WorkPoolCreate(name="onprem", type="process"))
        except ObjectAlreadyExists:
            pass
        flow_id = client.create_flow_from_name("train-stage")
        dep = client.create_deployment(flow_id, f"refusals-{uuid.uuid4().hex[:8]}", work_pool_name="onprem")
        waiting = client.create_flow_run_from_deployment(
            dep, state=Scheduled(scheduled_time=datetime.now(UTC) - timedelta(minutes=10)))
        state = burst_controller.with_options(validate_parameters=validated)(
            workspace=str(workspace), interval_s=interval, return_state=True)
        # Prefect on PostgreSQL stores 1e308 as an integer it cannot list again (every runs list fails with a
        # 500): a direct call's run is created before any validation, so the pass's own run goes, and the
        # session's server stays usable.
        client.delete_flow_run(state.state_details.flow_run_id)
        try:
            assert state.is_failed()
            if validated:
                with pytest.raises(ParameterTypeError, match=r"(?m)^ - interval_s: "):
                    state.result()
            else:
                with pytest.raises(SpecError) as exc:
                    state.result()
                [problem] = exc.value.problems
                assert problem.path == "interval_s" and "give the seconds between passes" in problem.message
            after = client.read_flow_run(waiting.id)
            assert after.state.is_scheduled() and after.state.id == waiting.state.id  # not moved, not touched
            mine = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
            assert [r.id for r in mine] == [waiting.id]
        finally:
            client.delete_flow_run(waiting.id)
            client.delete_deployment(dep)
    assert audit(workspace) == []
