"""Reading a Prefect server's service health from its log: failing now vs failed once vs before a restart."""

from __future__ import annotations

from pathlib import Path

from hybridtrain.service.server_log import failing, service_statuses

DATA = Path(__file__).parent / "data"
# A real `prefect server start` log (prefect 3.8.8 beside SQLAlchemy 2.1.9, errors only, as `make ui` writes it).
FAILING = (DATA / "scheduler-failing.log").read_text().splitlines()
BULK_DML = "sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement"


def ok(time: str, task: str) -> str:
    return f"{time} | INFO    | docket.dependencies - ↫ [    12ms] {task}(){{{task}}}"


def test_the_scheduler_failing_on_every_loop_is_named_with_its_exception():
    [bad] = failing(FAILING)
    assert bad.service == "scheduler" and bad.failures == 2 and bad.last_time == "17:03:14.985"
    assert bad.reason.startswith(BULK_DML)
    assert bad.line().startswith("scheduler: failing (2 times since the server started, last at 17:03:14.985): "
                                 + BULK_DML)


def test_a_service_whose_last_run_succeeded_is_ok_and_its_other_task_still_counts():
    recovered = [*FAILING, ok("17:03:20.000", "schedule_recent_deployments")]
    assert [s.service for s in failing(recovered)] == ["scheduler"]  # schedule_deployments last failed
    both = [*recovered, ok("17:03:21.000", "schedule_deployments"), ok("17:03:21.500", "monitor_late_runs")]
    statuses = {s.service: s for s in service_statuses(both)}
    assert not failing(both)
    assert statuses["scheduler"].ok and statuses["scheduler"].failures == 2
    assert statuses["late runs"].ok and statuses["late runs"].last_time == "17:03:21.500"


def test_failures_before_the_server_restarted_are_history():
    restarted = [*FAILING, "Check out the dashboard at http://127.0.0.1:4200", ok("17:09:00.000", "monitor_late_runs")]
    assert not failing(restarted)
    assert [s.service for s in service_statuses(restarted)] == ["late runs"]


def test_a_class_based_service_error_is_named_by_its_logger():
    lines = [ok("10:00:00.000", "monitor_worker_health"),
             "10:00:01.000 | ERROR   | prefect.server.events.services.event_persister - Error trying to save events",
             "Traceback (most recent call last):",
             '  File "x.py", line 1, in f',
             "asyncpg.exceptions.TooManyConnectionsError: sorry, too many clients already"]
    [bad] = failing(lines)
    assert bad.service == "event persister"
    assert bad.reason == "asyncpg.exceptions.TooManyConnectionsError: sorry, too many clients already"
