"""Warm launcher end to end: a real Prefect server, a real process worker, the warm-pool daemon and its spares.

The pool's ``command`` job variable is ``<python> -m workers.warm_client``. Proof that a run
started in a pre-warmed spare (and not in a process the worker spawned for it): the flow's
process started before the flow run was created, its parent is the daemon, a module the daemon
preloads (and the flow never imports) is already imported, and the spare's marker variable is
set. The same probe through a client with no daemon shows the opposite on every count.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridtrain.drill.processes import stop_with_children
from tests.fixtures.workspaces import ROOT
from tests.integration import warm_flows

pytestmark = pytest.mark.slow
POOL = "warm-test"
START_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 60.0


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, *, interval_s: float = 0.1,
             diagnostics: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{diagnostics()}")
        time.sleep(interval_s)


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def log_containing(path: Path, *needles: str) -> str | None:
    text = path.read_text(errors="replace")
    return text if all(n in text for n in needles) else None


def daemon_status(sock: Path) -> dict | None:
    from workers.warm_protocol import query_status

    try:
        return query_status(sock, timeout_s=2.0)
    except OSError:
        return None


def ready_spares(sock: Path) -> list[int]:
    status = daemon_status(sock) or {"spares": []}
    return [s["pid"] for s in status["spares"] if s["state"] == "ready"]


def pid_gone(pid: int) -> bool:
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return proc_stat.rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped


@pytest.fixture(scope="module")
def warm(prefect_server, tmp_path_factory):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus
    from prefect.workers.process import ProcessWorker

    base = tmp_path_factory.mktemp("warm")
    sock = base / "run" / "warm.sock"
    logs = {"daemon": base / "daemon.log", "worker": base / "worker.log"}
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                               base_job_template=ProcessWorker.get_default_base_job_template()),
                                overwrite=True)
    command = f"{sys.executable} -m workers.warm_client"
    deployments = {}
    # The job env sets a logging setting to another value than the daemon's environment has, so spares
    # must rebuild Prefect's logging configuration. (The worker must not set it: a setting in the
    # worker's environment overrides the job env, for cold engines too — EngineCommandStarter.start.)
    job_env = {"WARM_TEST_JOB_ENV": "set", "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain,warm_probe_extra"}
    for fl in (warm_flows.warm_probe, warm_flows.warm_exit, warm_flows.warm_sleep):
        fl.from_source(source=str(ROOT), entrypoint=f"tests/integration/warm_flows.py:{fl.fn.__name__}").deploy(
            name=POOL, work_pool_name=POOL, job_variables={"command": command, "env": job_env},
            print_next_steps=False, ignore_warnings=True)
        deployments[fl.name] = f"{fl.name}/{POOL}"
    # The failing flow twice, warm and cold, each command wrapped to record the exit code the worker sees.
    for kind, module in (("warm", "workers.warm_client"), ("cold", "prefect.engine")):
        script = f'"$0" -m {module}; rc=$?; echo $rc > "$1/$PREFECT__FLOW_RUN_ID.{kind}-rc"; exit $rc'
        warm_flows.warm_fail.from_source(source=str(ROOT), entrypoint="tests/integration/warm_flows.py:warm_fail").deploy(
            name=f"{kind}-rc", work_pool_name=POOL, print_next_steps=False, ignore_warnings=True,
            job_variables={"command": shlex.join(["sh", "-c", script, sys.executable, str(base)])})
        deployments[f"{kind}-fail"] = f"warm-fail/{kind}-rc"
    # The same probe with a socket nobody listens on: the client must fall back to a cold engine.
    warm_flows.warm_probe.from_source(source=str(ROOT), entrypoint="tests/integration/warm_flows.py:warm_probe").deploy(
        name="no-daemon", work_pool_name=POOL, print_next_steps=False, ignore_warnings=True,
        job_variables={"command": command, "env": {**job_env, "HYBRIDTRAIN_WARM_SOCKET": str(base / "run" / "nobody.sock")}})
    deployments["no-daemon"] = "warm-probe/no-daemon"

    # A preloaded module the tests own, to edit between runs (stale-code detection).
    (base / "warm_stale_probe.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "HYBRIDTRAIN_WARM_SOCKET": str(sock),
           "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(base), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_HEARTBEAT_SECONDS": "5"}
    fhs = [open(logs["daemon"], "wb"), open(logs["worker"], "wb")]
    worker_env = {k: v for k, v in env.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
    daemon = subprocess.Popen([sys.executable, "-m", "workers.warm_pool", "--spares", "2",
                               "--preload", f"{warm_flows.PRELOADED},warm_stale_probe", "--kill-grace", "5"],
                              cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=fhs[0], stderr=subprocess.STDOUT)
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
                              cwd=ROOT, env=worker_env, stdin=subprocess.DEVNULL, stdout=fhs[1], stderr=subprocess.STDOUT)
    ctx = {"sock": sock, "daemon": daemon, "worker": worker, "logs": logs, "base": base, "deployments": deployments,
           "env": env}

    def diagnostics() -> str:
        return f"--- daemon log ---\n{tail(logs['daemon'])}\n--- worker log ---\n{tail(logs['worker'])}"

    ctx["diagnostics"] = diagnostics

    def online() -> bool:
        for name, proc in (("daemon", daemon), ("worker", worker)):
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}\n{diagnostics()}")
        with get_client(sync_client=True) as client:
            workers = client.read_workers_for_work_pool(
                POOL, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])))
        return bool(workers) and len(ready_spares(sock)) == 2

    try:
        wait_for("worker online and 2 ready spares", online, START_TIMEOUT_S, interval_s=0.25, diagnostics=diagnostics)
        yield ctx
    finally:
        stop_with_children(worker, daemon)
        for fh in fhs:
            fh.close()


def run(warm, deployment: str, parameters: dict[str, Any], timeout: float = RUN_TIMEOUT_S):
    from prefect.deployments import run_deployment

    flow_run = run_deployment(warm["deployments"][deployment], parameters=parameters, timeout=timeout,
                              poll_interval=0.25)
    if timeout and not (flow_run.state and flow_run.state.is_final()):
        raise AssertionError(f"flow run not final after {timeout:g} s: {flow_run.state}\n{warm['diagnostics']()}")
    return flow_run


def assert_probe_logs_shipped_once(warm, flow_run, token: str) -> None:
    """print (log_prints), the run logger and both extra loggers reached the flow run's logs, once each."""
    expected = {f"print-{token}", f"logger-{token}", f"extra-{token}", f"both-{token}"}
    logs = wait_for("the flow run's logs", lambda: (m := flow_run_logs(flow_run.id)) and expected <= set(m) and m,
                    20.0, diagnostics=lambda: f"API logs: {flow_run_logs(flow_run.id)}\n{warm['diagnostics']()}")
    assert all(logs.count(message) == 1 for message in expected), logs


