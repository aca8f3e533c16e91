"""GovernanceCommands: ``audit verify``, ``bundle verify``, ``ledger``, ``rollback`` and ``retire``, via ``register(app)``.

- ``audit verify`` checks the workspace's audit log (``.hybridtrain/audit/audit.jsonl``, or
  ``--log``): every edited, removed, reordered or cut-off record is listed; exit 8 if any. The
  head's signature is checked against ``--public-key`` or, for the workspace's log, its audit
  public key (``hybridtrain.governance.audit_key``).
- ``bundle verify PATH`` checks a bundle directory or packed archive against the release public key.
- ``ledger MODEL`` prices the model's run records (MLflow runs tagged
  ``hybridtrain.ledger.model``) per version; ``--png`` writes the chart, ``--attach`` writes
  each version's ``hybridtrain.cost.*`` tags.
- ``rollback MODEL`` moves ``champion`` back to ``previous`` and re-releases it to every
  target; ``retire MODEL VERSION`` removes a version from every target and marks it retired.
  The release targets come from ``--spec`` (its ``promotion.release_targets``) or, without
  it, from the ``hybridtrain.release.target_specs`` tag recorded when the version was
  released; every target verifies bundles with the public key given by ``--public-key``
  (default ``HYBRIDTRAIN_RELEASE_PUBLIC_KEY``, else ``.hybridtrain/keys/release.pub.pem``).
  Bundles are re-released from the archive in the control site's store (``bundles/``).

User mistakes print what to fix and exit non-zero, without a traceback.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console

from hybridtrain.errors import HybridtrainError, Problem, ReleaseRefused, SpecError
from hybridtrain.governance.audit_log import AuditHead
from hybridtrain.governance.ledger import (
    RUN_RECORD_ARTIFACT,
    RUN_RECORD_TAG,
    UNVERSIONED,
    CostLedger,
    RunRecord,
    render_table,
    write_chart,
)
from hybridtrain.governance.promotion import retire, rollback
from hybridtrain.governance.release import BundleArchive, Releaser, open_targets
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.storage import open_store
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.workspace import Workspace

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log
audit_app = typer.Typer(help="The audit log: verify its hash chain and head anchor.", no_args_is_help=True)
bundle_app = typer.Typer(help="Signed model bundles: verify one.", no_args_is_help=True)

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")]
KeyOpt = Annotated[Path | None, typer.Option(
    "--public-key", envvar="HYBRIDTRAIN_RELEASE_PUBLIC_KEY",
    help="PEM public key release targets trust (default .hybridtrain/keys/release.pub.pem).")]
SpecOpt = Annotated[Path | None, typer.Option(
    "--spec", help="Job spec whose promotion.release_targets to use (default: as recorded on the version).")]
ActorOpt = Annotated[str | None, typer.Option(help="Who is acting, for the audit log (default cli:<user>).")]
TARGET_SPECS_TAG = "hybridtrain.release.target_specs"


def fail(exc: HybridtrainError) -> typer.Exit:
    """Print a user error without a traceback; the exit status says which kind it was."""
    err_console.print("error:", str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def _actor(actor: str | None) -> str:
    return actor or f"cli:{getpass.getuser()}"


def _audit_log(ws: Workspace, log: Path | None):
    from hybridtrain.governance.audit_key import workspace_log
    from hybridtrain.governance.audit_log import AuditLog

    return AuditLog(log) if log is not None else workspace_log(ws.root)


# -- audit verify -------------------------------------------------------------------------------


def _parse_anchor(text: str):

    try:
        seq, digest = text.split(":", 1)
        return AuditHead(seq=int(seq), hash=digest.strip().lower())
    except ValueError:
        raise SpecError("--anchor", [Problem(text, "expected SEQ:SHA256 (64 hex digits), as printed by "
                                                   "`hybridtrain audit verify`")]) from None


@audit_app.command("verify")
def audit_verify(
    log: Annotated[Path | None, typer.Option(help="Audit log file (default .hybridtrain/audit/audit.jsonl).")] = None,
    public_key: Annotated[Path | None, typer.Option(
        "--public-key", help="Require the head anchor to be signed by this PEM public key.")] = None,
    anchor: Annotated[list[str] | None, typer.Option(
        help="A published head, SEQ:SHA256, the log must still contain; repeatable.")] = None,
    home: HomeOpt = None,
) -> None:
    """Verify the audit log's hash chain and head: list every edited, removed, reordered or cut-off record."""
    try:
        from hybridtrain.governance import audit_key
        from hybridtrain.governance.audit_log import AuditLog

        ws = Workspace.resolve(home)
        audit = AuditLog(log) if log is not None else AuditLog.in_workspace(ws.root)  # reading makes no key
        # Without --public-key, a workspace log is checked against the workspace's own audit public key.
        key = (_read_key(public_key) if public_key is not None
               else audit_key.verify_key(ws.root) if log is None else None)
        anchors = [_parse_anchor(a) for a in anchor or []]
        if not audit.path.exists() and not audit.head_path.exists():
            raise SpecError("--log", [Problem(str(audit.path), "no audit log here: nothing has been recorded at this "
                                                                "path (check --log or --home)")])
        report = audit.verify(public_key=key, anchors=anchors)
    except HybridtrainError as exc:
        raise fail(exc) from None
    for warning in report.warnings:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    head = f"seq {report.head.seq}:{report.head.hash}" if report.head else "none"
    if report.ok:
        console.print(f"audit log {report.log}: {report.records} records verified; head {head}"
                      + (" (signature verified)" if key else ""), highlight=False, markup=False)
        return
    err_console.print(f"audit log {report.log} does NOT verify ({len(report.problems)} problem(s), "
                      f"{report.records} lines):", style="red", highlight=False, markup=False)
    for p in report.problems:
        err_console.print(f"  - {p}", highlight=False, markup=False)
    raise typer.Exit(8)


