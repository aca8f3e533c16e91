"""CLI: ``hybridtrain`` — validate, plan and run jobs, set up a workspace, inspect runs and models.

User mistakes print a message naming the file/field and the fix, and exit non-zero without a
traceback. Prefect is imported only by the commands that run flows, after the workspace's
Prefect settings are applied (so importing this module imports no Prefect).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridtrain.cli import federated as cli_federated
from hybridtrain.cli import governance as cli_governance
from hybridtrain.cli import gpus as cli_gpus
from hybridtrain.cli import options as cli_options
from hybridtrain.cli import placement as cli_placement
from hybridtrain.cli import service as cli_service
from hybridtrain.cli import serving as cli_serving
from hybridtrain.drill.runner import check_drill, run_drill
from hybridtrain.errors import HybridtrainError
from hybridtrain.specs.job import json_schema
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.workspace import Workspace

app = typer.Typer(
    name="hybridtrain",
    help="Control plane for ML training across on-prem GPU servers and cloud GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="The churn sample dataset (synthetic customers): generate it and version it with DVC.",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")
# Piped output (CI logs, `make demo | tee`) gets a wide fixed width instead of rich's 80 columns.
console = Console(width=None if sys.stdout.isatty() else 120)
# soft_wrap: an error or warning line stays whole in a pipe or a log, however long its paths
err = Console(stderr=True, width=None if sys.stderr.isatty() else 120, soft_wrap=True)

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")]
UI_HINT = (
    "Open the UIs: `make ui` (Prefect http://127.0.0.1:4200, MLflow http://127.0.0.1:5000); "
    "or run `prefect server start` and `mlflow ui --backend-store-uri {uri}` yourself."
)


def open_workspace(home: Path | None) -> Workspace:
    """The workspace at ``home``, with Prefect/DVC/MLflow defaults set for this process. A ``--home`` that is not
    a directory, or a workspace without a valid sites catalog, is refused in one line (exit 2) before anything
    (Prefect's home) is created."""
    try:
        ws = cli_options.checked_workspace(home)
        ws.load_sites()
    except HybridtrainError as exc:
        fail(exc)
    env = ws.prefect_env()
    if env:  # Prefect's home must exist before anything points it there
        Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    for k, v in env.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "hybridtrain")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return ws


def fail(exc: HybridtrainError) -> None:
    # The message is text, not markup: escape it, or rich would eat "[a, b]" in it.
    # soft_wrap: a one-line message stays one line in a log or a pipe, whatever the console width.
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


# -- validate / schema -----------------------------------------------------------------------


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Job specs, sites catalogs or policy files.")],
    home: HomeOpt = None,
) -> None:
    """Check files completely — a job spec against the sites catalog, the policy and the registries —
    and report every problem with its field path and line, in one pass."""
    from hybridtrain.validation import validate_file

    ws = Workspace.resolve(home)
    failed = 0
    for f in files:
        try:
            kind = validate_file(f, ws.sites_file, ws.policy_file)
            console.print(f"[green]ok[/] {escape(str(f))} ({kind})")
        except HybridtrainError as exc:
            failed += 1
            err.print(f"[bold red]invalid[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(2)


@app.command()
def schema(out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None) -> None:
    """Print the JSON Schema of job specs (generated from the models)."""

    text = json.dumps(json_schema(), indent=2)
    if out is None:
        sys.stdout.write(text + "\n")
        return
    why = ("is empty" if not str(out).strip() else "is a directory" if out.is_dir() else
           f"is in {out.parent}, which is not a directory" if not out.parent.is_dir() else None)
    if why:
        fail(cli_options.OptionError("--out", f"{str(out)!r} {why}; give a file path, e.g. --out schema.json"))
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text + "\n")
        os.replace(tmp, out)  # whole or not at all
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fail(cli_options.OptionError("--out", f"cannot write {out}: {exc.strerror}; give a path you can write"))
    console.print(f"wrote {out}")