def read_flow_run(flow_run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def flow_run_logs(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]


def test_flow_run_starts_in_a_prewarmed_spare_and_its_output_reaches_prefect(warm):
    spares_before = ready_spares(warm["sock"])
    token = uuid.uuid4().hex[:12]
    out = warm["base"] / f"probe-{token}.json"
    flow_run = run(warm, "warm-probe", {"out": str(out), "token": token})

    assert flow_run.state.is_completed(), (flow_run.state, warm["diagnostics"]())
    report = json.loads(out.read_text())
    assert report["ppid"] == warm["daemon"].pid  # a child of the daemon, not of the worker
    assert report["pid"] in spares_before  # one of the spares that was ready before the run existed
    assert report["process_started_at"] < flow_run.created.timestamp()
    assert report["preloaded_module_present"] is True
    marker = json.loads(report["spare_marker"])
    assert marker["daemon_pid"] == warm["daemon"].pid and marker["spare_pid"] == report["pid"]
    assert report["job_env"] == "set"  # the job variables' env reached the flow

    # Output: print/logger records in the flow run's logs; raw fd 1/2 writes streamed by the worker.
    assert_probe_logs_shipped_once(warm, flow_run, token)
    worker_log = wait_for("streamed output in the worker's log",
                          lambda: log_containing(warm["logs"]["worker"], f"stdout-{token}", f"stderr-{token}"),
                          20.0, diagnostics=warm["diagnostics"])
    assert "warm launcher:" not in worker_log  # no fallback happened

    # One run per spare: the spare is gone and the daemon is back to two ready spares without it.
    wait_for("the used spare to exit", lambda: pid_gone(report["pid"]), 15.0)
    wait_for("two ready spares again", lambda: len(ready_spares(warm["sock"])) == 2, 30.0,
             diagnostics=warm["diagnostics"])
    assert report["pid"] not in ready_spares(warm["sock"])


def test_a_failing_flow_ends_failed_with_the_exit_code_of_a_cold_engine(warm):
    codes = {}
    for kind in ("warm", "cold"):
        flow_run = run(warm, f"{kind}-fail", {})
        assert flow_run.state.is_failed(), (kind, flow_run.state, warm["diagnostics"]())
        assert "deliberate failure" in (flow_run.state.message or ""), flow_run.state.message
        rc_file = warm["base"] / f"{flow_run.id}.{kind}-rc"
        codes[kind] = int(wait_for(f"{kind} exit code", lambda: rc_file.exists() and rc_file.read_text(), 10.0))

    # Prefect 3.8.8's engine exits 0 once it has reported the final state (engine.py,
    # handle_engine_signals / engine_outcome_is_handled); the warm client must exit the same way.
    assert codes["warm"] == codes["cold"], codes


@pytest.mark.parametrize(("code", "expected"), [(7, "status code: 7"), (-signal.SIGKILL, "status code: -9")])
def test_the_worker_sees_the_spares_exit_status(warm, code, expected):
    wait_for("a ready spare", lambda: ready_spares(warm["sock"]), 30.0, diagnostics=warm["diagnostics"])
    flow_run = run(warm, "warm-exit", {"code": code})

    # The worker turns a non-zero exit of its child (the client) into Crashed, quoting the code.
    assert flow_run.state.is_crashed(), (flow_run.state, warm["diagnostics"]())
    assert expected in (flow_run.state.message or ""), flow_run.state.message


def test_cancelling_a_running_flow_run_terminates_its_spare(warm):
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    wait_for("a ready spare", lambda: ready_spares(warm["sock"]), 30.0, diagnostics=warm["diagnostics"])
    pid_file = warm["base"] / f"sleep-{uuid.uuid4().hex[:8]}.pid"
    flow_run = run(warm, "warm-sleep", {"pid_file": str(pid_file)}, timeout=0)
    pid = int(wait_for("the flow to start", lambda: pid_file.exists() and pid_file.read_text(), RUN_TIMEOUT_S,
                       diagnostics=warm["diagnostics"]))

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Cancelling())
        final = wait_for("the flow run to be cancelled",
                         lambda: (fr := client.read_flow_run(flow_run.id)).state.is_final() and fr, 45.0,
                         interval_s=0.25, diagnostics=warm["diagnostics"])

    assert final.state.is_cancelled(), (final.state, warm["diagnostics"]())
    wait_for(f"spare pid {pid} to exit", lambda: pid_gone(pid), 15.0, diagnostics=warm["diagnostics"])
    # The worker's SIGTERM reached the spare through the client, after Prefect's control channel had
    # told the engine to expect it: the engine ended the run itself and exited 0 (not killed, -15).
    daemon_log = wait_for("the spare's exit in the daemon's log", lambda: log_containing(
        warm["logs"]["daemon"], f"flow run {flow_run.id} in spare pid {pid} exited with"), 15.0)
    assert f"forwarding signal {int(signal.SIGTERM)} to spare pid {pid}" in daemon_log
    assert f"flow run {flow_run.id} in spare pid {pid} exited with 0" in daemon_log


