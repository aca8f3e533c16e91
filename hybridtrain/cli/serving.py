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
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hybridtrain.errors import HybridtrainError, Problem, SpecError
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

    from hybridtrain.serving.options import CLI_NAMES, check_options, listen
    from hybridtrain.serving.server import Terminated, run, sigterm_unwinds
    from hybridtrain.serving.service import build_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        # SIGTERM (kill, a supervisor) unwinds from here on, so the status written at start is removed again.
        with sigterm_unwinds():
            check_options(host, port, poll, threads=threads, target=target, names=CLI_NAMES)
            ws = Workspace.resolve(home)
            sock = listen(host, port, names=CLI_NAMES)
            server = build_server(ws, target, spec_path=spec, model=model, public_key=public_key, poll_s=poll)
            bound_host, bound_port = sock.getsockname()[:2]
            server.url = f"http://{bound_host}:{bound_port}"
            try:
                sv = server.start()
                print(f"serving {server.model} v{sv.version} from {target} at {server.url} (site {server.site})",
                      flush=True)
                run(server, sock, threads=threads)
            finally:
                server.stop()  # start() published the status: however serving ends, it is removed
    except HybridtrainError as exc:
        raise _fail(exc) from None
    except OSError as exc:  # the target, the cache or the workspace could not be read or written
        where = f"{exc.filename}: " if exc.filename else ""
        err_console.print(f"error: serve: {where}{exc.strerror or exc}; check that it exists and this user may read "
                          "and write it", style="red", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except Terminated as exc:
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(128 + signal.SIGINT) from None


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
    from hybridtrain.serving.canary import limit_problems
    from hybridtrain.serving.service import check_version, start_canary

    limits = {"share": share, "min_requests": min_requests, "max_error_rate_increase": max_error_rate_increase,
              "max_p99_ratio": max_p99_ratio, "max_score_ks": max_score_ks}
    try:
        # Every option first, all of them reported: nothing is released to the target while one is wrong.
        problems = [Problem("--" + p.path.replace("_", "-"), p.message) for p in limit_problems(limits)]
        if problems:
            raise SpecError("canary", problems)
        check_version(version, command="canary")
        ws = Workspace.resolve(home)
        plan = start_canary(ws, target, version, spec_path=spec, model=model, public_key=public_key,
                            actor=actor or f"cli:{getpass.getuser()}", **limits)
    except HybridtrainError as exc:
        raise _fail(exc) from None
    console.print(f"canary: {plan.share:.0%} of {target}'s requests go to {plan.model} v{plan.version}; judged after "
                  f"{plan.min_requests} requests each", highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``canary`` to the main CLI."""
    app.command("serve")(serve_command)
    app.command("canary")(canary_command)
