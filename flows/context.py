"""Run context: the workspace a flow run works in, with its sites' credentials and its identity for the audit log."""

from __future__ import annotations

from prefect import runtime

from blocks.site import with_site_secrets
from hybridtrain.workspace import Workspace


def run_workspace(workspace: str | None) -> Workspace:
    """Resolve the workspace, load site credentials from their blocks, and name this flow run as the actor."""
    ws = with_site_secrets(Workspace.resolve(workspace))
    if runtime.flow_run.id:
        ws = ws.with_actor(f"prefect flow run {runtime.flow_run.name} ({runtime.flow_run.id})")
    return ws
