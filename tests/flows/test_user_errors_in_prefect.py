"""A user's mistake (a ``HybridtrainError``) in a flow run's log, as the Prefect UI shows it: one ERROR line, its
message, no traceback; a bug (any other exception) keeps its traceback (``orchestration.user_errors``).

The runs execute on the session's Prefect server, in this process (as ``hybridtrain run`` and the tests run flows)
and in a process of their own started the way a worker starts a flow run's process; their logs are read back
from the API, as the UI reads them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from tests.fixtures.workspaces import ROOT

LOG_TIMEOUT_S = 60.0


def run_logs(run_id: str, until: str = "Finished in state") -> list:
    """The run's log lines (oldest first), once ``until`` is among them (lines arrive in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    deadline = time.monotonic() + LOG_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                                    sort=LogSort.TIMESTAMP_ASC)
            if any(until in log.message for log in logs):
                return logs
            if time.monotonic() > deadline:
                pytest.fail(f"no {until!r} line in the log of flow run {run_id} after {LOG_TIMEOUT_S:.0f} s: "
                            f"{[log.message for log in logs]}")
            time.sleep(0.2)


def errors(logs: list) -> list[str]:
    return [log.message for log in logs if log.level >= logging.ERROR]


def in_a_process_of_its_own(prefect_server: str, entrypoint: str, flow_obj, parameters: dict) -> tuple[str, str]:
    """Run ``flow_obj`` as a worker's flow-run process does: a flow run made on the server, then the engine in a
    new interpreter (``python -m prefect.flow_engine ENTRYPOINT``, which logs the run's end with
    ``error_logger``). Returns the flow run's id and the process's output."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(flow_obj, parameters=parameters)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PREFECT__FLOW_RUN_ID": str(run.id)}
    proc = subprocess.run([sys.executable, "-m", "prefect.flow_engine", entrypoint], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state is not None and state.is_failed(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return str(run.id), proc.stdout + proc.stderr


def test_a_user_error_is_one_line_without_a_traceback_and_still_raises(prefect_server):
    from prefect import flow, runtime

    import flows  # noqa: F401  - installs orchestration.user_errors, as for every flow
    from hybridtrain.errors import Problem, SpecError

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):  # another handler of the run's logger, such as the CLI's run log file
        def emit(self, record):
            seen.append(record)

    ids: list[str] = []

    @flow(name="spec-mistake")
    def spec_mistake() -> None:
        ids.append(str(runtime.flow_run.id))
        raise SpecError("parameters", [Problem("interval_s", "-5 is not an interval; give the seconds, > 0")])

    keep = Keep()
    logging.getLogger("prefect.flow_runs").addHandler(keep)
    try:
        with pytest.raises(SpecError) as raised:
            spec_mistake()
    finally:
        logging.getLogger("prefect.flow_runs").removeHandler(keep)
    assert raised.value.problems[0].path == "interval_s"  # how the exception propagates is unchanged
    logs = run_logs(ids[0])
    assert errors(logs) == [str(raised.value)]
    assert str(raised.value) == ("parameters: 1 problem found; fix and re-run:\n"
                                 "  - interval_s: -5 is not an interval; give the seconds, > 0")
    assert not any("Traceback" in log.message for log in logs)
    # Other handlers still get the record whole, traceback and all (the CLI's .hybridtrain/logs file needs it).
    assert any(r.exc_info and r.exc_info[1] is raised.value for r in seen)


def test_a_bug_keeps_its_traceback(prefect_server):
    from prefect import flow, runtime

    import flows  # noqa: F401

    ids: list[str] = []

    @flow(name="bug")
    def bug() -> None:
        ids.append(str(runtime.flow_run.id))
        raise KeyError("site")

    with pytest.raises(KeyError):
        bug()
    (line,) = errors(run_logs(ids[0]))
    assert line.startswith("Encountered exception during execution: KeyError('site')")
    assert "Traceback (most recent call last)" in line and 'raise KeyError("site")' in line


def test_a_user_error_in_a_task_is_one_line_in_the_flow_runs_log(prefect_server):
    from prefect.states import State

    from tests.flows.user_error_probe import task_user_error_probe

    state: State = task_user_error_probe(rows=3, return_state=True)
    logs = run_logs(str(state.state_details.flow_run_id))
    assert errors(logs) == ["dataset data/raw/probe.csv failed validation:\n  - rows: 3 rows; give at least 10"]
    assert not any("Traceback" in log.message for log in logs)
    # The task run's end is still said, at INFO as the flow run's own end is.
    assert any(log.task_run_id and log.message.startswith("Finished in state Failed") for log in logs)


def test_in_a_worker_process_a_user_error_is_one_line_and_a_bug_keeps_both_tracebacks(prefect_server):
    """The flow-run process a process worker starts also logs "Engine execution exited with unexpected exception"
    with a second traceback: not for a user error, whose one line is already there."""
    from tests.flows.user_error_probe import bug_probe, user_error_probe

    run_id, output = in_a_process_of_its_own(prefect_server, "tests/flows/user_error_probe.py:user_error_probe",
                                             user_error_probe, {"steps": -5})
    logs = run_logs(run_id)
    expected = "parameters: 1 problem found; fix and re-run:\n  - steps: -5 is too few; give at least 40 (default 300)"
    assert errors(logs) == [expected], output[-3000:]
    assert not any("Traceback" in log.message for log in logs)
    assert "Traceback" in output  # the process's own output (the worker's log) keeps Prefect's traceback

    run_id, output = in_a_process_of_its_own(prefect_server, "tests/flows/user_error_probe.py:bug_probe",
                                             bug_probe, {})
    first, second = errors(run_logs(run_id))
    assert first.startswith("Encountered exception during execution: Bug('an index went out of range')")
    assert second.startswith("Engine execution exited with unexpected exception")
    assert all("Traceback (most recent call last)" in line for line in (first, second))


def test_a_subflows_user_error_is_one_line_in_each_runs_log(prefect_server):
    from prefect import flow, runtime

    import flows  # noqa: F401
    from hybridtrain.errors import DataError, Problem

    ids: dict[str, str] = {}

    @flow(name="child-stage")
    def child() -> None:
        ids["child"] = str(runtime.flow_run.id)
        raise DataError("data/raw/churn.csv", [Problem("dataset.md5", "pinned version 0123 is not in the store")])

    @flow(name="parent-lifecycle")
    def parent() -> None:
        ids["parent"] = str(runtime.flow_run.id)
        child()

    with pytest.raises(DataError) as raised:
        parent()
    for run in ("child", "parent"):
        logs = run_logs(ids[run])
        assert errors(logs) == [str(raised.value)], run
        assert not any("Traceback" in log.message for log in logs), run


def test_a_failed_stage_says_the_stages_error_without_prefects_prefix(prefect_server):
    """What ``orchestration.dispatch.run_stage`` raises when a stage's flow run ended Failed: the stage's error."""
    from prefect import flow

    from hybridtrain.errors import DataError, Problem, StageFailed

    @flow(name="prepare-data-probe")
    def stage() -> None:
        raise DataError("data/raw/churn.csv", [Problem("dataset.md5", "pinned version 0123 is not in the store; "
                                                                      "set dataset.md5 to 1b67c909")])

    state = stage(return_state=True)
    assert state.message.startswith("Flow run encountered an exception: DataError: ")  # Prefect's state message
    failed = StageFailed("prepare-data", "onprem-dc1", "f00d", state.name, state.message)
    assert str(failed) == ("stage prepare-data at site onprem-dc1 ended Failed (flow run f00d): DataError: dataset "
                           "data/raw/churn.csv failed validation:\n  - dataset.md5: pinned version 0123 is not in the "
                           "store; set dataset.md5 to 1b67c909")
    assert "encountered an exception" not in str(failed)


def test_what_the_api_gets_for_each_record_about_a_user_error():
    """``one_line_for_user_errors`` without a server: the records it hands on, and that it changes none."""
    import sys

    from prefect import flow_engine

    from hybridtrain.errors import Problem, SpecError
    from orchestration.user_errors import one_line_for_user_errors

    sent: list[logging.LogRecord] = []
    emit = one_line_for_user_errors(lambda handler, record: sent.append(record))
    try:
        raise SpecError("parameters", [Problem("port", "70000 is not a port")])
    except SpecError:
        exc_info = sys.exc_info()

    def record(msg: str, run: str, path: str = __file__, *args) -> logging.LogRecord:
        rec = logging.LogRecord("prefect.flow_runs", logging.ERROR, path, 1, msg, args, exc_info)
        rec.flow_run_id = run
        return rec

    ours = record("serving failed: %s", "run-1", __file__, "port")  # written by a flow: its text is kept
    emit(None, ours)
    emit(None, record("Engine execution exited with unexpected exception", "run-1", flow_engine.__file__))
    emit(None, record("Encountered exception during execution: %r", "run-2", flow_engine.__file__, exc_info[1]))
    assert [(r.getMessage(), r.exc_info, r.exc_text, r.flow_run_id) for r in sent] == [
        ("serving failed: port", None, None, "run-1"),  # the same error again in run-1: not sent
        ("parameters: 1 problem found; fix and re-run:\n  - port: 70000 is not a port", None, None, "run-2")]
    assert ours.exc_info is exc_info and ours.getMessage() == "serving failed: port"  # other handlers get it whole