# -- ledger -------------------------------------------------------------------------------------


def load_run_records(registry, experiment: str, model: str) -> list:
    """The model's run records stored in MLflow (artifact ``ledger/run_record.json`` of runs tagged
    ``hybridtrain.ledger.model = MODEL``)."""


    records = []
    for run_id in registry.tagged_run_ids(experiment, RUN_RECORD_TAG, model):
        text = registry.read_text(run_id, RUN_RECORD_ARTIFACT)
        try:
            records.append(RunRecord.model_validate_json(text))
        except ValidationError as exc:
            raise SpecError(f"run {run_id} {RUN_RECORD_ARTIFACT}", [
                Problem(".".join(str(x) for x in e["loc"]), e["msg"]) for e in exc.errors()]) from None
    return records


def ledger(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    png: Annotated[Path | None, typer.Option(
        help="Also write the cost-per-version chart here (PNG); it is logged to the model's newest MLflow run too.")] = None,
    storage_price: Annotated[float, typer.Option(
        help="Storage price, USD per GB-month, applied to checkpoints, artifacts and bundles.")] = 0.023,
    attach: Annotated[bool, typer.Option(help="Write each version's hybridtrain.cost.* tags in MLflow.")] = False,
    home: HomeOpt = None,
) -> None:
    """What each version of MODEL cost: on-prem, on-demand and spot compute, wasted attempts, transfers, storage."""

    try:
        ws = Workspace.resolve(home)
        sites = SitesCatalog.load(ws.sites_file)
        registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
        records = load_run_records(registry, ws.experiment, model)
        if not records:
            raise SpecError("ledger", [Problem(model, f"no run records of this model in {ws.tracking_uri} (experiment "
                                                      f"{ws.experiment}); check the name, or run the lifecycle first")])
        book = CostLedger(sites, storage_price).for_model(records, model)
        if attach:
            for line in book.lines:
                if line.version != UNVERSIONED:
                    registry.set_version_tags(model, line.version, line.tags())
    except HybridtrainError as exc:
        raise fail(exc) from None
    Console(width=max(console.width, 150)).print(render_table(book))  # eleven columns: never squeeze them
    console.print(f"{book.runs} run(s); storage at ${storage_price:g}/GB-month; totals are the sum of the run records",
                  highlight=False)
    if png is not None:
        console.print(f"wrote {write_chart(book, png)}", highlight=False, markup=False)
        # The same picture in MLflow, beside the newest run's learning curves and cost breakdown.
        newest = max(records, key=lambda r: r.finished_at)
        registry.log_bytes(newest.run_id, Path(png).read_bytes(), f"plots/ledger-{model}.png")
        console.print(f"logged it to MLflow run {newest.run_id} as plots/ledger-{model}.png", highlight=False,
                      markup=False)
    if attach:
        console.print("attached hybridtrain.cost.* tags to each version", highlight=False)


# -- rollback / retire ---------------------------------------------------------------------------


def _read_key(path: Path):

    try:
        return VerifyKey.from_pem(Path(path).read_bytes())
    except FileNotFoundError:
        raise SpecError("--public-key", [Problem(str(path), "no such file: give the PEM public key of the release "
                                                            "signing key")]) from None
    except ValueError as exc:
        raise SpecError("--public-key", [Problem(str(path), str(exc))]) from None


def _target_specs(ws: Workspace, spec: Path | None, tags: dict[str, str], model: str):

    from hybridtrain.specs.job import ReleaseTargetSpec
    from hybridtrain.validation import load_job

    if spec is not None:
        return load_job(spec if spec.is_absolute() else ws.root / spec).promotion.release_targets
    raw = tags.get(TARGET_SPECS_TAG)
    if raw is None:
        raise SpecError("release targets", [Problem(model, "no release targets are recorded on this model version; "
                                                           "pass --spec with the job spec that lists them")])
    try:
        return TypeAdapter(list[ReleaseTargetSpec]).validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise SpecError("release targets", [Problem(TARGET_SPECS_TAG, f"unreadable ({exc}); pass --spec")]) from None


