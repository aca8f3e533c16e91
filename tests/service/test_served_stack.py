"""The served stack on real parts: Prefect on PostgreSQL with its services on, MLflow server on PostgreSQL + S3, workers.

Everything goes the way users' work goes: `scripts/stack.py up` (= `make up`) starts it, schedules
fire through the server's own scheduler, process workers run the flows, `hybridtrain doctor` reads
it. In order: the doctor sees every part healthy; the burst controller and the recovery run on their
own (shortened) schedules; a lifecycle run killed mid-flight is resubmitted by the scheduled recovery
and finishes; runs queued across `down` + `up` all finish (the load benchmark, small); and with
PostgreSQL stopped under a running server the doctor names the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hybridtrain.drill.timeline import wait_until
from hybridtrain.service.stack import Stack
from tests.fixtures.prefect_api import prefect_api_at
from tests.fixtures.workspaces import ROOT
from tests.service.conftest import FAST_SCHEDULER, hybridtrain_cli, stack_cli

pytestmark = pytest.mark.slow
WAIT_S = 600.0


@pytest.fixture(scope="module")
def client_env(served):
    stack = Stack.load(served)
    env = {k: v for k, v in stack.client_env().items() if k in ("PREFECT_API_URL", "HYBRIDTRAIN_HOME",
                                                                "HYBRIDTRAIN_MLFLOW_TRACKING_URI")}
    old = {k: os.environ.get(k) for k in (*env, "PREFECT_HOME")}
    os.environ.pop("PREFECT_HOME", None)
    os.environ.update(env)
    with prefect_api_at(stack.prefect_api):
        # Their schedules (every 10 s here) only in the tests about them (``control_flows_on``): a pass every 5 s
        # is a process start each, CPU the other tests — and the other test worker — need.
        control_schedules(paused=True)
        yield stack
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


CONTROL_DEPLOYMENTS = ("burst-controller/control", "recover-runs/control")


def control_schedules(*, paused: bool) -> None:
    """Pause the control flows' deployments (Prefect deletes their scheduled runs) or resume them."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in CONTROL_DEPLOYMENTS:
            dep = client.read_deployment_by_name(name)
            (client.pause_deployment if paused else client.resume_deployment)(dep.id)


@pytest.fixture
def control_flows_on(client_env):
    """The burst controller's and the recovery's schedules on for the test, as `make up` leaves them."""
    control_schedules(paused=False)
    yield
    control_schedules(paused=True)


def runs_of(flow_name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])), limit=200)


