"""Burst controller flow: watch on-prem pools, move runs that would be late to an allowed site, release burst capacity.

It runs on a schedule and, as in the simulator, also at once when a run placed as urgent has been
queued (``pass_at_once``, called by the lifecycle's training dispatch when ``burst.pass_now`` says so).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.deployments import run_deployment

from hybridtrain.placement.burst import plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from orchestration.context import run_workspace
from orchestration.dispatch import has_deployment
from orchestration.queues import burst_inputs
from tasks.burst import announce_release, read_pool, read_queues, relocate


@flow(name="burst-controller", log_prints=True)
def burst_controller(workspace: str | None = None, interval_s: float = 120.0) -> list[dict]:
    """One pass over every on-prem site's pool (runs on a schedule every ``interval_s``).

    Judgement is the pure ``plan_bursts``: a waiting run is moved only when it would miss its
    deadline (or the wait SLO) here, the engine picks another allowed site, and its data may leave.
    """
    ws = run_workspace(workspace)
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
