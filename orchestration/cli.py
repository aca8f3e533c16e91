"""CLI: the ``hybridtrain`` command — the core commands plus the ones that need Prefect.

The core's commands (validate, plan, simulate, status, data, audit, ledger, rollback, …) live in
``hybridtrain.cli.main`` and import no Prefect. This module adds the commands that talk to a Prefect
server or run flows — ``init``, ``run``, ``demo``, ``credentials``, ``deploy`` — and is the
installed entry point. Prefect and the flows are imported only by those commands, after the quick
checks (spec, data), so a mistake in a fresh clone is one line within about a second; each of them
opens a session first (``orchestration.session``: implicit, idempotent set-up, no ``init`` needed).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

from hybridtrain.cli import progress
from hybridtrain.cli.main import (
    HomeOpt,
    app,
    check_sample_options,
    console,
    ensure_sample_data,
    err,
    fail,
    main,
    open_workspace,
    print_summary,
)
from hybridtrain.cli.options import checked_workspace
from hybridtrain.cli.preflight import check_dataset
from hybridtrain.cli.run_log import RunLog
from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.placement.policy import Policy
from hybridtrain.service.stack import CONTROL_POOL
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.validation import load_job
from hybridtrain.workspace import Workspace
from orchestration import sweep_cli

__all__ = ["app", "main"]

sweep_cli.register(app)


#: The sample data seed of `demo` (the one jobs/churn.yaml's dataset.md5 pins).
DEMO_SEED = 20261121


def _open_session(home: Path | None) -> Any:
    """The workspace's session (``orchestration.session``), saying which stale runs it marked crashed."""
    from orchestration.session import open_session  # lazy: heavy (prefect)

    session = open_session(home)
    for row in session.crashed:
        mlflow = f"; MLflow run {row['mlflow_runs']} KILLED" if row["mlflow_runs"] else ""
        err.print(f"marked stale run {row['name']} ({row['flow_run']}) CRASHED: {row['reason']}{mlflow}",
                  markup=False, highlight=False, soft_wrap=True)
    return session


def _refuse(message: str, code: int = 2) -> NoReturn:
    """A user's mistake: one line on stderr (text, not markup) and a non-zero exit, no traceback."""
    err.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _checked_workspace(home: Path | None) -> tuple[Workspace, Any]:
    """The workspace and its sites catalog, checked before anything is created or a server started, without
    importing Prefect (a wrong --home is one line within a second): an existing directory with a valid catalog
    (``cli.federated.checked_workspace``). ``orchestration.session.check_workspace`` checks it again for Python
    callers, with the state directories."""
    try:
        ws = checked_workspace(home)
        catalog = ws.load_sites()
    except HybridtrainError as exc:
        fail(exc)
    return ws, catalog


@app.command()
def init(home: HomeOpt = None) -> None:
    """Set up a workspace now (every command that needs it does it by itself): DVC repo and remotes from the
    sites catalog, site blocks, signing and pseudonym keys; marks runs a killed process left RUNNING crashed."""
    ws, _ = _checked_workspace(home)
    try:
        session = _open_session(home)
    except HybridtrainError as exc:
        fail(exc)
    except OSError as exc:  # e.g. a read-only workspace: say which file, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        _refuse(f"cannot set up the workspace at {ws.root}: {exc.strerror or exc}{where}", 1)
    console.print(f"workspace ready at {session.ws.root}; pseudonym key "
                  f"{'created' if session.key_created else 'already present'}")


def _policy(ws: Workspace, sites: Any) -> Any:
    return Policy.load(ws.policy_file, sites) if ws.policy_file.is_file() else None