def test_the_doctor_finds_every_part_healthy(served, client_env):
    proc = hybridtrain_cli(served, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for part in ("postgres", "redis", "s3", "mlflow", "prefect api", "prefect database", "prefect services process",
                 "prefect service scheduler", "prefect service late runs", "prefect service foreman", "pool onprem",
                 "pool cloud"):
        assert f"ok      {part}:" in proc.stdout, (part, proc.stdout)
    assert "PostgreSQL 15" in proc.stdout and "2 worker(s) online" in proc.stdout


def test_each_site_pools_workers_share_its_run_limit(served, client_env):
    """The pool's limit is a hard cap: its workers' own ``--limit``s sum to it (the server's cap alone was
    overshot under load); the control pool has no limit and its worker none."""
    from prefect.client.orchestration import get_client

    stack = Stack.load(served)
    with get_client(sync_client=True) as client:
        limits = {pool: client.read_work_pool(pool).concurrency_limit for pool in stack.worker_pools}
    assert limits["onprem"] and limits["cloud"] and limits["control"] is None
    for pool, limit in limits.items():
        shares = []
        for pid_file in stack.run_dir.glob(f"worker-{pool}-*.pid"):
            cmd = (Path("/proc") / pid_file.read_text().strip() / "cmdline").read_bytes().decode().split("\0")
            shares.append(int(cmd[cmd.index("--limit") + 1]) if "--limit" in cmd else None)
        assert shares and (sum(shares) == limit if limit else shares == [None]), (pool, limit, shares)


def niceness(pid: int | str) -> int:
    """A process's nice value (field 19 of /proc/PID/stat; the command name before it may hold spaces)."""
    return int((Path("/proc") / str(pid).strip() / "stat").read_text().rsplit(")", 1)[1].split()[16])


def test_site_pools_runs_yield_the_cpu_to_the_control_plane(served, client_env):
    """The site pools' workers and warm spares (and so the runs they start) run at the stack's ``site_nice``; the
    control plane and the control pool at the servers' own priority."""
    stack = Stack.load(served)
    assert stack.site_nice > 0
    pids = {p.stem: p.read_text() for p in stack.run_dir.glob("*.pid")}
    for name, pid in pids.items():
        pool = name.removeprefix("warm-") if name.startswith("warm-") else (
            name.split("-")[1] if name.startswith("worker-") else None)
        expected = stack.site_nice if pool in stack.pools else 0
        assert niceness(pid) == niceness(os.getpid()) + expected, (name, niceness(pid))
    assert {"prefect-server", "mlflow", "worker-control-1", "worker-onprem-1", "worker-cloud-1"} <= set(pids)


def test_a_sweep_from_a_shell_pointed_at_the_stack_keeps_its_study_in_the_stacks_postgresql(served, client_env):
    """`hybridtrain sweep` with only PREFECT_API_URL at the stack (no storage setting): the study is in database
    ``optuna`` of the stack's PostgreSQL, where the stack's workers (their environment names it) report too; no
    SQLite study file appears in the workspace."""
    import optuna

    from tests.fixtures.workspaces import spec_writer

    stack = Stack.load(served)
    sweep = {"n_trials": 2, "parallelism": 2, "study_name": "served-sweep", "sampler": {"name": "random", "seed": 3},
             "pruner": {"name": "none"}, "parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}}}
    spec = spec_writer(served)("served-sweep", sweep=sweep, model__epochs=1, model__threads=1)
    env = {**os.environ, **stack.client_env()}
    env.pop("PREFECT_HOME", None)
    env.pop("HYBRIDTRAIN_SWEEP_STORAGE")  # found from PREFECT_API_URL, as in a shell after `make up`
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", str(spec), "--dispatch", "inline",
                           "--no-promote", "--home", str(served)], check=False, env=env, capture_output=True, text=True,
                          timeout=WAIT_S, cwd=served)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = optuna.load_study(study_name="served-sweep", storage=stack.db_url("optuna", "psycopg"))
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE"]
    assert not (served / ".hybridtrain" / "sweeps" / "optuna.db").exists()
    assert stack.client_env()["HYBRIDTRAIN_SWEEP_STORAGE"] == stack.db_url("optuna")


