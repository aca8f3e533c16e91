"""Service CLI: ``hybridtrain doctor`` — is the served stack (Prefect, its services, MLflow, PostgreSQL, S3, workers) working?"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hybridtrain.errors import HybridtrainError

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def doctor(
    home: Annotated[Path | None, typer.Option("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")] = None,
    api: Annotated[str | None, typer.Option("--api", help="Check this Prefect API instead of the stack from `make up`.")] = None,
    log: Annotated[Path | None, typer.Option("--log", help="That server's log (its services' failures are read from it).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the problems.")] = False,
) -> None:
    """Check the served stack; one line per part, each problem naming the failing service and why. Exit 1 on a problem."""
    from hybridtrain.service.doctor import diagnose, diagnose_server
    from hybridtrain.service.stack import Stack
    from hybridtrain.workspace import Workspace

    root = Workspace.resolve(home).root
    try:
        stack = None if api else Stack.load(root)
    except HybridtrainError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from None
    if stack is not None:
        found = diagnose(stack)
    else:
        api = api or os.environ.get("PREFECT_API_URL")
        if not api:
            err.print(f"error: no stack in {Stack.file(root)} and no PREFECT_API_URL; start one with `make up` "
                      "or pass --api http://HOST:PORT/api")
            raise typer.Exit(2)
        default_log = root / ".hybridtrain" / "logs" / "prefect-server.log"  # `make ui` writes it
        found = diagnose_server(api.rstrip("/"), log or (default_log if default_log.is_file() else None))
    for f in found:
        if not (quiet and f.ok):
            (console if f.ok else err).print(f.line())
    problems = [f for f in found if not f.ok]
    if problems:
        err.print(f"{len(problems)} problem(s)")
        raise typer.Exit(1)
    console.print("all checks passed")


def register(app: typer.Typer) -> None:
    app.command()(doctor)
