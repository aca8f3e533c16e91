"""Stale runs: flow runs left RUNNING by a process that died (a killed ``hybridtrain run``), marked CRASHED.

Prefect marks a run CRASHED when its process raises or is stopped politely, but not after a
SIGKILL or a lost host: then the flow run — and the MLflow run it opened — stay RUNNING for good.
A run started by a session (``orchestration.session``: the CLI, or Python after ``open_session()``)
carries an **owner tag** ``hybridtrain:owner:<host>:<pid>:<process start>``, and sends a flow-run
heartbeat every ``HEARTBEAT_S`` seconds. A RUNNING run outside a work pool is stale when

- its owner is on this host and that process is gone — seen by the next session that opens (the
  next ``hybridtrain run``, ``init``, ``demo``, ``sweep``) and by ``recover-runs``, at once; or
- its last heartbeat (its start when it sent none yet) is older than the **heartbeat timeout**,
  ``HYBRIDTRAIN_HEARTBEAT_TIMEOUT_S`` (default 90 s: three missed heartbeats) — an owner on another
  host, or a host that went away. Runs with neither an owner tag nor any heartbeat are not judged.

A stale run is set CRASHED with its reason, and its MLflow runs (tag
``hybridtrain.prefect_flow_run_id``, still RUNNING: a lifecycle's run, a sweep's, a sweep trial's
attempt's) are ended KILLED with the same reason in
``hybridtrain.crashed``. Runs in a work pool belong to their worker (``recover-runs`` checks the
pool's worker heartbeats). Resume a crashed run's training with ``hybridtrain run SPEC --run-key KEY``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events.filters import EventAnyResourceFilter, EventFilter, EventNameFilter, EventOccurredFilter
from prefect.states import Crashed

from hybridtrain.tracking.model_registry import FLOW_RUN_TAG, Registry
from hybridtrain.workspace import Workspace

OWNER = "hybridtrain:owner:"
#: Seconds between flow-run heartbeats of a session's runs (Prefect's minimum).
HEARTBEAT_S = 30
#: Default heartbeat timeout: three heartbeats missed.
HEARTBEAT_TIMEOUT_S = 3 * HEARTBEAT_S
HEARTBEAT_EVENT = "prefect.flow-run.heartbeat"


def heartbeat_timeout_s() -> float:
    return float(os.environ.get("HYBRIDTRAIN_HEARTBEAT_TIMEOUT_S") or HEARTBEAT_TIMEOUT_S)


def owner_tag(pid: int | None = None) -> str:
    """The tag naming this process (or ``pid``) as the owner of the runs it starts."""
    proc = psutil.Process(pid or os.getpid())
    return f"{OWNER}{socket.gethostname()}:{proc.pid}:{int(proc.create_time())}"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: int

    @classmethod
    def of(cls, tags: list[str] | None) -> Owner | None:
        for t in tags or []:
            parts = t.removeprefix(OWNER).rsplit(":", 2) if t.startswith(OWNER) else []
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                return cls(parts[0], int(parts[1]), int(parts[2]))
        return None

    def alive(self) -> bool | None:
        """Whether the owning process still runs; None when it is on another host (cannot tell from here)."""
        if self.host != socket.gethostname():
            return None
        try:
            return abs(int(psutil.Process(self.pid).create_time()) - self.started) <= 1
        except psutil.Error:
            return False


def stale_reason(owner: Owner | None, alive: bool | None, last_seen: datetime | None, beat_seen: bool,
                 now: datetime, timeout_s: float) -> str | None:
    """Why a RUNNING run outside a pool is stale, or None while it may still be running (pure)."""
    if owner is not None and alive is False:
        return f"its process (pid {owner.pid} on {owner.host}) is gone: killed or crashed without ending the run"
    if alive:
        return None
    if last_seen is None or (owner is None and not beat_seen):
        return None
    silent = (now - last_seen).total_seconds()
    if silent <= timeout_s:
        return None
    what = "heartbeat" if beat_seen else "heartbeat since it started"
    return f"no flow-run {what} for {silent:.0f} s (heartbeat timeout {timeout_s:.0f} s)"


def _last_heartbeat(client: Any, run: FlowRun) -> datetime | None:
    since = (run.start_time or datetime.now(UTC)) - timedelta(minutes=1)
    page = client.read_events(EventFilter(
        occurred=EventOccurredFilter(since=since),
        event=EventNameFilter(name=[HEARTBEAT_EVENT]),
        any_resource=EventAnyResourceFilter(id=[f"prefect.flow-run.{run.id}"])), limit=1)
    return page.events[0].occurred if page.events else None


def reap_stale_runs(ws: Workspace, timeout_s: float | None = None, now: datetime | None = None) -> list[dict[str, str]]:
    """Mark every stale RUNNING flow run (outside a pool) CRASHED and end its MLflow runs; one row per run marked."""
    timeout = heartbeat_timeout_s() if timeout_s is None else timeout_s
    now = now or datetime.now(UTC)
    rows: list[dict[str, str]] = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))), limit=200)
        for run in runs:
            if run.work_pool_name:
                continue
            owner = Owner.of(run.tags)
            alive = owner.alive() if owner else None
            beat = None if alive else _last_heartbeat(client, run)
            reason = stale_reason(owner, alive, beat or run.start_time, beat is not None, now, timeout)
            if reason is None:
                continue
            client.set_flow_run_state(run.id, Crashed(message=f"hybridtrain: {reason}"), force=True)
            rows.append({"flow_run": str(run.id), "name": run.name, "reason": reason,
                         "mlflow_runs": ",".join(_end_mlflow_runs(ws, str(run.id), reason))})
    return rows


def _end_mlflow_runs(ws: Workspace, flow_run_id: str, reason: str) -> list[str]:
    """End the RUNNING MLflow runs a crashed flow run opened (KILLED, with the reason as a tag)."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    experiment = registry.client.get_experiment_by_name(ws.experiment)
    if experiment is None:
        return []
    found = registry.client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}' and attributes.status = 'RUNNING'")
    for r in found:
        registry.set_tags(r.info.run_id, {"hybridtrain.crashed": reason})
        registry.end_run(r.info.run_id, status="KILLED")
    return [r.info.run_id for r in found]
