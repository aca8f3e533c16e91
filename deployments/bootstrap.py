"""Bootstrap: create work pools, save blocks and apply deployments/prefect.yaml on a Prefect server, idempotently."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.workers.process import ProcessWorker

from blocks.register import ensure_pseudonym_key, ensure_release_key, register_sites
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.workspace import Workspace


#: Pool of the control flows (burst-controller, recover-runs; deployments/prefect.yaml): no run limit and a
#: worker of its own, so the flows that supervise the site pools never wait for a slot in them.
CONTROL_POOL = "control"


@dataclass
class BootstrapReport:
    pools_created: list[str] = field(default_factory=list)
    pools_existing: list[str] = field(default_factory=list)
    site_blocks: list[str] = field(default_factory=list)
    key_created: bool = False
    deployments: list[str] = field(default_factory=list)


def ensure_pools(catalog: SitesCatalog, report: BootstrapReport) -> None:
    """One process work pool per environment (a GPU site's pool capped at its GPU count), and the control pool."""
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


def ensure_blocks(ws: Workspace, catalog: SitesCatalog, report: BootstrapReport) -> None:
    report.site_blocks = register_sites(catalog)
    report.key_created = ensure_pseudonym_key(ws.pseudonym_key_block)
    ensure_release_key(ws.release_key_block, ws.release_public_key)


def apply_deployments(ws: Workspace, report: BootstrapReport) -> None:
    """Run ``prefect deploy --all`` on deployments/prefect.yaml from the workspace root."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "HYBRIDTRAIN_HOME": str(ws.root)}
    if PREFECT_API_URL.value():  # the server this process talks to (also inside a test harness)
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
           "--prefect-file", str(ws.root / "deployments" / "prefect.yaml")]
    proc = subprocess.run(cmd, cwd=ws.root, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"prefect deploy failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        report.deployments = sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments())


def bootstrap(ws: Workspace, *, deploy: bool = True) -> BootstrapReport:
    report = BootstrapReport()
    catalog = SitesCatalog.load(ws.sites_file)
    ensure_pools(catalog, report)
    ensure_blocks(ws, catalog, report)
    if deploy:
        apply_deployments(ws, report)
    return report


def pool_exists(name: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return True
        except ObjectNotFound:
            return False
