"""Burst controller flow: watch on-prem pools, move runs that would be late to an allowed site, release burst capacity.

It runs on a schedule and, as in the simulator, also at once when a run placed as urgent has been
queued (``pass_at_once``, called by the lifecycle's training dispatch when ``burst.pass_now`` says so).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.deployments import run_deployment
from pydantic import Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain.errors import Problem
from hybridtrain.placement.burst import plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from orchestration.context import run_workspace
from orchestration.dispatch import has_deployment
from orchestration.queues import burst_inputs
from tasks.burst import announce_release, read_pool, read_queues, relocate

DEFAULT_INTERVAL_S = 120.0
#: The longest ``interval_s``: a day. It is the margin added to every predicted start (the time until the next
#: pass), so a huge one makes every waiting run look late and moves them all.
MAX_INTERVAL_S = 86400.0


def interval_problems(interval_s: object) -> list[Problem]:
    """What is wrong with ``interval_s`` (named as the Prefect UI's form names it): it must be the seconds between
    two passes, > 0 and at most ``MAX_INTERVAL_S``. A negative one would make every run look on time (no burst)."""
    if (isinstance(interval_s, (int, float)) and not isinstance(interval_s, bool) and math.isfinite(interval_s)
            and 0 < interval_s <= MAX_INTERVAL_S):
        return []
    return [Problem("interval_s", f"{interval_s!r} is not an interval; give the seconds between passes, > 0 and "
                                  f"at most {MAX_INTERVAL_S:.0f} (a day; default {DEFAULT_INTERVAL_S:.0f})")]


@flow(name="burst-controller", log_prints=True)
def burst_controller(workspace: str | None = None,
                     interval_s: Annotated[float, Field(gt=0, le=MAX_INTERVAL_S)] = DEFAULT_INTERVAL_S) -> list[dict]:
    """One pass over every on-prem site's pool (runs on a schedule every ``interval_s``).

    Judgement is the pure ``plan_bursts``: a waiting run is moved only when it would miss its
    deadline (or the wait SLO) here, the engine picks another allowed site, and its data may leave.
    A wrong ``interval_s`` (``interval_problems``) or workspace is refused before any pool is read; the bounds
    are in the parameter's type too, so a deployment run outside them is never created (see ``flows``).

    Args:
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
        interval_s: Seconds between two passes, > 0 and at most 86400 (a day); the margin added to every
            predicted start.
    """
    ws = run_workspace(workspace, problems=interval_problems(interval_s), source="burst-controller")
    sites = ws.load_sites()
    placement = Placement(sites, Policy.load(ws.policy_file, sites))
    queues = read_queues(ws)
    actions: list[dict] = []
    for site in (s for s in sites.sites if s.kind.value == "onprem"):
        now = datetime.now(UTC)
        runs = read_pool(ws, site.name)
        waiting, running = burst_inputs(runs, now)
        others = {k: v for k, v in queues.items() if k != site.name}
        plan = plan_bursts(placement, site.name, waiting, now=time.time(), gpu_slots=site.gpu_count,
                           running=running, others=others, evict=False, margin_s=interval_s)
        by_id = {r.run_id: r for r in runs}
        for move in plan.moves:
            moved = relocate(ws, by_id[move.run_id], site.name, move.to_site, move.reason)
            actions.append({"run": move.run_id, "action": "moved" if moved.done else "kept",
                            "to": move.to_site, "why": move.reason if moved.done else moved.note})
        for hold in plan.held:
            actions.append({"run": hold.run_id, "action": "held", "to": site.name, "why": hold.reason})
        for rid in plan.demoted:  # late anyway, not worth a rescue: it waits behind the runs that can make it
            actions.append({"run": rid, "action": "late", "to": site.name,
                            "why": "rescuing it costs more than the policy says its deadline is worth"})
        if plan.release:
            announce_release(site.name, plan.release_reason)
        actions.append({"run": "", "action": "release" if plan.release else "keep", "to": site.name,
                        "why": plan.release_reason})
    create_table_artifact(actions, key="burst-controller", description="What the burst controller did this pass")
    return actions


#: The controller's deployment (``deployments/prefect.yaml``: flow burst-controller, deployment control).
CONTROLLER_DEPLOYMENT = "burst-controller/control"


def pass_at_once(workspace: str | None = None) -> str:
    """One controller pass now, not at the next scheduled one: a run of the controller's deployment when
    it exists (its worker runs it; at most one pass at a time), else this flow in the caller's process.
    Returns what was started."""
    if has_deployment(CONTROLLER_DEPLOYMENT):
        run = run_deployment(CONTROLLER_DEPLOYMENT, timeout=0, as_subflow=False, tags=["urgent-pass"])
        get_run_logger().info("urgent run queued: burst-controller pass %s started", run.id)
        return str(run.id)
    burst_controller(workspace=workspace)
    return "inline"