# -- workspace and data ----------------------------------------------------------------------


def init_workspace(ws: Workspace) -> None:
    from hybridtrain import stages  # lazy: heavy (pandas, numpy)
    sites = ws.load_sites()
    ws.state_dir.mkdir(parents=True, exist_ok=True)
    default = next((s.name for s in sites.sites if s.kind.value == "onprem"), sites.sites[0].name)
    stages.workspace_repo(ws, sites, default)


#: The file ``data generate`` makes, and the only dataset path its ``--pin`` sets an md5 for.
SAMPLE_PATH = "data/raw/churn.csv"


def sample_pin_target(ws: Workspace, pin: Path) -> Path:
    """The job spec ``--pin`` names, if its ``dataset.md5`` can be set to the churn sample's version: a job
    spec (``cli.options.job_spec_target``) whose ``dataset.path`` is ``data/raw/churn.csv``. ``OptionError``
    otherwise — checked before anything is generated."""
    path, data = cli_options.job_spec_target(ws, pin)
    dataset = data.get("dataset")
    shown = str(pin)
    if not isinstance(dataset, dict) or "path" not in dataset:
        raise cli_options.OptionError("--pin", f"{shown} has no dataset.path; add `dataset: {{path: {SAMPLE_PATH}, "
                                                 "md5: ..., site: ...}` to pin the churn sample")
    declared = Path(str(dataset["path"]))
    if (declared if declared.is_absolute() else ws.root / declared).resolve() != ws.path(SAMPLE_PATH).resolve():
        raise cli_options.OptionError(
            "--pin", f"{shown} trains on dataset.path {dataset['path']}, not {SAMPLE_PATH} (the file this command "
                     f"makes); pin a spec of the churn sample, or set that file's md5 yourself (`dvc add` prints "
                     f"it; `hybridtrain split-sites --pin` for split data)")
    return path


