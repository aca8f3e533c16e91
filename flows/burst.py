"""Burst controller flow: watch on-prem pools, move runs that would be late to an allowed site, release burst capacity."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import flow
from prefect.artifacts import create_table_artifact

from hybridtrain.placement.burst import plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from orchestration.context import run_workspace
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
        if plan.release:
            announce_release(site.name, plan.release_reason)
        actions.append({"run": "", "action": "release" if plan.release else "keep", "to": site.name,
                        "why": plan.release_reason})
    create_table_artifact(actions, key="burst-controller", description="What the burst controller did this pass")
    return actions