def test_the_client_falls_back_to_a_cold_engine_without_a_daemon(warm):
    token = uuid.uuid4().hex[:12]
    out = warm["base"] / f"cold-{token}.json"
    flow_run = run(warm, "no-daemon", {"out": str(out), "token": token})

    assert flow_run.state.is_completed(), (flow_run.state, warm["diagnostics"]())
    report = json.loads(out.read_text())
    assert report["ppid"] == warm["worker"].pid  # the client exec'd the engine: the worker's own child
    assert report["spare_marker"] is None and report["preloaded_module_present"] is False
    assert report["process_started_at"] > flow_run.created.timestamp()
    assert_probe_logs_shipped_once(warm, flow_run, token)  # the same records as from a warm spare
    wait_for("the fallback notice in the worker's log",
             lambda: log_containing(warm["logs"]["worker"], "warm launcher: no daemon listening at"),
             20.0, diagnostics=warm["diagnostics"])


def test_the_socket_is_private_and_a_shared_directory_is_refused(warm, tmp_path):
    assert stat.S_IMODE(warm["sock"].stat().st_mode) == 0o600
    assert stat.S_IMODE(warm["sock"].parent.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    for path, message in ((shared / "warm.sock", "chmod 700"), (warm["sock"], "already listens")):
        proc = subprocess.run([sys.executable, "-m", "workers.warm_pool", "--socket", str(path)], cwd=ROOT,
                              env=warm["env"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (shared / "warm.sock").exists()


def test_a_run_for_another_python_environment_is_declined(warm):
    from workers.warm_protocol import EventReader, send_request

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, open(os.devnull, "rb+") as null:
        conn.settimeout(10)
        conn.connect(str(warm["sock"]))
        send_request(conn, {"op": "run", "flow_run_id": None, "argv": [], "env": {}, "cwd": "/",
                            "python": {"executable": "/elsewhere/bin/python", "prefix": "/elsewhere",
                                       "version": sys.version}}, [null.fileno()] * 3)
        answer = EventReader(conn).read()

    assert answer["event"] == "rejected" and "/elsewhere/bin/python" in answer["reason"]


def test_a_vanished_client_takes_its_spare_with_it(warm):
    wait_for("a ready spare", lambda: ready_spares(warm["sock"]), 30.0, diagnostics=warm["diagnostics"])
    pid_file = warm["base"] / f"sleep-{uuid.uuid4().hex[:8]}.pid"
    flow_run = run(warm, "warm-sleep", {"pid_file": str(pid_file)}, timeout=0)
    pid = int(wait_for("the flow to start", lambda: pid_file.exists() and pid_file.read_text(), RUN_TIMEOUT_S,
                       diagnostics=warm["diagnostics"]))
    status = daemon_status(warm["sock"])
    client_pid = next(s["client_pid"] for s in status["spares"] if s["pid"] == pid)

    os.kill(client_pid, signal.SIGKILL)  # what the worker does when a child ignores SIGTERM

    wait_for(f"spare pid {pid} to exit", lambda: pid_gone(pid), 15.0, diagnostics=warm["diagnostics"])
    assert log_containing(warm["logs"]["daemon"], f"client of flow run {flow_run.id} is gone: terminating spare pid {pid}")
    final = wait_for("the flow run to end", lambda: (fr := read_flow_run(flow_run.id)).state.is_final() and fr, 30.0,
                     interval_s=0.25, diagnostics=warm["diagnostics"])
    assert final.state.is_crashed(), final.state


def test_edited_project_code_is_never_run_from_a_stale_spare(warm):
    stale_spares = wait_for("two ready spares", lambda: len(s := ready_spares(warm["sock"])) == 2 and s, 30.0,
                            diagnostics=warm["diagnostics"])
    module = warm["base"] / "warm_stale_probe.py"
    module.write_text("VALUE = 2\n")
    later = time.time() + 5
    os.utime(module, (later, later))  # a distinct mtime even on coarse-grained file systems

    token = uuid.uuid4().hex[:12]
    out = warm["base"] / f"stale-{token}.json"
    flow_run = run(warm, "warm-probe", {"out": str(out), "token": token})

    assert flow_run.state.is_completed(), (flow_run.state, warm["diagnostics"]())
    report = json.loads(out.read_text())
    assert report["pid"] in stale_spares  # the spare took the run ...
    assert report["spare_marker"] is None and report["preloaded_module_present"] is False  # ... as a fresh engine
    wait_for("the stale-code notice in the worker's log", lambda: log_containing(
        warm["logs"]["worker"], "warm_stale_probe.py changed after this spare imported it"), 20.0)
    fresh = wait_for("fresh spares", lambda: len(s := ready_spares(warm["sock"])) == 2 and not set(s) & set(stale_spares)
                     and s, 30.0, diagnostics=warm["diagnostics"])

    token = uuid.uuid4().hex[:12]
    out = warm["base"] / f"fresh-{token}.json"
    assert run(warm, "warm-probe", {"out": str(out), "token": token}).state.is_completed()
    report = json.loads(out.read_text())
    assert report["pid"] in fresh and report["spare_marker"] is not None