def test_the_doctor_names_a_missing_sweeps_database_and_make_up_creates_it(served, client_env):
    """A stack from before the sweeps' database (``make up`` of an earlier version) lacks ``optuna``: the doctor says
    so and what to run; ``up`` again creates it and leaves the running parts alone."""
    import psycopg2

    stack = Stack.load(served)
    conn = psycopg2.connect(host=stack.host, port=stack.postgres_port, user=stack.db_user, password=stack.db_password,
                            dbname="postgres", connect_timeout=10)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute('DROP DATABASE "optuna" WITH (FORCE)')  # the earlier test's study connections too
    conn.close()
    proc = hybridtrain_cli(served, "doctor", "--quiet")
    assert proc.returncode == 1
    assert "PROBLEM postgres: " in proc.stderr and "has no database optuna" in proc.stderr, proc.stderr
    assert "run `make up`" in proc.stderr
    pids = {p.name: p.read_text() for p in stack.run_dir.glob("*.pid")}
    stack_cli(served, "up", "--no-deploy", "--no-doctor")
    assert {p.name: p.read_text() for p in stack.run_dir.glob("*.pid")} == pids  # nothing restarted
    proc = hybridtrain_cli(served, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "databases prefect, mlflow, optuna" in proc.stdout


def test_burst_controller_and_recovery_run_on_their_own_schedules(served, client_env, control_flows_on):
    def completed(flow: str) -> list:
        return [r for r in runs_of(flow) if r.auto_scheduled and r.state and r.state.is_completed()]

    burst = wait_until(lambda: len(done := completed("burst-controller")) >= 2 and done,
                       "two scheduled burst-controller runs to complete", timeout=WAIT_S, every=1.0)
    recovery = wait_until(lambda: completed("recover-runs"), "a scheduled recover-runs run to complete",
                          timeout=WAIT_S, every=1.0)
    assert {r.work_pool_name for r in burst + recovery} == {"control"}  # never behind the runs they supervise
    # Created by the server's scheduler from the interval schedule: scheduled 10 s apart.
    times = sorted(r.expected_start_time for r in runs_of("burst-controller") if r.auto_scheduled)
    assert any(abs((b - a).total_seconds() - 10) < 0.01 for a, b in zip(times, times[1:]))


def test_a_late_onprem_run_is_moved_by_the_scheduled_burst_controller(served, client_env, control_flows_on):
    """As tests/flows/test_placement_and_burst.py, but nobody calls the controller: its schedule does.

    The on-prem GPUs are taken by two running trainings (made through the API, no process behind
    them); the late run waits in a paused queue of the on-prem pool, standing in for "no free slot"
    (the pool's run limit counts runs, not GPUs, so its live workers would otherwise start it).
    """
    from datetime import UTC, datetime, timedelta

    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Running, Scheduled

    from flows.data import prepare_data
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec
    from hybridtrain.workspace import Workspace
    from tests.fixtures.workspaces import spec_writer

    ws = Workspace.resolve(served)
    spec = load_spec(spec_writer(served)("filler", placement__site=None, budget_usd=500, deadline="3h",
                                          resources__gpus=4, resources__max_hours=4))
    run_id = stages.open_run(ws, spec, None)
    approved = prepare_data(spec=spec, run_id=run_id, workspace=str(served)).anon.approved
    params = {"spec": spec.to_dict(), "approved": approved.model_dump(mode="json"), "site": "onprem-dc1",
              "run_id": run_id}
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("train-stage/onprem")
        queue = client.create_work_queue(name="no-free-slot", work_pool_name="onprem")
        client.update_work_queue(queue.id, is_paused=True)
        fillers = []
        for i in range(2):  # 8 of 8 GPUs busy
            fr = client.create_flow_run_from_deployment(dep.id, parameters={**params, "run_key": f"filler-{i}"},
                                                        work_queue_name="no-free-slot")
            client.set_flow_run_state(fr.id, Running(), force=True)
            fillers.append(fr.id)
        late = client.create_flow_run_from_deployment(
            dep.id, parameters={**params, "run_key": "late"}, work_queue_name="no-free-slot",
            state=Scheduled(scheduled_time=datetime.now(UTC) - timedelta(minutes=10)))
        try:
            moved = wait_until(lambda: (r := client.read_flow_run(late.id)).state.is_cancelled() and r,
                               "the scheduled burst controller to move the late run", timeout=WAIT_S, every=1.0)
            assert moved.state.message.startswith("moved:"), moved.state.message
            new_id = moved.state.message.removeprefix("moved:").split(":", 1)[0]
            replacement = client.read_flow_run(new_id)
            assert replacement.work_pool_name == "cloud" and replacement.parameters["site"] == "cloud-eu"
            mover = [r for r in runs_of("burst-controller") if r.auto_scheduled and r.state.is_completed()]
            assert mover, "moved by a scheduled burst-controller run"
        finally:
            for fr_id in [*fillers, *([new_id] if "new_id" in locals() else [])]:
                client.set_flow_run_state(fr_id, Cancelled(message="test over"), force=True)


def test_a_killed_lifecycle_run_is_resubmitted_by_the_scheduled_recovery(served, client_env, control_flows_on):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from flows.recovery import RECOVERED
    from tests.fixtures.processes import flow_run_pids
    from tests.fixtures.workspaces import spec_writer

    spec = spec_writer(served)("killed", model__epochs=1)
    run = run_deployment("training-lifecycle/churn-nightly-cloud-eu", timeout=0,
                         parameters={"spec_path": str(spec.relative_to(served)), "dispatch": "inline"})
    key = str(run.id)
    pids = wait_until(lambda: flow_run_pids(key), "the lifecycle run's process", timeout=WAIT_S, every=0.2)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # the host dies under the run
    with get_client(sync_client=True) as client:
        wait_until(lambda: client.read_flow_run(run.id).state.is_crashed(), "the worker to mark it CRASHED",
                   timeout=WAIT_S, every=0.5)
        # Nobody calls recover_runs here: its schedule (every 10 s) does.
        new = wait_until(lambda: [r for r in runs_of("training-lifecycle") if f"recovered-from:{key}" in (r.tags or [])],
                         "the scheduled recovery to resubmit the run", timeout=WAIT_S, every=1.0)
        assert len(new) == 1
        done = wait_until(lambda: (r := client.read_flow_run(new[0].id)).state.is_final() and r,
                          "the resubmitted run to finish", timeout=WAIT_S, every=1.0)
        assert done.state.is_completed(), done.state
        assert done.parameters["run_key"] == key
        assert RECOVERED in client.read_flow_run(run.id).tags
    # Exactly one resubmission, however many recovery runs looked at it since.
    assert len([r for r in runs_of("training-lifecycle") if f"recovered-from:{key}" in (r.tags or [])]) == 1


def test_runs_queued_across_down_and_up_all_finish(served, client_env, tmp_path):
    out = tmp_path / "load.json"
    env = {**os.environ, **FAST_SCHEDULER}  # the restarted server keeps the test's short scheduler loop
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "control_plane_load.py"), "--home", str(served),
                           "--runs", "2", "--restart", "--timeout", str(WAIT_S), "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=WAIT_S + 900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["states"] == {"COMPLETED": 2}, result
    assert (result["lost"], result["stuck_running"], result["duplicated_trainings"]) == (0, 0, 0)
    assert result["trained_jobs"] == 2 and result["alias_problems"] == [] and result["audit_verify_rc"] == 0
    assert proc.stdout.strip().splitlines()[-1] == "control_plane_lost_runs: 0 of 2 (target 0)"


