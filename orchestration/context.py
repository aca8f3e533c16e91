"""Run context: the workspace a flow run works in, with its sites' credentials and its identity for the audit log."""

from __future__ import annotations

from prefect import runtime

from blocks.site import with_site_secrets
from hybridtrain.workspace import Workspace

# The last resolved workspace, by (root, flow run): stages run inline in the lifecycle's flow run
# resolve the same workspace again, and its site blocks need not be read from the server twice.
_last: tuple[tuple[str, str], Workspace] | None = None


def run_workspace(workspace: str | None) -> Workspace:
    """Resolve the workspace, load site credentials from their blocks, and name this flow run as the actor."""
    global _last
    ws = Workspace.resolve(workspace)
    run = str(runtime.flow_run.id or "")
    key = (str(ws.root), run)
    if run and _last is not None and _last[0] == key:
        return _last[1]
    ws = with_site_secrets(ws)
    if run:
        ws = ws.with_actor(f"prefect flow run {runtime.flow_run.name} ({runtime.flow_run.id})")
        _last = (key, ws)
    return ws
