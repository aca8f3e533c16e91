"""Server log: what a Prefect server's background services (scheduler, late runs, foreman, ...) last reported.

Prefect 3.8 runs its services as docket perpetual tasks and exposes no API for their health:
``/api/health`` stays ``true`` while the scheduler fails on every loop. What tells is the log —
docket writes ``↫ [12ms] schedule_deployments()`` (INFO; ``↩`` for one-shot tasks such as
``mark_flow_run_late``) after each good run and ``↩ [100ms] schedule_deployments()`` at ERROR, with
the traceback, after each failed one; class-based
services (event persister, task run recorder, triggers) log their errors under their own logger.
A service is failing when the last thing it reported since the server last started is a failure.
Example (``make ui``'s log, errors only): two ``↩ schedule_deployments`` errors ending
``sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement`` → ``scheduler`` failing,
2 times, with that line as the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Docket task (function) name -> the server service it belongs to (prefect/server/services/*.py).
SERVICE_OF_TASK = {
    "schedule_deployments": "scheduler",
    "schedule_recent_deployments": "scheduler",
    "monitor_late_runs": "late runs",
    "mark_flow_run_late": "late runs",
    "monitor_worker_health": "foreman",
    "monitor_expired_pauses": "pause expirations",
    "monitor_expired_leases": "repossessor",
    "monitor_cancelled_flow_runs": "cancellation cleanup",
    "monitor_subflow_runs": "cancellation cleanup",
    "ensure_cancelling_timeout_checks": "cancellation cleanup",
    "reconcile_cleanup_delivery": "cleanup reconciler",
    "schedule_vacuum_tasks": "db vacuum",
    "schedule_orphan_vacuum_tasks": "db vacuum",
    "schedule_event_vacuum_tasks": "db vacuum",
    "send_telemetry_heartbeat": "telemetry",
    "evaluate_proactive_triggers_periodic": "triggers",
}
#: Last part of a service's logger name -> the service (for services that are not docket tasks).
SERVICE_OF_LOGGER = {
    "event_persister": "event persister",
    "eventpersister": "event persister",
    "task_run_recorder": "task run recorder",
    "taskrunrecorder": "task run recorder",
    "triggers": "triggers",
    "actions": "actions",
    "scheduler": "scheduler",
    "late_runs": "late runs",
    "foreman": "foreman",
    "repossessor": "repossessor",
    "cancellation_cleanup": "cancellation cleanup",
    "pause_expirations": "pause expirations",
    "db_vacuum": "db vacuum",
}

_RECORD = re.compile(r"^(?P<time>\d\d:\d\d:\d\d\.\d{3}) \| (?P<level>[A-Z]+)\s*\| (?P<logger>\S+) - (?P<msg>.*)$")
_DOCKET = re.compile(r"^(?P<mark>[↫↩]) \[\s*[^\]]*\] (?P<task>[A-Za-z_][A-Za-z0-9_]*)\(")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Timeout|Interrupt|Warning)\b.*|^[a-z_][\w.]*\.[A-Z]\w*: .*")
#: Lines that mean "the server (re)started here": what came before is history.
_START = ("Scheduling perpetual service", "Check out the dashboard at", "Starting perpetual services")


@dataclass(frozen=True)
class ServiceStatus:
    """What one service last reported since the server started."""

    service: str
    ok: bool
    failures: int  # failed runs since the server started
    last_time: str  # HH:MM:SS.mmm of its last report
    reason: str  # the last failure's exception line ("" when ok)

    def line(self) -> str:
        if self.ok:
            return f"{self.service}: ok (last run {self.last_time})"
        times = "once" if self.failures == 1 else f"{self.failures} times"
        return f"{self.service}: failing ({times} since the server started, last at {self.last_time}): {self.reason}"


@dataclass
class _Record:
    time: str
    level: str
    logger: str
    msg: str
    extra: list[str]

    def reason(self) -> str:
        """The exception line of the record's traceback, else its message."""
        for line in reversed(self.extra):
            text = line.strip()
            if text and not line.startswith((" ", "\t")) and _EXC_LINE.match(text):
                return text[:300]
        return self.msg[:300]


def _records(lines: Iterable[str]) -> list[_Record]:
    out: list[_Record] = []
    for raw in lines:
        line = raw.rstrip("\n")
        m = _RECORD.match(line)
        if m:
            out.append(_Record(m["time"], m["level"], m["logger"], m["msg"], []))
        elif out:
            out[-1].extra.append(line)
        if not m and any(s in line for s in _START):
            out.append(_Record("", "START", "", line, []))
    return out


def _service_of_logger(logger: str) -> str | None:
    if ".services." not in logger:
        return None
    tail = logger.rsplit(".", 1)[-1]
    return SERVICE_OF_LOGGER.get(tail, tail.replace("_", " "))


def service_statuses(lines: Iterable[str]) -> list[ServiceStatus]:
    """Each service seen in the log since the server last started, in order of name."""
    records = _records(lines)
    starts = [i for i, r in enumerate(records) if r.level == "START" or any(s in r.msg for s in _START)]
    if starts:
        first_of_last_start = starts[-1]
        while first_of_last_start - 1 in starts:  # a block of "Scheduling perpetual service" lines
            first_of_last_start -= 1
        records = records[first_of_last_start:]
    # Per reporter (docket task or logger): a service with two tasks fails if either's last report failed.
    last: dict[tuple[str, str], tuple[bool, _Record]] = {}
    failures: dict[str, int] = {}
    for r in records:
        d = _DOCKET.match(r.msg)
        if d and d["task"] in SERVICE_OF_TASK:
            key = (SERVICE_OF_TASK[d["task"]], d["task"])
            ok = r.level not in ("ERROR", "CRITICAL")
        elif r.level in ("ERROR", "CRITICAL") and (service := _service_of_logger(r.logger)):
            key, ok = (service, r.logger), False
        else:
            continue
        last[key] = (ok, r)
        if not ok:
            failures[key[0]] = failures.get(key[0], 0) + 1
    out: list[ServiceStatus] = []
    for service in sorted({k[0] for k in last}):
        reports = [v for k, v in last.items() if k[0] == service]
        bad = [r for ok, r in reports if not ok]
        newest = max((r for _, r in reports), key=lambda r: r.time)
        if bad:
            worst = max(bad, key=lambda r: r.time)
            out.append(ServiceStatus(service, False, failures.get(service, 0), worst.time, worst.reason()))
        else:
            out.append(ServiceStatus(service, True, failures.get(service, 0), newest.time, ""))
    return out


def failing(lines: Iterable[str]) -> list[ServiceStatus]:
    return [s for s in service_statuses(lines) if not s.ok]