def build_releaser(ws: Workspace, target_specs, public_key: Path | None):
    """The Releaser for a workspace: targets opened from their specs, the bundle archive in the control site's
    store (``HYBRIDTRAIN_CONTROL_SITE`` or the first on-prem site)."""

    key = _read_key(public_key or ws.state_dir / "keys" / "release.pub.pem")
    sites = SitesCatalog.load(ws.sites_file)
    control = (sites.get(ws.control_site) if ws.control_site
               else next((s for s in sites.sites if s.kind.value == "onprem"), sites.sites[0]))
    archive = BundleArchive(open_store(control.store, ws.root, "bundles", site=control.name))
    return Releaser(open_targets(target_specs, root=ws.root, sites=sites, trusted_key=key), archive)


def rollback_command(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    spec: SpecOpt = None,
    public_key: KeyOpt = None,
    actor: ActorOpt = None,
    home: HomeOpt = None,
) -> None:
    """Move MODEL's champion back to its previous version and re-release that version to every target."""

    try:
        ws = Workspace.resolve(home)
        registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
        champion = registry.by_alias(model, CHAMPION)
        if champion is None:
            raise ReleaseRefused(model, "has no champion, so there is nothing to roll back (check the name)")
        releaser = build_releaser(ws, _target_specs(ws, spec, champion.tags, model), public_key)
        outcome = rollback(registry, releaser, _audit_log(ws, None), model, actor=_actor(actor))
    except HybridtrainError as exc:
        raise fail(exc) from None
    console.print(f"{model}: champion v{outcome.from_version} -> v{outcome.to_version}; previous -> "
                  f"{'v' + outcome.previous if outcome.previous else 'none'}", highlight=False, markup=False)
    for t in outcome.release.targets:
        console.print(f"  {t.target} ({t.kind}, {t.url}): current v{t.current}; holds "
                      f"{', '.join('v' + v for v in t.versions)}", highlight=False, markup=False)


def retire_command(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="Version to retire (not the champion).")],
    spec: SpecOpt = None,
    public_key: KeyOpt = None,
    actor: ActorOpt = None,
    home: HomeOpt = None,
) -> None:
    """Remove VERSION of MODEL from every release target and mark it retired; its bundle stays archived."""
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)


    try:
        ws = Workspace.resolve(home)
        registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
        try:
            info = registry.version(model, version)
        except MlflowException:
            known = [v.version for v in registry.versions(model)]
            raise ReleaseRefused(model, f"has no version {version}; versions: {', '.join(known) or 'none'}") from None
        releaser = build_releaser(ws, _target_specs(ws, spec, info.tags, model), public_key)
        outcome = retire(registry, releaser, _audit_log(ws, None), model, version, actor=_actor(actor))
    except HybridtrainError as exc:
        raise fail(exc) from None
    console.print(f"{model} v{outcome.version} retired: removed from "
                  f"{', '.join(t.target for t in outcome.release.targets) or 'no targets'}; bundle kept in the archive",
                  highlight=False, markup=False)


@bundle_app.command("verify")
def bundle_verify(
    path: Annotated[Path, typer.Argument(help="A bundle directory, or a packed bundle (.tar) from the archive.")],
    public_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Check that a model bundle is exactly what the release key signed: every file, the manifest, the signature."""
    import tempfile

    from hybridtrain.governance.bundle import ModelBundle

    try:
        ws = Workspace.resolve(home)
        key = _read_key(public_key or ws.release_public_key)
        if not path.exists():
            raise SpecError("bundle verify", [Problem(str(path), "no such bundle directory or archive")])
        with tempfile.TemporaryDirectory(prefix="hybridtrain-bundle-verify-") as tmp:
            bundle = (ModelBundle(path) if path.is_dir()
                      else ModelBundle.unpack(path, Path(tmp) / "bundle"))
            bundle.verify(key)
            what = f"{bundle.model} v{bundle.version}, manifest {bundle.manifest_sha256[:16]}…"
    except HybridtrainError as exc:
        raise fail(exc) from None
    console.print(f"bundle {path}: verified ({what}); signed by {key.key_id}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add ``audit verify``, ``bundle verify``, ``ledger``, ``rollback`` and ``retire`` to the main CLI."""
    app.add_typer(audit_app, name="audit")
    app.add_typer(bundle_app, name="bundle")
    app.command("ledger")(ledger)
    app.command("rollback")(rollback_command)
    app.command("retire")(retire_command)
