"""Site health task: probe every site (SSH hosts, store, pool workers) and publish the result."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact

from hybridtrain import stages
from hybridtrain.remote.site_health import unavailable
from hybridtrain.workspace import Workspace


@task(name="check-sites")
def check_sites(ws: Workspace, stage: str, mode: str) -> dict[str, str]:
    """Unhealthy site → reason. A site's pool must also have a live worker where ``stage`` (a stage flow's
    name, e.g. ``train-stage``) dispatched with ``mode`` would run in it; a stage run in this process needs none
    (``orchestration.dispatch.stage_workers``)."""
    from orchestration.dispatch import stage_workers

    healths = stages.site_health(ws, stage_workers(stage, mode))
    create_table_artifact([row for h in healths for row in h.to_rows()], key="site-health",
                          description="Site health: SSH hosts, store, pool workers")
    return unavailable(healths)
