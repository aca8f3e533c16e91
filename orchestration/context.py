"""Run context: the workspace a flow run works in, with its sites' credentials and its identity for the audit log."""

from __future__ import annotations

import os
from collections.abc import Sequence

from prefect import runtime

from blocks.site import with_site_secrets
from hybridtrain.errors import Problem, SpecError
from hybridtrain.workspace import ROOT_FIX, Workspace

# The last resolved workspace, by (root, flow run): stages run inline in the lifecycle's flow run
# resolve the same workspace again, and its site blocks need not be read from the server twice.
_last: tuple[tuple[str, str], Workspace] | None = None


def checked_workspace(workspace: str | None) -> Workspace:
    """The workspace a flow's ``workspace`` parameter names (empty: ``HYBRIDTRAIN_HOME``, else the current
    directory), refused (``SpecError`` naming ``workspace`` or ``HYBRIDTRAIN_HOME``, with the fix) unless it is an
    existing directory with a sites catalog (``Workspace.checked``, the check the CLI makes of ``--home``)."""
    home = os.environ.get("HYBRIDTRAIN_HOME") or "not set where this flow runs: the current directory"
    return Workspace.checked(
        workspace, name="workspace", fix=f"{ROOT_FIX}, or leave it empty to use HYBRIDTRAIN_HOME ({home})",
        env_fix="set HYBRIDTRAIN_HOME (of the worker running this flow) to the workspace root, the folder holding "
                "deployments/sites.yaml, or give workspace",
        unset_fix="workspace is empty and HYBRIDTRAIN_HOME is not set where this flow runs; give workspace (the "
                  "folder holding deployments/sites.yaml), or set HYBRIDTRAIN_HOME of its worker")


def run_workspace(workspace: str | None, *, problems: Sequence[Problem] = (), source: str = "parameters") -> Workspace:
    """Check and resolve the workspace (``checked_workspace``), load site credentials from their blocks, and name
    this flow run as the actor.

    ``problems`` are what the calling flow found wrong with its other parameters: with the workspace's, they are
    refused together in one ``SpecError`` (from ``source``, the flow) before anything is read from the server.
    """
    global _last
    try:
        ws = checked_workspace(workspace)
    except SpecError as exc:
        if problems:
            raise SpecError(source, [*exc.problems, *problems]) from None
        raise
    if problems:
        raise SpecError(source, problems)
    run = str(runtime.flow_run.id or "")
    key = (str(ws.root), run)
    if run and _last is not None and _last[0] == key:
        return _last[1]
    ws = with_site_secrets(ws)
    if run:
        ws = ws.with_actor(f"prefect flow run {runtime.flow_run.name} ({runtime.flow_run.id})")
        _last = (key, ws)
    return ws
