"""Recovery flow (scheduled): resubmit lifecycle runs that crashed or whose worker vanished, resuming them.

Prefect does not retry a run whose infrastructure died (upstream issue #10211): the process
worker marks it CRASHED and that is the end. Every few minutes this flow:

1. finds lifecycle runs (flow ``training-lifecycle``) started from a deployment in the last
   ``lookback_hours`` that are CRASHED, or RUNNING in a pool none of whose workers has sent a
   heartbeat for ``heartbeat_timeout_s`` (the host went away with its worker) — those are marked
   CRASHED first, with that reason. The timeout is at least 90 s (three of a worker's 30-s beats), and a
   worker that beats less often counts as alive until it missed three of its own beats;
2. skips each one already recovered (tag ``hybridtrain:recovered``) or whose job has another run
   active (scheduled, pending, running or paused) — no duplicate training; the train stage's
   lease on the job (``flows.training``) guarantees it even against a race;
3. resubmits it to its deployment with the same parameters and ``run_key`` (the crashed run's
   own key, by default its id), so training resumes from its newest valid checkpoint wherever
   that is (``flows.supervise`` moves it to the newly placed site), tagged
   ``recovered-from:<id>`` and with an idempotency key so two recovery runs cannot both resubmit.
   The new run is a run of the deployment in its own right, not a subflow of the recovery pass.

Before that, runs outside any pool (``hybridtrain run`` and Python sessions) whose owning process
died, or that sent no flow-run heartbeat within the heartbeat timeout, are marked CRASHED and their
MLflow runs KILLED (``orchestration.stale_runs``); not being deployment runs, they are listed as
skipped, with the ``--run-key`` that resumes them.

Each pass also terminates leftover cloud instances (``stages.sweep_instances``): those a multi-node
job started at a site with ``instances:`` whose MLflow run has ended, or that are past their
deadline (boot time + the job's ``max_hours`` + 30 min) — a control plane killed mid-run leaves
them up, and a run never resumed would pay for them forever. They are listed in the
``swept-instances`` table artifact and audited.

Each decision is audited and listed in a table artifact.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.states import Crashed
from pydantic import Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain import stages
from hybridtrain.errors import Problem
from orchestration.context import run_workspace
from orchestration.dispatch import DEFAULT_HEARTBEAT_S, MISSED_HEARTBEATS
from orchestration.stale_runs import reap_stale_runs

RECOVERED = "hybridtrain:recovered"
ACTIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED]

#: The flows whose runs this flow resubmits: it reads and replays a lifecycle's parameters (spec, run_key).
LIFECYCLE_FLOWS = ("training-lifecycle",)
DEFAULT_HEARTBEAT_TIMEOUT_S = 300.0
#: The shortest ``heartbeat_timeout_s``: a worker beats every ``DEFAULT_HEARTBEAT_S`` (Prefect's
#: ``PREFECT_WORKER_HEARTBEAT_SECONDS``) and Prefect calls it offline after ``MISSED_HEARTBEATS`` missed beats;
#: a shorter timeout finds a live worker's pool silent between two beats, crashes its runs and trains them twice.
MIN_HEARTBEAT_TIMEOUT_S = float(MISSED_HEARTBEATS * DEFAULT_HEARTBEAT_S)
DEFAULT_LOOKBACK_HOURS = 24.0
#: The longest ``lookback_hours``: resuming a run that crashed over a week ago is a person's decision.
MAX_LOOKBACK_HOURS = 7 * 24.0
#: The longest ``heartbeat_timeout_s``, the longest look-back window: a run looked at started within it, when its pool
#: had a live worker, so no pool could have been silent for longer.
MAX_HEARTBEAT_TIMEOUT_S = MAX_LOOKBACK_HOURS * 3600


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parameter_problems(flow_name: object, heartbeat_timeout_s: object, lookback_hours: object) -> list[Problem]:
    """What is wrong with recover-runs' parameters (one problem each, named as the Prefect UI's form names them):
    checked before anything is read, since a timeout shorter than a worker's heartbeat crashes healthy runs and
    a window or flow that matches nothing makes the pass look at nothing and say nothing."""
    problems = []
    if flow_name not in LIFECYCLE_FLOWS:
        problems.append(Problem("flow_name", f"{flow_name!r} is not a lifecycle flow; recover-runs resubmits runs "
                                             f"of {', '.join(LIFECYCLE_FLOWS)} (the default)"))
    least = f"give at least {MIN_HEARTBEAT_TIMEOUT_S:.0f} (default {DEFAULT_HEARTBEAT_TIMEOUT_S:.0f})"
    if not _number(heartbeat_timeout_s):
        problems.append(Problem("heartbeat_timeout_s", f"{heartbeat_timeout_s!r} is not a timeout; give the "
                                                       f"seconds without a worker heartbeat after which a pool "
                                                       f"counts as lost, {least}"))
    elif heartbeat_timeout_s < MIN_HEARTBEAT_TIMEOUT_S:
        problems.append(Problem("heartbeat_timeout_s", f"{heartbeat_timeout_s:g} s is shorter than "
                                                       f"{MISSED_HEARTBEATS} worker heartbeats (a worker beats every "
                                                       f"{DEFAULT_HEARTBEAT_S} s), so runs of live workers would be "
                                                       f"crashed and trained twice; {least}"))
    elif heartbeat_timeout_s > MAX_HEARTBEAT_TIMEOUT_S:
        problems.append(Problem("heartbeat_timeout_s", f"{heartbeat_timeout_s:g} s is longer than the longest "
                                                       f"look-back window (a week), so no pool would ever count as "
                                                       f"lost; give at most {MAX_HEARTBEAT_TIMEOUT_S:.0f} (default "
                                                       f"{DEFAULT_HEARTBEAT_TIMEOUT_S:.0f})"))
    if not (_number(lookback_hours) and 0 < lookback_hours <= MAX_LOOKBACK_HOURS):
        problems.append(Problem("lookback_hours", f"{lookback_hours!r} is not a window to look back over; give the "
                                                  f"hours, > 0 and at most {MAX_LOOKBACK_HOURS:.0f} (a week; default "
                                                  f"{DEFAULT_LOOKBACK_HOURS:.0f})"))
    return problems


def job_key(run: FlowRun) -> str:
    """What identifies the job of a lifecycle run: its spec's name, else its spec file."""
    p = run.parameters or {}
    spec = p.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("metadata"), dict):
        return str(spec["metadata"].get("name"))
    return str(p.get("spec_path", "jobs/churn.yaml"))