def _run_lifecycle(ws: Workspace, spec_path: Path, run_key: str | None, dispatch: str, job: Any = None) -> Any:
    """Run the lifecycle flow here, showing its progress (bars on a terminal, plain lines otherwise); a user
    error prints one clear line (Prefect's traceback goes to the run's log file only).

    Without ``run_key`` the run gets a fresh one, so that Ctrl-C can say how to resume it: ``interrupted: ...
    resume with `hybridtrain run SPEC --run-key KEY```, exit 130 (the checkpoints written so far are kept)."""
    from flows.lifecycle import lifecycle  # lazy: heavy (prefect, torch)
    from orchestration.session import owned_runs  # lazy: heavy (prefect)

    run_key = run_key or f"run-{uuid.uuid4().hex[:12]}"
    with RunLog(ws.state_dir / "logs") as log:
        try:
            with progress.shown(console), owned_runs():
                return lifecycle(spec_path=str(spec_path), spec=job, workspace=str(ws.root), run_key=run_key,
                                 dispatch=dispatch)
        except KeyboardInterrupt:
            err.print(f"interrupted: the run stopped; the checkpoints it wrote are kept. Resume its training with "
                      f"`hybridtrain run {spec_path} --run-key {run_key}` (the log: {log.path})", highlight=False,
                      markup=False, soft_wrap=True)
            raise typer.Exit(130) from None
        except HybridtrainError as exc:
            logging.getLogger("hybridtrain.cli").error("the run failed: %s", exc, exc_info=exc)
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            err.print(f"(the run's log, with Prefect's traceback: {log.path})", highlight=False, markup=False,
                      soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None


def demo_variant(ws: Workspace, job: Any) -> Any:
    """For a repeated demo: the spec with 2 more epochs per registered version, so each run trains a
    different (usually better) model and the champion — and ``previous`` — can move; None on the first run."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    name = job.registry.model_name
    if registry.by_alias(name, CHAMPION) is None:
        return None
    versions = len(registry.versions(name))
    return job.model_copy(update={"model": job.model.model_copy(update={"epochs": job.model.epochs + 2 * versions})})


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Job spec file.")],
    run_key: Annotated[str | None, typer.Option(help="Resume the checkpoints of this run key.")] = None,
    dispatch: Annotated[str, typer.Option(
        help="auto: send stages to the sites' work pools when their deployments exist (after `make deploy`), "
             "else run them here; inline: all here; pools: always through the pools.")] = "auto",
    home: HomeOpt = None,
) -> None:
    """Run the whole lifecycle of SPEC as a Prefect flow and print what happened."""
    if dispatch not in ("auto", "inline", "pools"):
        err.print(f"--dispatch must be auto, inline or pools, not {dispatch!r}")
        raise typer.Exit(2)
    ws = Workspace.resolve(home)
    try:
        sites = ws.load_sites()
        job = load_job(spec if spec.is_absolute() else ws.root / spec, sites, _policy(ws, sites))
        if run_key is not None:  # a ../ key would fail only at the first checkpoint (the import is heavy: only then)
            from hybridtrain.stages.training import check_run_key

            check_run_key(run_key, "--run-key")
        check_dataset(ws, job, sites, str(spec))
        ws = _open_session(home).ws
        summary = _run_lifecycle(ws, spec, run_key, dispatch)
    except HybridtrainError as exc:
        fail(exc)
    if hasattr(summary, "rounds"):  # a federated lifecycle (flows.federated.FederatedSummary)
        console.print(summary.to_markdown(), highlight=False, markup=False)
        return
    print_summary(summary, ws)


@app.command()
def demo(
    rows: Annotated[int, typer.Option(help="Sample rows.")] = 200_000,
    spec: Annotated[Path, typer.Option(help="Job spec to run.")] = Path("jobs/churn.yaml"),
    home: HomeOpt = None,
) -> None:
    """Everything on embedded defaults: workspace, sample data, the whole lifecycle, a summary."""
    try:
        check_sample_options(rows, DEMO_SEED)  # a bad --rows is one line, before the workspace is touched
    except HybridtrainError as exc:
        fail(exc)
    ws = open_workspace(home)
    try:
        md5, generated = ensure_sample_data(ws, rows, DEMO_SEED, None)
        sites = ws.load_sites()
        job = load_job(ws.root / spec if not spec.is_absolute() else spec, sites, _policy(ws, sites))
        if job.dataset.md5 != md5:
            raise SpecError(str(spec), [Problem("dataset.md5", f"pins {job.dataset.md5} but the generated sample "
                                                               f"data is {md5}; run `hybridtrain data generate "
                                                               f"--pin {spec}` to pin it")])
        console.print(f"sample data {'generated' if generated else 'present'}: data/raw/churn.csv md5 {md5}")
        session = _open_session(home)
        console.print(f"Prefect blocks registered; pseudonym key {'created' if session.key_created else 'present'}")
        # The embedded default runs every stage in this process, whatever deployments exist.
        variant = demo_variant(ws, job)
        if variant is not None:
            console.print(f"{job.registry.model_name} already has a champion: this run trains "
                          f"{variant.model.epochs} epochs instead of {job.model.epochs}, to compete with it")
        summary = _run_lifecycle(ws, spec, None, "inline", variant)
    except HybridtrainError as exc:
        fail(exc)
    print_summary(summary, ws)


#: What each credential file of a site block (``blocks.register.SECRET_FIELDS``) must hold, for messages.
CREDENTIAL_FILES = {
    "ssh_private_key": "the SSH private key (OpenSSH or PEM, e.g. ~/.ssh/id_ed25519)",
    "ssh_known_hosts": "the hosts' known_hosts lines",
    "aws_secret_access_key": "the S3 secret access key",
}
#: Far above any key, known_hosts or secret file; a bigger file is the wrong path.
MAX_CREDENTIAL_FILE_BYTES = 1 << 20


def _read_secret_file(path: Path, option: str, what: str) -> tuple[str | None, str | None]:
    """(the text of a credential file, None), or (None, a line naming the option, the file and the fix) — never
    the file's content: it may be a secret even when it is not a valid one."""
    label = f"{option} {path}"
    if not path.exists():
        return None, f"{label}: no such file: give the file holding {what}"
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        return None, f"{label} is {kind}: give the file holding {what}"
    try:
        size = path.stat().st_size
        if size > MAX_CREDENTIAL_FILE_BYTES:
            return None, f"{label} is {size:,} bytes, far more than {what}: check the path"
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"{label} cannot be read ({exc.strerror or exc}): give a file this user can read"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return None, f"{label} is not a text file (byte {exc.start} is not UTF-8): give the file holding {what}"
    if not text.strip():
        return None, f"{label} is empty: give the file holding {what}"
    return text, None


@app.command()
def credentials(
    site: Annotated[str, typer.Argument(help="Site name from the sites catalog.")],
    ssh_key: Annotated[Path | None, typer.Option(
        help="Private key file (OpenSSH or PEM, no passphrase) for the site's SSH hosts or the instances it "
             "starts.")] = None,
    known_hosts: Annotated[Path | None, typer.Option(
        help="known_hosts file pinning the keys of the site's SSH hosts.")] = None,
    aws_access_key_id: Annotated[str | None, typer.Option(
        help="AWS access key id: the site's S3 store and, with instances:, the EC2 API that starts them.")] = None,
    aws_secret_access_key_file: Annotated[Path | None, typer.Option(
        help="File holding the S3 secret key (a file, so the secret never lands in shell history).")] = None,
    home: HomeOpt = None,
) -> None:
    """Store a site's credentials in its Prefect block (encrypted server-side; never in YAML or git).

    Everything is checked before anything is set up or stored: the site is in the catalog, each option fits it
    (SSH options for a site with SSH hosts or instances, AWS options for an S3 store or instances) and each value
    is what it claims (a private key that loads, known_hosts lines pinning every host, non-empty keys)."""
    ws, catalog = _checked_workspace(home)
    if site not in catalog.names:
        _refuse(f"site {site!r} is not in {ws.sites_file} (sites: {', '.join(catalog.names)}): give one of them")
    # field -> (option, what the user gave: a file, or the key id itself)
    options: dict[str, tuple[str, Any]] = {
        "ssh_private_key": ("--ssh-key", ssh_key), "ssh_known_hosts": ("--known-hosts", known_hosts),
        "aws_access_key_id": ("--aws-access-key-id", aws_access_key_id),
        "aws_secret_access_key": ("--aws-secret-access-key-file", aws_secret_access_key_file)}
    given = {field: arg for field, (_, arg) in options.items() if arg is not None}
    if not given:
        _refuse(f"nothing to store for site {site}: give at least one of "
                f"{', '.join(option for option, _ in options.values())}")
    values: dict[str, str | None] = {}  # None: a file that could not be read
    unread: dict[str, str] = {}  # field -> why its file could not be read
    for field, arg in given.items():
        if field == "aws_access_key_id":
            values[field] = arg.strip()
            continue
        text, why = _read_secret_file(arg, options[field][0], CREDENTIAL_FILES[field])
        values[field] = text.strip() if text is not None and field == "aws_secret_access_key" else text
        if why:
            unread[field] = why
    from blocks.register import credential_problems, register_sites, set_credentials  # lazy: heavy (prefect)

    # An option that does not fit the site is that, whatever its file holds (a file not read is checked for fit).
    found = {p.path: p.message for p in credential_problems(catalog.get(site), **values)}
    problems: list[str] = []
    for field in given:
        option, arg = options[field]
        if field in found:
            label = option if field == "aws_access_key_id" else f"{option} {arg}"  # the key id itself is not echoed
            problems.append(f"{label}: {found[field]}")
        elif field in unread:
            problems.append(unread[field])
    if problems:
        for line in problems:
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    try:
        ws = _open_session(home).ws
        catalog = ws.load_sites()
        register_sites(catalog)
        changed = set_credentials(site, **values)
    except HybridtrainError as exc:
        fail(exc)
    console.print(f"site {site}: stored {', '.join(changed)}", highlight=False, markup=False, soft_wrap=True)


@app.command()
def instances(
    site: Annotated[str | None, typer.Option(help="Only this site (default: every site with instances:).")] = None,
    sweep: Annotated[bool, typer.Option(
        "--sweep", help="Terminate now the instances no running job needs (as each recover-runs pass does).")] = False,
    home: HomeOpt = None,
) -> None:
    """List the cloud instances multi-node jobs started, and which of them no running job needs.

    An instance is left over when the MLflow run it was started for has ended or its deadline (boot time +
    the job's max_hours + 30 min) has passed; `--sweep` terminates those (audited), as each pass of the
    scheduled recover-runs flow does."""
    from rich.table import Column, Table

    from hybridtrain import stages  # lazy: heavy (mlflow)

    ws = Workspace.resolve(home)
    try:
        catalog = ws.load_sites()
    except HybridtrainError as exc:
        fail(exc)
    fleet_sites = [s.name for s in catalog.sites if s.instances is not None]
    if site is not None and site not in catalog.names:
        err.print(f"--site {site!r} is not a site of {ws.sites_file} (sites: {', '.join(catalog.names)})",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2)
    if site is not None and site not in fleet_sites:
        err.print(f"site {site} starts no instances: add an instances: block to sites.{site} in {ws.sites_file}",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2)
    if not fleet_sites:
        console.print(f"no site in {ws.sites_file} starts instances (none has an instances: block)", highlight=False,
                      soft_wrap=True)
        return
    from blocks.site import with_site_secrets  # lazy: heavy (prefect)

    try:
        ws = with_site_secrets(_open_session(home).ws)
        chosen = [site] if site else fleet_sites
        rows = stages.sweep_instances(ws, sites=chosen) if sweep else stages.list_instances(ws, chosen)
    except HybridtrainError as exc:
        fail(exc)
    failed = [r for r in rows if "error" in r]
    for r in failed:
        err.print(f"site {r['site']}: {r['error']}", highlight=False, markup=False, soft_wrap=True)
    found = [r for r in rows if "error" not in r]
    if sweep:
        for r in found:
            console.print(f"terminated {r['instance']} at {r['site']} (job {r['job_id']}): {r['reason']}",
                          highlight=False, markup=False, soft_wrap=True)
        console.print(f"{len(found)} instance(s) terminated", highlight=False)
    elif found:
        table = Table("site", Column("instance", no_wrap=True), "state", "type", "job", "its run", "expires",
                      "leftover")
        for r in found:
            why = r["leftover"].replace(f"its MLflow run {r['mlflow_run']} ", "its run ") if r["mlflow_run"] else \
                r["leftover"]
            table.add_row(r["site"], r["instance"], r["state"], r["type"], r["job_id"] or "-", r["run"] or "-",
                          r["expires"][:16] or "-", escape(why) or "-")
        console.print(table)
        left = [r for r in found if r["leftover"]]
        if left:
            console.print(f"{len(left)} leftover instance(s): `hybridtrain instances --sweep` terminates them now "
                          "(each recover-runs pass does too)", highlight=False, markup=False, soft_wrap=True)
    else:
        console.print(f"no live instances at {', '.join(chosen)}", highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command()
def deploy(
    home: HomeOpt = None,
    code_repo: Annotated[list[str] | None, typer.Option(
        "--code-repo", envvar="HYBRIDTRAIN_CODE_REPO",
        help="Sites on separate hosts: the git URL a pool's workers clone the code from, as POOL=URL (repeat per "
             "pool) or URL for every pool. Its deployments then check out --code-ref there instead of using "
             "this checkout.")] = None,
    code_ref: Annotated[str, typer.Option(help="Commit of this checkout the workers run (pushed to --code-repo).")]
    = "HEAD",
) -> None:
    """Create work pools, blocks and deployments on the Prefect server at PREFECT_API_URL (idempotent)."""
    ws = Workspace.resolve(home)
    if not os.environ.get("PREFECT_API_URL"):
        err.print("set PREFECT_API_URL to your Prefect server (e.g. http://127.0.0.1:4200/api; `make ui` starts one)")
        raise typer.Exit(2)
    from deployments.bootstrap import bootstrap

    try:
        report = bootstrap(ws, code_repos=code_repo, code_ref=code_ref)
    except HybridtrainError as exc:
        fail(exc)
    console.print(f"pools created: {report.pools_created or '-'}; already there: {report.pools_existing or '-'}")
    console.print(f"site blocks: {report.site_blocks}; pseudonym key {'created' if report.key_created else 'present'}")
    console.print(f"deployments: {', '.join(report.deployments)}")
    for pool, url in report.code_repositories.items():
        console.print(f"pool {pool}: workers clone commit {report.code_commit} from {url}", highlight=False)
    if report.code_repositories:
        console.print("start a worker at each site with `hybridtrain worker --pool POOL --home SITE_ROOT`")
    else:
        console.print("start workers with `make worker` (one process worker per pool)")


@app.command()
def worker(
    pool: Annotated[str, typer.Option(help="Work pool to serve: the work_pool of this site in the sites catalog, "
                                           "or control (the burst controller and recovery).")],
    home: HomeOpt = None,
    name: Annotated[str | None, typer.Option(help="Worker name shown in the UI (default: Prefect's).")] = None,
) -> None:
    """Start a process worker of POOL at this site, with this directory (--home) as the site root.

    POOL is a site pool of the sites catalog or ``control``, the pool `hybridtrain deploy` makes for the
    control flows (burst-controller, recover-runs). Flow runs get HYBRIDTRAIN_HOME set to the site root:
    their workspace (sites catalog, jobs, data, the site's stores and state). Deployments made with
    `hybridtrain deploy --code-repo` clone the deployed commit into each run's directory and run the flow
    from there."""
    ws = Workspace.resolve(home)
    if not os.environ.get("PREFECT_API_URL"):
        err.print("set PREFECT_API_URL to the control plane's Prefect server (e.g. http://gateway:4200/api)")
        raise typer.Exit(2)
    try:
        pools = ws.load_sites().pools
    except HybridtrainError as exc:
        fail(exc)
    if pool not in pools and pool != CONTROL_POOL:
        err.print(f"--pool {pool!r} is not a pool of {ws.sites_file} (pools: {', '.join(pools)}) nor "
                  f"{CONTROL_POOL!r} (the control flows' pool)", highlight=False, markup=False)
        raise typer.Exit(2)
    from deployments.bootstrap import check_server  # lazy: heavy (prefect)

    try:  # a worker with no server to poll dies with a traceback; say which URL and what to do instead
        check_server(f"start a worker of pool {pool}", os.environ["PREFECT_API_URL"])
    except HybridtrainError as exc:
        fail(exc)
    if not os.environ.get("HYBRIDTRAIN_MLFLOW_TRACKING_URI"):
        err.print("warning: HYBRIDTRAIN_MLFLOW_TRACKING_URI is not set; runs here track into this site's own "
                  "SQLite store, not the control plane's MLflow server", highlight=False)
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
           *(["--name", name] if name else [])]
    console.print(f"worker of pool {pool} at site root {ws.root}", highlight=False)
    os.chdir(ws.root)
    os.execve(sys.executable, cmd, {**os.environ, "HYBRIDTRAIN_HOME": str(ws.root)})


if __name__ == "__main__":
    main()
