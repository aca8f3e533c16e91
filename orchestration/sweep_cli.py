"""SweepCommand: ``hybridtrain sweep SPEC`` — run a job's hyperparameter sweep, or with ``--plan`` show where its trials would run and what it would cost.

Mounted by ``register(app)``. ``--plan`` has no side effects (no flow run, no study): the
placement engine places the sweep's concurrent trial slots (``hybridtrain.sweeps.plan``).
Without it the ``hyperparameter-sweep`` flow runs (Prefect imported then, not before) and the
trials' table, the best trial and its promotion are printed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.workspace import Workspace

console = Console()
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log


def _ws(home: Path | None) -> Workspace:
    """The workspace, with its Prefect settings in the environment before Prefect is imported (as ``run`` does)."""
    import os

    ws = Workspace.resolve(home)
    for k, v in {**ws.prefect_env(), "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain", "DVC_NO_ANALYTICS": "1",
                 "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}.items():
        os.environ.setdefault(k, v)
    return ws


def _fail(exc: HybridtrainError) -> None:
    # text, not markup (rich would eat "[a, b]" in it); soft_wrap keeps each line whole in a pipe or a log
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


def sweep(
    spec: Annotated[Path, typer.Argument(help="Job spec with a sweep: section.")],
    plan: Annotated[bool, typer.Option("--plan", help="Show where trials would run and the estimated cost; "
                                                      "run nothing.")] = False,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default HYBRIDTRAIN_SWEEP_STORAGE, else "
                                                     "the served stack's database when PREFECT_API_URL is its API, "
                                                     "else SQLite under .hybridtrain/sweeps/).")] = None,
    dispatch: Annotated[str, typer.Option(help="auto, inline or pools (as for `hybridtrain run`).")] = "auto",
    promote: Annotated[bool, typer.Option(help="Evaluate and try to promote the best trial.")] = True,
    dataset_bytes: Annotated[int, typer.Option(help="--plan: size of the approved data a sync would send.")] = 0,
    queue: Annotated[list[str] | None, typer.Option(help="--plan: SITE=RUNNING/QUEUED[@HOURS]; repeatable.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan or the summary as JSON.")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")] = None,
) -> None:
    """Run the hyperparameter sweep of SPEC (or --plan it) and print every trial and the best one."""
    from hybridtrain.placement.policy import Policy
    from hybridtrain.validation import load_job

    if dispatch not in ("auto", "inline", "pools"):
        err.print(f"--dispatch must be auto, inline or pools, not {dispatch!r}")
        raise typer.Exit(2)
    ws = _ws(home)
    path = spec if spec.is_absolute() else ws.root / spec
    try:
        sites = ws.load_sites()
        # every check `hybridtrain validate` makes (samplers, pruners, the policy's job classes, gates...)
        policy = Policy.load(ws.policy_file, sites) if ws.policy_file.is_file() else None
        job = load_job(path, sites, policy)
        if job.sweep is None:
            raise SpecError(str(spec), [Problem("sweep", "this job spec has no sweep section: add one (README, "
                                                         "'Hyperparameter sweeps') or run it with `hybridtrain run`")])
        if plan:
            _print_plan(ws, job, sites, policy or Policy.load(ws.policy_file, sites), dataset_bytes, queue or [],
                        as_json, storage)
            return
        from hybridtrain.sweeps.study import open_storage, storage_field, storage_url

        # A study database that cannot be opened is refused naming --storage (or the variable), before Prefect
        # starts; the flow reuses the storage opened here.
        open_storage(storage_url(ws, storage), storage_field(storage, "--storage"))
        from orchestration.session import open_session, owned_runs  # lazy: heavy (prefect)

        open_session(ws.root)
        from flows.sweep import sweep as sweep_flow  # lazy: heavy (prefect, torch, optuna)

        with owned_runs():
            summary = sweep_flow(spec_path=str(spec), workspace=str(ws.root), storage=storage, dispatch=dispatch,
                                 promote_best=promote)
    except HybridtrainError as exc:
        _fail(exc)
    if as_json:
        console.print_json(summary.model_dump_json())
        return
    print_summary(summary)


def _print_plan(ws: Any, job: Any, sites: Any, policy: Any, dataset_bytes: int, queue: list[str], as_json: bool,
                storage: str | None = None) -> None:
    from hybridtrain.cli.placement import parse_queue
    from hybridtrain.sweeps.plan import plan_sweep
    from hybridtrain.sweeps.study import storage_url

    queues = {q.site: q for q in (parse_queue(text, sites) for text in queue)}
    result = plan_sweep(job, sites, policy, dataset_bytes=dataset_bytes,
                        now=datetime.now(UTC), queues=queues)
    if as_json:
        console.print_json(json.dumps({**result.model_dump(mode="json"), "cost_usd": result.cost_usd,
                                       "hours": result.hours}))
        return
    t = Table(title=f"Sweep plan: {result.study} — {result.n_trials} trials, {result.parallelism} at a time "
                    f"(job class {result.job_class})", title_justify="left")
    for c in ("slot", "site", "capacity", "trials", "est. $/trial", "why"):
        t.add_column(c)
    for s in result.slots:
        t.add_row(str(s.slot), s.site, s.capacity_class, str(s.trials), f"{s.cost_per_trial_usd:.2f}",
                  "; ".join(s.reasons)[:160])
    console.print(t)
    console.print(f"Estimated cost at most [bold]${result.cost_usd:.2f}[/] (every trial running all its epochs, "
                  f"{result.run_hours:.2f} h each; pruned trials cost less); about {result.hours:.1f} h of wall time.")
    for where, n in result.by_site().items():
        console.print(f"  - {where}: {n} trials")
    for site, why in result.rejected.items():
        console.print(f"  rejected {site}: {why}", highlight=False)
    if job.budget_usd is not None and result.cost_usd > job.budget_usd:
        console.print(f"[yellow]Note:[/] budget_usd (${job.budget_usd:g}) is checked for each trial; the whole "
                      f"sweep may cost up to ${result.cost_usd:.2f} (lower n_trials, or run trials on cheaper "
                      "capacity).", highlight=False)
    console.print(f"Study storage: {storage_url(ws, storage).split('@')[-1]}", highlight=False)


def print_summary(summary: Any) -> None:
    t = Table(title=f"Sweep {summary.study} ({len(summary.trials)} trials)", title_justify="left")
    rows = [r.as_row() for r in summary.trials]
    for c in (rows[0] if rows else {"trial": ""}):
        t.add_column(c)
    for r in rows:
        t.add_row(*r.values())
    console.print(t)
    if summary.best_trial is None:
        console.print("No trial completed.")
    else:
        params = ", ".join(f"{k}={v}" for k, v in (summary.best_params or {}).items())
        console.print(f"Best: trial [bold]{summary.best_trial}[/] ({summary.best_value:.4f}): {params}")
    console.print(f"{summary.trial_epochs} trial-epochs, cost ${summary.cost_usd:.4f} (in the ledger of the promoted "
                  f"version); {summary.seconds:.1f} s")
    if summary.promoted is not None:
        moved = "champion moved to it" if summary.promoted else "champion unchanged"
        console.print(f"Version {summary.model_version}: {moved}")
        for r in summary.reasons:
            console.print(f"  - {r}", highlight=False)
    for p in summary.plots:
        console.print(f"Plot: {p}", highlight=False)
    console.print(f"MLflow run {summary.mlflow_run_id}; study storage {summary.storage}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
