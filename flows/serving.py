"""Serving flow: a long-running model server for one release target, run by a worker of the target's site's pool."""

from __future__ import annotations

from typing import Annotated

from prefect import flow, get_run_logger
from pydantic import Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from hybridtrain.serving.options import FLOW_NAMES, listen, option_problems
from hybridtrain.serving.server import run
from hybridtrain.serving.service import MAX_POLL_S, MIN_POLL_S, build_server
from orchestration.context import run_workspace


@flow(name="serve-model", log_prints=True)
def serve_model(target: str, spec_path: str = "jobs/churn.yaml", host: str = "0.0.0.0",
                port: Annotated[int, Field(ge=0, le=65535)] = 8080,
                poll_s: Annotated[float, Field(ge=MIN_POLL_S, le=MAX_POLL_S)] = 2.0,
                workspace: str | None = None) -> str:
    """Serve ``target``'s current version over HTTP until cancelled (the same server as ``hybridtrain serve``).

    The deployment of this flow lives in the pool of the site that serves the target: directory
    targets on-prem, object-store targets in their (cloud) site's pool. Cancelling the flow run
    stops the server (the run ends Cancelled); the version it served is in the audit log and the target's
    serving status. A ``host``, ``port``, ``poll_s`` or ``target`` that cannot work (a port out of range or in
    use, a host that is not this machine's) fails the run with one line naming it, before a model is loaded; the
    bounds of ``port`` and ``poll_s`` are in their types too, so a deployment run outside them is never created
    (see ``flows``).

    Args:
        target: The release target to serve (promotion.release_targets[].name in the job spec).
        spec_path: The job spec naming the target, relative to the workspace.
        host: Address to listen on: 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or another of this
            machine's addresses.
        port: Port to listen on, 1-65535 (0: any free one).
        poll_s: Seconds between checks of the target's pointers (releases, rollbacks, canaries), 0.05 to 3600.
        workspace: Workspace root on the worker. Empty: HYBRIDTRAIN_HOME or the working directory.
    """
    # Every parameter that cannot work, named as in the run form, refused with the workspace's before anything loads.
    ws = run_workspace(workspace, problems=option_problems(host, port, poll_s, target=target, names=FLOW_NAMES),
                       source=FLOW_NAMES.source)
    sock = listen(host, port, names=FLOW_NAMES)
    try:
        server = build_server(ws, target, spec_path=ws.root / spec_path, poll_s=poll_s)
    except BaseException:
        sock.close()
        raise
    server.url = f"http://{host}:{sock.getsockname()[1]}"
    sv = server.start()
    get_run_logger().info("serving %s v%s from %s at %s (site %s)", server.model, sv.version, target, server.url,
                          server.site)
    run(server, sock, handle_signals=False)  # Prefect's SIGTERM handler turns a cancel into Cancelled
    return f"stopped serving {server.model} at {server.url}"
