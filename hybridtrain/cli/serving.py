"""ServingCommands: ``hybridtrain serve TARGET`` and ``hybridtrain canary TARGET VERSION``, mounted by ``register(app)``.

- ``serve TARGET`` verifies and loads the version TARGET's ``current`` pointer names and serves
  it over HTTP (``POST /invocations``, ``GET /version``, ``GET /ping``) until interrupted,
  following the pointer (release, rollback, canary) without dropping requests. It prints one
  line, ``serving MODEL vN from TARGET at URL (site SITE)``, once it accepts requests.
  ``--port 0`` picks a free port.
- ``canary TARGET VERSION`` releases VERSION to TARGET only (from the bundle archive, verified
  there) and routes ``--share`` of its requests to it; the servers of TARGET judge it on live
  traffic and promote or roll it back by themselves.

Release targets come from ``--spec`` (the job spec's ``promotion.release_targets``) or, with
only ``--model``, from the target specs recorded on the champion version.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hybridtrain.errors import HybridtrainError
from hybridtrain.workspace import Workspace

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Job spec whose promotion.release_targets name TARGET.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Registered model name (default: the spec's).")]
KeyOpt = Annotated[Path | None, typer.Option(
    "--public-key", envvar="HYBRIDTRAIN_RELEASE_PUBLIC_KEY",
    help="PEM public key bundles must verify under (default .hybridtrain/keys/release.pub.pem).")]


def _fail(exc: HybridtrainError) -> typer.Exit:
    err_console.print("error:", str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def serve_command(
    target: Annotated[str, typer.Argument(help="Release target name (promotion.release_targets[].name).")],
    spec: SpecOpt = None,
    model: ModelOpt = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: a free one).")] = 8080,
    poll: Annotated[float, typer.Option(help="Seconds between checks of the target's pointers.")] = 2.0,
    threads: Annotated[int, typer.Option(help="torch threads for scoring.")] = 1,
    public_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Serve the version TARGET's current pointer names, after its bundle verifies; follow the pointer."""
    import logging

    from hybridtrain.serving.server import bind, run
    from hybridtrain.serving.service import build_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        ws = Workspace.resolve(home)
        server = build_server(ws, target, spec_path=spec, model=model, public_key=public_key, poll_s=poll)
        sock = bind(host, port)
        bound_host, bound_port = sock.getsockname()[:2]
        server.url = f"http://{bound_host}:{bound_port}"
        sv = server.start()
    except HybridtrainError as exc:
        raise _fail(exc) from None
    except OSError as exc:
        err_console.print(f"error: cannot listen on {host}:{port} ({exc.strerror}); choose another --port (0: any "
                          "free one)", style="red", highlight=False, markup=False)
        raise typer.Exit(2) from None
    print(f"serving {server.model} v{sv.version} from {target} at {server.url} (site {server.site})", flush=True)
    run(server, sock, threads=threads)


def canary_command(
    target: Annotated[str, typer.Argument(help="Release target that gets the canary.")],
    version: Annotated[str, typer.Argument(help="Model version to put on trial.")],
    spec: SpecOpt = None,
    model: ModelOpt = None,
    share: Annotated[float, typer.Option(help="Share of TARGET's requests sent to VERSION (0-1).")] = 0.1,
    min_requests: Annotated[int, typer.Option(help="Requests each version serves before the verdict.")] = 200,
    max_error_rate_increase: Annotated[float, typer.Option(help="Allowed rise in error rate.")] = 0.01,
    max_p99_ratio: Annotated[float, typer.Option(help="Allowed canary/current p99 latency ratio.")] = 1.5,
    max_score_ks: Annotated[float, typer.Option(help="Allowed KS statistic between the score samples.")] = 0.2,
    public_key: KeyOpt = None,
    actor: Annotated[str | None, typer.Option(help="Who is acting, for the audit log (default cli:<user>).")] = None,
    home: HomeOpt = None,
) -> None:
    """Release VERSION to TARGET alone as a canary; its servers promote or roll it back on live traffic."""
    from pydantic import ValidationError

    from hybridtrain.errors import Problem, SpecError
    from hybridtrain.serving.service import start_canary

    try:
        ws = Workspace.resolve(home)
        try:
            plan = start_canary(ws, target, version, spec_path=spec, model=model, public_key=public_key,
                                actor=actor or f"cli:{getpass.getuser()}", share=share, min_requests=min_requests,
                                max_error_rate_increase=max_error_rate_increase, max_p99_ratio=max_p99_ratio,
                                max_score_ks=max_score_ks)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise SpecError("canary", [Problem("--" + str(e["loc"][0]).replace("_", "-"), e["msg"])]) from None
    except HybridtrainError as exc:
        raise _fail(exc) from None
    console.print(f"canary: {plan.share:.0%} of {target}'s requests go to {plan.model} v{plan.version}; judged after "
                  f"{plan.min_requests} requests each", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``canary`` to the main CLI."""
    app.command("serve")(serve_command)
    app.command("canary")(canary_command)
