"""Site health task: probe every site (SSH hosts, store, pool workers) and publish the result."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact

from hybridtrain import stages
from hybridtrain.remote.site_health import unavailable
from hybridtrain.workspace import Workspace


@task(name="check-sites")
def check_sites(ws: Workspace, with_workers: bool) -> dict[str, str]:
    """Unhealthy site → reason. ``with_workers``: also require a live worker in the site's pool
    (when stages are dispatched to pools; inline runs need none)."""
    workers = None
    if with_workers:
        from orchestration.dispatch import workers_online

        workers = workers_online
    healths = stages.site_health(ws, workers)
    create_table_artifact([row for h in healths for row in h.to_rows()], key="site-health",
                          description="Site health: SSH hosts, store, pool workers")
    return unavailable(healths)