def _pin(spec_file: Path, md5: str) -> bool:
    """Set ``dataset.md5`` in ``spec_file`` (a job spec ``sample_pin_target`` accepted) to ``md5``, in place and
    atomically, keeping its comments and layout; add the key when the dataset has none. Whether it changed."""
    text = spec_file.read_text(encoding="utf-8")
    root = yaml.compose(text, Loader=yaml.SafeLoader)  # node marks locate the value; pure Python: str offsets
    dataset = next((v for k, v in getattr(root, "value", ()) if getattr(k, "value", None) == "dataset"), None)
    if not isinstance(dataset, yaml.MappingNode) or not dataset.value:  # the file changed since it was checked
        raise cli_options.OptionError("--pin", f"{spec_file} no longer has a dataset mapping; pin it again")
    quoted = f'"{md5}"'
    node = next((v for k, v in dataset.value if k.value == "md5"), None)
    if node is not None:
        start, end = node.start_mark.index, node.end_mark.index
        if str(node.value) == md5:
            return False
        tail = "\n" if text[start:end].endswith("\n") else ""  # a block scalar's span ends with its newline
        new = text[:start] + quoted + tail + text[end:]
    else:
        first = dataset.value[0][0].start_mark
        between = ", " if dataset.flow_style else "\n" + " " * first.column
        new = text[:first.index] + f"md5: {quoted}" + between + text[first.index:]
    tmp = spec_file.with_suffix(spec_file.suffix + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    shutil.copymode(spec_file, tmp)
    os.replace(tmp, spec_file)
    return True


def check_sample_options(rows: int, seed: int) -> None:
    """``--rows`` and ``--seed`` of ``data generate`` in range, or ``OptionError``; nothing is created."""
    from hybridtrain.datasets.sample_data import MIN_ROWS, seed_problem

    cli_federated.check_rows(rows, MIN_ROWS, f"fewer than {MIN_ROWS} cannot fill 10 % validation and test splits "
                                             "of 10 rows each")
    problem = seed_problem(seed)
    if problem:
        raise cli_options.OptionError("--seed", problem)


def ensure_sample_data(ws: Workspace, rows: int, seed: int, pin: Path | None) -> tuple[str, bool]:
    """Generate the churn CSV if absent, track it with DVC, push it to the on-prem store; set ``pin``'s
    ``dataset.md5`` to its version. ``rows``, ``seed``, ``pin`` and the sites catalog are checked before
    anything is created (``OptionError``, ``SpecError``)."""
    from hybridtrain import stages  # lazy: heavy (pandas, numpy)
    from hybridtrain.datasets.sample_data import write_churn_csv  # lazy: heavy (pandas, numpy)

    check_sample_options(rows, seed)
    target = sample_pin_target(ws, pin) if pin is not None else None
    sites = ws.load_sites()
    site = next((s for s in sites.sites if s.kind.value == "onprem"), sites.sites[0])
    repo = stages.workspace_repo(ws, sites, site.name)
    rel = SAMPLE_PATH
    path = ws.path(rel)
    generated = False
    current = repo.version(rel, "raw", site.name)
    if not path.exists() or current is None or not repo.is_present(current):
        write_churn_csv(path, rows=rows, seed=seed)
        generated = True
    version = repo.add(rel, "raw", site.name)
    repo.push(version, remote=site.dvc_remote)
    if target is not None:
        _pin(target, version.md5)
    return version.md5, generated


@data_app.command("generate")
def data_generate(
    rows: Annotated[int, typer.Option(help="Rows to generate, 100 to 10,000,000 (>= 200,000 for the demo); "
                                           "ignored when the sample is already there.")] = 200_000,
    seed: Annotated[int, typer.Option(help="Generator seed (a whole number >= 0); same seed, same bytes.")] = 20261121,
    pin: Annotated[Path | None, typer.Option(
        help="Job spec (relative to the workspace root) whose dataset.md5 to set to this version, keeping its "
             "comments; its dataset.path must be data/raw/churn.csv. Any other file is refused before anything "
             "is generated; a spec that already pins this version is left as it is (and says so).")] = None,
    home: HomeOpt = None,
) -> None:
    """Generate the churn sample — data/raw/churn.csv, synthetic customers with PII-like columns, the data
    jobs/churn.yaml trains on — if missing; version it with DVC and push it to the on-prem store.

    Every option and the --pin target are checked first: a mistake is one line, exit status 2, nothing created.

    It makes only this dataset. For your own data: `dvc add data/raw/yours.csv`, then pin its md5 in your spec."""
    try:
        check_sample_options(rows, seed)
        target = sample_pin_target(cli_options.checked_workspace(home), pin) if pin is not None else None
    except HybridtrainError as exc:
        fail(exc)
    ws = open_workspace(home)
    try:
        md5, generated = ensure_sample_data(ws, rows, seed, None)
        pinned = _pin(target, md5) if target is not None else None
    except HybridtrainError as exc:
        fail(exc)
    console.print(f"churn sample {SAMPLE_PATH} {'generated' if generated else 'present'}; DVC md5 {md5}",
                  highlight=False)
    if pinned is not None:
        console.print(f"{pin}: dataset.md5 {'set to' if pinned else 'already pins'} {md5}", highlight=False)


# -- run / status / demo ---------------------------------------------------------------------


def print_summary(summary: Any, ws: Workspace) -> None:
    t = Table(title=f"Lifecycle of {summary.job}", title_justify="left")
    for c in ("stage", "site", "seconds", "what happened"):
        t.add_column(c)
    for s in summary.stages:
        t.add_row(s.stage, s.site, f"{s.seconds:.1f}", s.detail)
    console.print(t)
    p = summary.placement
    console.print(f"Placement: [bold]{p['site']}[/] ({p['capacity_class']}, strategy {p['strategy']}, "
                  f"est. ${p['est_cost_usd']:.2f})")
    for r in p["reasons"]:
        console.print(f"  - {r}")
    d = Table(title="Datasets (DVC md5)", title_justify="left")
    d.add_column("tier")
    d.add_column("md5")
    for tier, md5 in summary.datasets.items():
        d.add_row(tier, md5)
    console.print(d)
    m = Table(title="Test metrics", title_justify="left")
    m.add_column("metric")
    m.add_column("candidate")
    m.add_column("champion before")
    for k, v in summary.metrics.items():
        c = (summary.champion_metrics or {}).get(k)
        fmt = "{:,.0f}" if k == "n" else "{:.4f}"
        m.add_row(k, fmt.format(v), "" if c is None else fmt.format(c))
    console.print(m)
    moved = "moved to this version" if summary.promoted else "unchanged"
    console.print(
        f"Model [bold]{summary.model_name}[/] version [bold]{summary.model_version}[/]; alias champion -> "
        f"{'v' + summary.champion_version if summary.champion_version else 'none'} ({moved})"
        + (f", previous -> v{summary.previous_version}" if summary.previous_version else "")
    )
    for r in summary.reasons:
        console.print(f"  - {r}")
    g = Table(title="Promotion gates", title_justify="left")
    g.add_column("gate")
    g.add_column("verdict")
    for name, verdict in summary.gates.items():
        g.add_row(name, verdict)
    console.print(g)
    console.print(f"Cost of this version: ${summary.cost_usd:.4f} (hybridtrain ledger {summary.model_name}); "
                  f"released to: {', '.join(summary.released_to) or 'nothing'}")
    console.print(f"Bytes synced: {summary.bytes_synced:,} ({summary.sync_route or 'no sync'}), "
                  f"egress ${summary.egress_usd:.4f}")
    console.print(UI_HINT.format(uri=ws.tracking_uri))


#: ``status --limit`` at most.
STATUS_MAX_RUNS = 1000


@app.command()
def status(
    limit: Annotated[int, typer.Option(help=f"How many recent runs to show (1 to {STATUS_MAX_RUNS}).")] = 10,
    home: HomeOpt = None,
) -> None:
    """Recent lifecycle runs, each model's champion version and metrics, and any unfinished promotion."""
    from hybridtrain.governance.promotion import pending_promotions  # lazy: heavy, and only `status` needs it

    try:
        if not 1 <= limit <= STATUS_MAX_RUNS:
            raise cli_options.OptionError("--limit", f"{limit} is not a number of runs; give 1 to {STATUS_MAX_RUNS}")
        ws = cli_options.checked_workspace(home)
    except HybridtrainError as exc:
        fail(exc)
    fresh = ws.tracking_uri.startswith("sqlite:///") and not Path(ws.tracking_uri.removeprefix("sqlite:///")).exists()
    try:
        runs = [] if fresh else (reg := Registry(ws.tracking_uri, ws.mlflow_artifacts)).recent_runs(ws.experiment,
                                                                                                 limit)
    except HybridtrainError as exc:  # e.g. a store at another schema: its own line says what to do
        fail(exc)
    except Exception as exc:  # noqa: BLE001 - MLflow and SQLAlchemy raise many kinds for an unreadable store
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(HybridtrainError(f"cannot read the tracking store {ws.tracking_uri}: {first[:200]}; check "
                              "HYBRIDTRAIN_MLFLOW_TRACKING_URI or restore the store"))
    if not runs:
        console.print(f"no runs yet in {ws.tracking_uri}; run `make demo` or `hybridtrain run jobs/churn.yaml`")
        return
    t = Table(title="Recent lifecycle runs", title_justify="left")
    for c in ("started (UTC)", "job", "status", "site", "model version", "promoted", "test auc"):
        t.add_column(c)

    models = set()
    for r in runs:
        tags = r.data.tags
        started = datetime.fromtimestamp(r.info.start_time / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        auc = r.data.metrics.get("test_auc")
        t.add_row(started, tags.get("hybridtrain.job", "?"), r.info.status, tags.get("hybridtrain.site", ""),
                  tags.get("hybridtrain.model_version", ""), tags.get("hybridtrain.promoted", ""),
                  "" if auc is None else f"{auc:.4f}")
    console.print(t)
    for rm in reg.client.search_registered_models():
        models.add(rm.name)
    for name in sorted(models):
        champ = reg.by_alias(name, CHAMPION)
        if champ is None:
            console.print(f"{name}: no champion yet")
        else:
            metrics = {k.removeprefix("hybridtrain.metric."): v for k, v in champ.tags.items()
                       if k.startswith("hybridtrain.metric.")}
            shown = ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(metrics.items())
                              if k in ("auc", "accuracy", "f1"))
            console.print(f"{name}: champion v{champ.version} ({shown})")
        for p in pending_promotions(reg, name):  # a lifecycle stopped part-way through promoting it
            drop = ("a rollback ends it" if champ is not None and champ.version == p.version
                    else f"`hybridtrain retire {name} {p.version}` drops it")
            console.print(f"{name}: v{p.version} has an unfinished promotion (job {p.job}, run key {p.run_key}, "
                          f"started {p.started[:19].replace('T', ' ')} UTC); re-running job {p.job} with "
                          f"`hybridtrain run SPEC --run-key {p.run_key}` finishes it, {drop}",
                          highlight=False, markup=False)


@app.command()
def drill(
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", help="Scenario to run (repeatable; default all): kill-9, preempt, corrupt-checkpoint, "
                           "s3-down, ssh-down.")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps of each drill run.")] = 300,
    interval: Annotated[int | None, typer.Option(help="Steps between checkpoints (default steps/12).")] = None,
    out: Annotated[Path | None, typer.Option(help="Report directory (default .hybridtrain/drills/<timestamp>).")] = None,
    home: HomeOpt = None,
) -> None:
    """Failover drill: inject faults into a real training run, measure time to resume (RTO) and lost steps (RPO)."""

    try:
        # Every bad option (and the sites catalog) in one message, before the workspace is touched.
        check_drill(Workspace.resolve(home), scenario, steps=steps, interval=interval, out=out)
        ws = open_workspace(home)
        report = run_drill(ws, scenario, steps=steps, interval=interval, out=out,
                           say=lambda line: console.print(f"[dim]drill:[/] {line}", highlight=False))
    except HybridtrainError as exc:
        fail(exc)
    t = Table(title=f"Failover drill ({report.steps} steps, checkpoint every {report.checkpoint_interval})",
              title_justify="left")
    for c in ("scenario", "outcome", "RTO s", "RPO steps", "resumed from step", "notes"):
        t.add_column(c, overflow="fold")
    colour = {"ok": "green", "failed": "bold red", "skipped": "yellow"}
    for s in report.scenarios:
        t.add_row(s.scenario, f"[{colour[s.outcome]}]{s.outcome}[/]", "" if s.rto_s is None else f"{s.rto_s:.2f}",
                  "" if s.rpo_steps is None else f"{s.rpo_steps}{' (est.)' if s.rpo_estimated else ''}",
                  "" if s.resumed_from_step is None else str(s.resumed_from_step), "; ".join(s.notes))
    console.print(t)
    console.print(f"RTO: {report.definitions['rto_s']}.", highlight=False)
    console.print(f"RPO: {report.definitions['rpo_steps']}.", highlight=False)
    console.print(f"report: {report.directory}/report.md (and report.json)", highlight=False)
    if report.mlflow_run_id:
        console.print(f"MLflow: experiment hybridtrain-drills, run {report.mlflow_run_id}", highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False)
    if report.failed:
        raise typer.Exit(1)


cli_placement.register(app)
cli_governance.register(app)
cli_service.register(app)
cli_serving.register(app)
cli_federated.register(app)
cli_gpus.register(app)


def main() -> None:
    try:
        app()
    except HybridtrainError as exc:  # a command that forgot to catch: still no traceback
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)  # as ``fail``: lines kept whole
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
