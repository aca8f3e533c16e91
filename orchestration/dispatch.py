"""Dispatch: run a stage flow in the work pool of the site where it must run, and get its result back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar
from uuid import UUID

import httpx
from prefect import Flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from pydantic import BaseModel

from hybridtrain import stages
from hybridtrain.errors import SiteUnavailable, StageFailed
from hybridtrain.workspace import Workspace
from orchestration.queues import is_gpu_pool, tier_queue
from tasks.burst import MOVED

Mode = Literal["auto", "inline", "pools"]
R = TypeVar("R", bound=BaseModel)
POLL_S = 1.0
#: A worker's heartbeat interval when it did not say (Prefect's default, ``PREFECT_WORKER_HEARTBEAT_SECONDS``).
DEFAULT_HEARTBEAT_S = 30


def deployment_name(stage_flow: Flow, pool: str) -> str:
    """Each stage flow has one deployment per work pool, named after the pool (``train-stage/cloud``)."""
    return f"{stage_flow.name}/{pool}"


def workers_online(pool: str) -> int:
    """How many workers of ``pool`` report a recent heartbeat (status ONLINE); 0 for a pool that does not exist."""
    from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

    with get_client(sync_client=True) as client:
        try:
            return len(client.read_workers_for_work_pool(
                pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))))
        except ObjectNotFound:
            return 0
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code == 404:  # no such pool (the embedded default has none)
                return 0
            raise


def stage_workers(stage: str, mode: Mode) -> Callable[[str], int | None] | None:
    """What a site-health check asks of each pool for a stage dispatched with ``mode``: its live workers where
    the stage would run in that pool (``pools``, or ``auto`` where ``<stage>/<pool>`` is deployed), ``None`` —
    not checked — where it runs in this process (``inline``, or ``auto`` without that deployment), so a run on the
    embedded default never waits for a worker no stage needs."""
    if mode == "inline":
        return None

    def count(pool: str) -> int | None:
        if mode == "auto" and not has_deployment(f"{stage}/{pool}"):
            return None
        return workers_online(pool)
    return count


#: Prefect counts a worker offline once it missed this many of its heartbeats (``prefect.server.schemas.responses``).
MISSED_HEARTBEATS = 3


def workers_alive(pool: str) -> int:
    """How many workers of ``pool`` sent a heartbeat within their last ``MISSED_HEARTBEATS`` intervals, now.

    The same rule as Prefect's ONLINE status, computed from each worker's last heartbeat, so a worker
    that died counts as gone as soon as its heartbeats are overdue (``workers_online`` reads the status
    the server's foreman service writes, up to a loop later).
    """
    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    now = datetime.now(UTC)
    return sum(1 for w in workers if w.last_heartbeat_time is not None
               and (now - w.last_heartbeat_time).total_seconds()
               < MISSED_HEARTBEATS * (w.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_S))


def heartbeat_lags(pools: list[str]) -> dict[str, tuple[float, float] | None]:
    """Per pool, now: seconds since its freshest worker heartbeat and how long a gap its worker is allowed
    (``MISSED_HEARTBEATS`` of its intervals); None for a pool that has no worker at all."""
    now = datetime.now(UTC)
    out: dict[str, tuple[float, float] | None] = {}
    with get_client(sync_client=True) as client:
        for pool in pools:
            beats = [((now - w.last_heartbeat_time).total_seconds(),
                      MISSED_HEARTBEATS * (w.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_S))
                     for w in client.read_workers_for_work_pool(pool) if w.last_heartbeat_time is not None]
            out[pool] = min(beats) if beats else None
    return out


def transient_api_error(exc: BaseException) -> bool:
    """A Prefect API call that failed for now (server busy — 5xx, e.g. SQLite locked —, unreachable, timed out),
    after the client's own retries: worth trying again later, not a reason to give up a long run."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return isinstance(exc, httpx.TransportError)


T = TypeVar("T")


def retry_transient(deadline: float, call: Callable[[], T],
                    log: logging.Logger | logging.LoggerAdapter | None = None, *, window_s: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, again after a transient Prefect API error (``transient_api_error``), with a pause growing
    from ``POLL_S`` to 30 s, until ``deadline`` (on ``clock``); anything else, or past it, is raised.

    ``window_s``: instead of a fixed deadline, give up once the API has failed for that long in a row; a call
    that ran longer than ``window_s`` before it failed (hours of training, then a 503) starts a new count.
    """
    delay = POLL_S
    since: float | None = None  # when the API started failing, this time (window_s)
    while True:
        began = clock()
        try:
            return call()
        except Exception as exc:
            if not transient_api_error(exc):
                raise
            now = clock()
            if window_s is not None and (since is None or now - began > window_s):
                since, delay = now, POLL_S
            if now + delay >= (since + window_s if window_s is not None and since is not None else deadline):
                raise
            (log or logging.getLogger("hybridtrain.dispatch")).warning(
                "the Prefect API did not answer (%s: %s); asking again in %.0f s", type(exc).__name__,
                str(exc)[:200], delay)
        time.sleep(delay)
        delay = min(delay * 2, 30.0)


def has_deployment(name: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            return False
    return True


def wait_final(run_id: UUID, timeout_s: float) -> FlowRun:
    """The flow run once it is final, or as it is after ``timeout_s`` (polling, as ``run_deployment`` does)."""
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if (run.state is not None and run.state.is_final()) or time.monotonic() > deadline:
                return run
            time.sleep(POLL_S)


def follow_moves(run: FlowRun, timeout_s: float) -> FlowRun:
    """If the burst controller moved the run (Cancelled with a ``moved:<id>:<site>`` message), wait for
    the replacement instead, as often as it was moved."""
    deadline = time.monotonic() + timeout_s
    while run.state is not None and run.state.is_cancelled() and (run.state.message or "").startswith(MOVED):
        new_id = run.state.message.removeprefix(MOVED).split(":", 1)[0]
        with get_client(sync_client=True) as client:
            while True:
                run = client.read_flow_run(UUID(new_id))
                if (run.state is not None and run.state.is_final()) or time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)  # polling the API, as run_deployment itself does
    return run


def run_name(stage_flow: Flow, params: dict[str, Any]) -> str | None:
    """The stage flow's ``flow_run_name`` filled in from ``params``, given when its run is created, so
    the UI never shows a placeholder name while the run waits for a worker."""
    template = stage_flow.flow_run_name
    if not isinstance(template, str):
        return None
    try:
        return template.format(**params)
    except (KeyError, AttributeError, IndexError):  # a parameter the template needs was not passed
        return None


def work_queue(pool: str, gpu_pool: bool, tier: str | None,
               log: logging.Logger | logging.LoggerAdapter | None = None) -> str | None:
    """The work queue of ``pool`` a run of queue tier ``tier`` goes to: the tier's queue in a GPU pool, which
    ``hybridtrain deploy`` gave one per tier (``orchestration.queues.pool_queues``); None — the deployment's own,
    ``default`` — for a run without a tier, in a pool without GPUs, or in a pool deployed before it had tier
    queues (said in the log: ``run_deployment`` would create the queue as the pool's last)."""
    if tier is None or not gpu_pool:
        return None
    name = tier_queue(tier)
    with get_client(sync_client=True) as client:
        if any(q.name == name for q in client.read_work_queues(work_pool_name=pool)):
            return name
    (log or get_run_logger()).warning(
        "pool %r has no work queue %r, so this %s-tier run waits in its default queue, in arrival order: run "
        "`hybridtrain deploy` (or `make deploy`) to give the pool its tier queues", pool, name, tier)
    return None


def run_stage(stage_flow: Flow, result_type: type[R], *, site: str, params: dict[str, Any], ws: Workspace,
              run_id: str, mode: Mode, timeout_s: float, attempt: int = 1, tags: list[str] | None = None,
              queue_tier: str | None = None, after_queued: Callable[[FlowRun], None] | None = None) -> R:
    """Run ``stage_flow`` for ``site``.

    ``inline`` runs its body in this process, its tasks inside the calling flow run (the embedded
    default). ``pools`` creates a
    run of its deployment for the site's pool and waits: the pool's worker executes it where the
    site is, and the result comes back through the lifecycle's MLflow run. ``auto`` uses the pool
    when that deployment exists (after ``make deploy``), inline otherwise. In a pool the run carries
    ``tags`` (e.g. the placement's planned hours and work queue), waits in the pool's work queue of
    ``queue_tier`` (its placement's ``QueueTier`` name; ``work_queue``), and ``after_queued`` is called
    with it once it is queued, before the wait (e.g. a burst-controller pass for an urgent run).
    """
    inline = mode == "inline"
    if not inline:
        sites = ws.load_sites()
        pool = sites.get(site).work_pool
        name = deployment_name(stage_flow, pool)
        inline = mode == "auto" and not has_deployment(name)
    if inline:
        # In this process the stage's tasks run inside the calling flow run: a subflow run would add
        # ~1.2 s of Prefect bookkeeping per stage (benchmarks/orchestration_overhead.py) and nothing else.
        return stage_flow.fn(**params, workspace=str(ws.root))
    payload = {k: v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v
               for k, v in params.items()}
    if not workers_online(pool):
        get_run_logger().warning(
            "no worker of pool %r is online; %s waits until one starts (`prefect worker start --pool %s`)",
            pool, name, pool)
    run = run_deployment(name, parameters=payload, timeout=0 if after_queued else timeout_s, poll_interval=POLL_S,
                         flow_run_name=run_name(stage_flow, params), tags=tags,
                         work_queue_name=work_queue(pool, is_gpu_pool(sites, pool), queue_tier),
                         idempotency_key=f"{run_id}:{stage_flow.name}:{site}:{attempt}")
    if after_queued is not None:
        after_queued(run)
        run = wait_final(run.id, timeout_s)
    run = follow_moves(run, timeout_s)
    state = run.state
    if state is None or not state.is_final():
        raise SiteUnavailable(site, f"no worker of pool {pool!r} finished {name} within {timeout_s:.0f} s "
                                    f"(flow run {run.id}, state {state.name if state else 'unknown'}); "
                                    f"start one with `prefect worker start --pool {pool}`")
    if not state.is_completed():
        raise StageFailed(stage_flow.name, site, str(run.id), state.name, state.message or "")
    return stages.load_result(ws, run_id, stage_flow.name, result_type)
