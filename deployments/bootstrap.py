"""Bootstrap: create work pools, save blocks and apply deployments/prefect.yaml on a Prefect server, idempotently."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.workers.process import ProcessWorker

from blocks.register import ensure_pseudonym_key, ensure_release_key, register_sites
from deployments.code_source import CodeSource
from hybridtrain.errors import HybridtrainError
from hybridtrain.service.doctor import check_prefect_api
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.workspace import Workspace
from orchestration.queues import DEFAULT_QUEUE, is_gpu_pool, pool_queues, tier_queue


#: Pool of the control flows (burst-controller, recover-runs; deployments/prefect.yaml): no run limit and a
#: worker of its own, so the flows that supervise the site pools never wait for a slot in them.
CONTROL_POOL = "control"


#: What the Prefect UI shows under each queue of a GPU pool (the tiers: ``hybridtrain.placement.queue_state``).
QUEUE_ABOUT = {
    tier_queue("stay"): "hybridtrain: train runs whose data may not leave this site; served first",
    tier_queue("on_demand"): "hybridtrain: train runs that could burst to on-demand capacity only",
    DEFAULT_QUEUE: "runs without a tier (lifecycles, data stages, sweep trials, federated rounds); "
                   "served as on-demand runs are",
    tier_queue("spot"): "hybridtrain: train runs that could burst to spot capacity",
    tier_queue("late"): "hybridtrain: train runs late anyway (not worth a rescue); served last",
}


#: What to do when nothing answers at PREFECT_API_URL (said after the URL and the reason).
SERVER_FIX = ("nothing answers there; start the Prefect server (`make up` for the served stack, `make ui` or "
              "`prefect server start` for a local one) or correct PREFECT_API_URL")


def check_server(doing: str, api: str | None = None) -> None:
    """Refuse, in one line naming the URL and the fix, when the Prefect server at ``api`` (default: PREFECT_API_URL)
    does not answer or is unhealthy — before ``doing`` changes or starts anything.

    The checks are ``hybridtrain doctor``'s (``check_prefect_api``: ``/health``, then ``/ready``, its database).
    No URL (Prefect's own temporary server): nothing to check.
    """
    if api is None:
        from prefect.settings import PREFECT_API_URL

        api = PREFECT_API_URL.value()
    if not api:
        return
    api = api.rstrip("/")
    bad = [f for f in check_prefect_api(api, fix=SERVER_FIX) if not f.ok]
    if bad:
        said = "; ".join(f"{f.component} {f.detail}" for f in bad)
        if not any("not reachable" in f.detail for f in bad):  # it answers, unhealthy: its log says why
            said += f"; see the server's log, or run `hybridtrain doctor --api {api}`"
        raise HybridtrainError(f"cannot {doing}: {said}")


@dataclass
class BootstrapReport:
    pools_created: list[str] = field(default_factory=list)
    pools_existing: list[str] = field(default_factory=list)
    site_blocks: list[str] = field(default_factory=list)
    key_created: bool = False
    deployments: list[str] = field(default_factory=list)
    #: Pool -> git URL its workers clone the deployed commit from (empty: they share this checkout).
    code_repositories: dict[str, str] = field(default_factory=dict)
    code_commit: str | None = None


def ensure_pools(catalog: SitesCatalog, report: BootstrapReport) -> None:
    """One process work pool per environment (a GPU site's pool capped at its GPU count, with its tier queues),
    and the control pool."""
    template = ProcessWorker.get_default_base_job_template()
    with get_client(sync_client=True) as client:
        for pool in [*catalog.pools, CONTROL_POOL]:
            gpus = sum(s.gpu_count for s in catalog.by_pool(pool)) if pool != CONTROL_POOL else 0
            limit = gpus or None
            about = (f"hybridtrain environment {pool}" if pool != CONTROL_POOL
                     else "hybridtrain control flows (burst-controller, recover-runs); no run limit")
            try:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=template,
                                                       concurrency_limit=limit, description=about))
                report.pools_created.append(pool)
            except ObjectAlreadyExists:
                client.update_work_pool(pool, WorkPoolUpdate(concurrency_limit=limit))
                report.pools_existing.append(pool)
            if pool != CONTROL_POOL and is_gpu_pool(catalog, pool):
                ensure_tier_queues(client, pool)


def ensure_tier_queues(client: SyncPrefectClient, pool: str) -> None:
    """``pool``'s work queues with their priorities (``orchestration.queues.pool_queues``): the missing ones
    created, the others' priorities and descriptions set again (a queue's pause and limit are left as they are).
    A worker of the pool polls every queue and starts waiting runs by queue priority, then scheduled start time.

    Set in serving order, each through the pool's own queue endpoint (``PATCH /work_pools/{pool}/queues/{name}``;
    the client's ``update_work_queue`` takes the pool-less one, which writes the number without moving others):
    Prefect moves a queue that holds a priority being given away one down, so once the last is set these queues
    hold priorities 1, 2, … and any other queue of the pool comes after them."""
    have = {q.name for q in client.read_work_queues(work_pool_name=pool)}
    for name, priority in pool_queues():
        if name not in have:
            try:
                client.create_work_queue(name=name, work_pool_name=pool, priority=priority,
                                         description=QUEUE_ABOUT[name])
                continue
            except ObjectAlreadyExists:  # created meanwhile (another deploy)
                pass
        client.request("PATCH", "/work_pools/{work_pool_name}/queues/{name}",
                       path_params={"work_pool_name": pool, "name": name},
                       json={"priority": priority, "description": QUEUE_ABOUT[name]})


def ensure_blocks(ws: Workspace, catalog: SitesCatalog, report: BootstrapReport) -> None:
    report.site_blocks = register_sites(catalog)
    report.key_created = ensure_pseudonym_key(ws.pseudonym_key_block)
    ensure_release_key(ws.release_key_block, ws.release_public_key)


def prefect_file(ws: Workspace, code: CodeSource | None) -> Path:
    """deployments/prefect.yaml, or, with a code source, a copy under .hybridtrain/deploy whose deployments
    fetch the code with their pool's pull steps (``deployments.code_source``)."""
    source = ws.root / "deployments" / "prefect.yaml"
    if code is None:
        return source
    out = ws.state_dir / "deploy" / "prefect.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = code.apply(yaml.safe_load(source.read_text()))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(f"# Generated by `hybridtrain deploy --code-repo` from {source}; edit that file instead.\n"
                   + yaml.safe_dump(data, sort_keys=False))
    tmp.replace(out)
    return out