def pool_silent_since(client: Any, pool: str | None, now: datetime, timeout_s: float) -> datetime | None:
    """When the pool's last worker heartbeat was, if it is older than ``timeout_s`` (None: a worker is alive)."""
    if not pool:
        return None
    workers = [w for w in client.read_workers_for_work_pool(pool) if w.last_heartbeat_time is not None]
    # A worker that beats less often than the timeout allows is alive until it missed MISSED_HEARTBEATS beats,
    # as Prefect judges it: never crash the runs of a live worker.
    if any((now - w.last_heartbeat_time).total_seconds()
           <= max(timeout_s, MISSED_HEARTBEATS * (w.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_S))
           for w in workers):
        return None
    return max((w.last_heartbeat_time for w in workers), default=datetime.min.replace(tzinfo=UTC))


@flow(name="recover-runs", log_prints=True)
def recover_runs(
    workspace: str | None = None,
    flow_name: str = LIFECYCLE_FLOWS[0],
    heartbeat_timeout_s: Annotated[float, Field(ge=MIN_HEARTBEAT_TIMEOUT_S,
                                                le=MAX_HEARTBEAT_TIMEOUT_S)] = DEFAULT_HEARTBEAT_TIMEOUT_S,
    lookback_hours: Annotated[float, Field(gt=0, le=MAX_LOOKBACK_HOURS)] = DEFAULT_LOOKBACK_HOURS,
    dry_run: bool = False,
) -> list[dict[str, str]]:
    """Resubmit crashed or lost lifecycle runs with resume; returns one row per run looked at.

    Wrong parameters (``parameter_problems``, and the workspace) are refused together, before any run is read or
    changed: ``heartbeat_timeout_s`` from ``MIN_HEARTBEAT_TIMEOUT_S`` (90 s) to ``MAX_HEARTBEAT_TIMEOUT_S`` (a
    week), ``lookback_hours`` in (0, 168], ``flow_name`` a lifecycle flow. The numbers' bounds are in their types
    too, so a deployment run outside them is never created (see ``flows``).

    Args:
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
        flow_name: The lifecycle flow whose runs are resubmitted (training-lifecycle).
        heartbeat_timeout_s: Seconds without a worker heartbeat after which a pool counts as lost, 90 (three of a
            worker's 30-s beats) to 604800 (a week).
        lookback_hours: How far back to look for crashed or lost runs, > 0 and at most 168 (a week).
        dry_run: List the runs that would be resubmitted; resubmit none and terminate no instance.
    """
    log = get_run_logger()
    ws = run_workspace(workspace, problems=parameter_problems(flow_name, heartbeat_timeout_s, lookback_hours),
                       source="recover-runs")
    for stale in reap_stale_runs(ws):
        log.warning("%s: marked CRASHED: %s", stale["name"], stale["reason"])
    now = datetime.now(UTC)
    rows: list[dict[str, str]] = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED, StateType.RUNNING])),
                start_time=FlowRunFilterStartTime(after_=now - timedelta(hours=lookback_hours))),
            limit=200)
        active = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE))),
            limit=200)
        for run in runs:
            if RECOVERED in (run.tags or []):
                continue
            state = run.state.type if run.state else None
            reason = f"crashed: {run.state.message}" if state == StateType.CRASHED and run.state.message else "crashed"
            if state == StateType.RUNNING:
                silent = pool_silent_since(client, run.work_pool_name, now, heartbeat_timeout_s)
                if silent is None:
                    continue  # alive, or not ours to judge (no pool)
                seen = "never" if silent.year == 1 else f"{(now - silent).total_seconds():.0f} s ago"
                reason = (f"heartbeat lost: no worker of pool {run.work_pool_name!r} has been alive for "
                          f"{heartbeat_timeout_s:.0f} s (last heartbeat {seen})")
            row = {"flow_run": str(run.id), "name": run.name, "job": job_key(run), "reason": reason}
            others = [a for a in active if a.id != run.id and job_key(a) == row["job"]]
            if run.deployment_id is None:
                row["action"] = ("skipped: not started from a deployment; resume it with "
                                 f"`hybridtrain run SPEC --run-key {(run.parameters or {}).get('run_key') or run.id}`")
            elif others:
                row["action"] = f"skipped: job already has an active run ({others[0].name}, {others[0].id})"
            elif dry_run:
                row["action"] = "would resubmit (dry run)"
            else:
                if state == StateType.RUNNING:
                    client.set_flow_run_state(run.id, Crashed(message=reason), force=True)
                params = {**(run.parameters or {})}
                params["run_key"] = params.get("run_key") or str(run.id)
                # Not a subflow of this pass (run_deployment's default inside a flow): cancelling the pass
                # would make the server cancel it too, and the run's lifetime is its own.
                new = run_deployment(run.deployment_id, parameters=params, timeout=0, as_subflow=False,
                                     tags=[t for t in (run.tags or []) if not t.startswith("recovered-from:")]
                                     + [f"recovered-from:{run.id}"],
                                     idempotency_key=f"recover:{run.id}")
                client.update_flow_run(run.id, tags=[*(run.tags or []), RECOVERED])
                active.append(new)
                row["action"] = f"resubmitted as {new.name} ({new.id}), run_key {params['run_key']}"
                row["resubmitted"] = str(new.id)
            log.warning("%s (%s): %s -> %s", run.name, row["job"], reason, row["action"])
            stages.audit(ws).append(actor=ws.actor, action="recovery", subject=f"job {row['job']}",
                                    inputs={"flow_run": row["flow_run"], "reason": reason}, outcome=row["action"])
            rows.append(row)
    if rows:
        create_table_artifact(rows, key="recovered-runs", description="Crashed or lost lifecycle runs and what was done")
    if not dry_run:
        swept = stages.sweep_instances(ws)
        for row in swept:
            if "error" in row:
                log.warning("site %s: instances not swept: %s", row["site"], row["error"])
            else:
                log.warning("site %s: terminated leftover instance %s of job %s: %s", row["site"], row["instance"],
                            row["job_id"], row["reason"])
        if swept:
            create_table_artifact(swept, key="swept-instances",
                                  description="Cloud instances terminated because no running job needed them")
    return rows