def test_the_api_and_the_services_run_apart_and_the_doctor_names_stopped_services(served, client_env):
    """The API serves with no background service in its process (they run in ``prefect-background``, talking
    to it through Redis); with that process gone the API stays healthy and the doctor says what stopped."""
    stack = Stack.load(served)
    api_cmd = (Path("/proc") / (stack.run_dir / "prefect-server.pid").read_text().strip() / "cmdline").read_bytes()
    assert b"--no-services" in api_cmd
    pid = int((stack.run_dir / "prefect-background.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
               "the services process to end", timeout=30, every=0.2)
    proc = hybridtrain_cli(served, "doctor", "--quiet")
    assert proc.returncode == 1
    problems = [line for line in proc.stderr.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and problems[0].startswith("PROBLEM prefect services process: not running"), problems
    assert "make up" in problems[0]


def test_the_doctor_names_the_database_when_postgres_stops(served, client_env):
    stack = Stack.load(served)
    cmd = [f"{stack.pg_bin}/pg_ctl", "-D", str(stack.pg_data), "-m", "fast", "-w", "stop"]
    if stack.pg_os_user:
        cmd = ["runuser", "-u", stack.pg_os_user, "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, cwd="/")
    proc = hybridtrain_cli(served, "doctor", "--quiet")
    assert proc.returncode == 1
    problems = [line for line in proc.stderr.splitlines() if line.startswith("PROBLEM")]
    assert problems[0].startswith(f"PROBLEM postgres: 127.0.0.1:{stack.postgres_port}: "), problems
    assert any(p.startswith("PROBLEM prefect database: ") and "503" in p for p in problems), problems