def apply_deployments(ws: Workspace, report: BootstrapReport, code: CodeSource | None = None) -> None:
    """Run ``prefect deploy --all`` on deployments/prefect.yaml (with ``code``'s pull steps) from the workspace root."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "HYBRIDTRAIN_HOME": str(ws.root)}
    if PREFECT_API_URL.value():  # the server this process talks to (also inside a test harness)
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
           "--prefect-file", str(prefect_file(ws, code))]
    proc = subprocess.run(cmd, check=False, cwd=ws.root, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"prefect deploy failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        report.deployments = sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments())


def bootstrap(ws: Workspace, *, deploy: bool = True, code_repos: list[str] | None = None,
              code_ref: str = "HEAD") -> BootstrapReport:
    """Pools, blocks and deployments. ``code_repos`` (``URL`` or ``POOL=URL``): those pools' workers clone
    commit ``code_ref`` of this checkout from that repository instead of sharing this checkout.

    Bad input (``SpecError``), then a Prefect server that does not answer (``HybridtrainError`` naming the
    URL and the fix), are refused before anything is created."""
    report = BootstrapReport()
    catalog = SitesCatalog.load(ws.sites_file)
    code = CodeSource.parse(code_repos or [], list(catalog.pools), ws.root, code_ref)  # bad input: before any change
    check_server("deploy (nothing was created)")
    if code is not None:
        report.code_repositories, report.code_commit = dict(code.repositories), code.commit
    ensure_pools(catalog, report)
    ensure_blocks(ws, catalog, report)
    if deploy:
        apply_deployments(ws, report, code)
    return report


def pool_exists(name: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return True
        except ObjectNotFound:
            return False
