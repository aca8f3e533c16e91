"""GovernanceCommands: ``audit verify``, ``bundle verify``, ``ledger``, ``rollback`` and ``retire``, via ``register(app)``.

- ``audit verify`` checks the workspace's audit log (``.hybridtrain/audit/audit.jsonl``, or
  ``--log``): every edited, removed, reordered or cut-off record is listed; exit 8 if any. The
  head's signature is checked against ``--public-key`` or, for the workspace's log, its audit
  public key (``hybridtrain.governance.audit_key``). A signature that cannot be checked (no
  key to check it with) fails too, exit 8, unless ``--no-signature-check`` says to check the
  chain and head only; and a workspace whose audit key exists but whose log and head are gone
  fails as wiped.
- ``bundle verify PATH`` checks a bundle directory or packed archive against the release public key.
- ``ledger MODEL`` prices the model's run records (MLflow runs tagged
  ``hybridtrain.ledger.model``) per version; ``--png`` writes the chart, ``--attach`` writes
  each version's ``hybridtrain.cost.*`` tags. Every option is checked before anything is written.
- ``rollback MODEL`` moves ``champion`` back to ``previous`` and re-releases it to every
  target; ``retire MODEL VERSION`` removes a version from every target and marks it retired.
  The release targets come from ``--spec`` (its ``promotion.release_targets``) or, without
  it, from the ``hybridtrain.release.target_specs`` tag recorded when the version was
  released; every target verifies bundles with the public key given by ``--public-key``
  (default ``HYBRIDTRAIN_RELEASE_PUBLIC_KEY``, else ``.hybridtrain/keys/release.pub.pem``).
  Bundles are re-released from the archive in the control site's store (``bundles/``).

User mistakes print what to fix and exit non-zero, without a traceback; a refused command
writes nothing (no audit record it did not earn, no key, no tag, no file).
"""

from __future__ import annotations

import getpass
import json
import math
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


def _given_path(text: str, option: str, what: str) -> Path:
    """A path the user typed; an empty one (which would mean the current directory) is refused."""
    if not text.strip():
        raise SpecError(option, [Problem(repr(text), f"empty: give {what}")])
    return Path(text)


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
    log: Annotated[str | None, typer.Option(
        help="Audit log file (default .hybridtrain/audit/audit.jsonl); its head is <log>.head.")] = None,
    public_key: Annotated[str | None, typer.Option(
        "--public-key", help="Require the head anchor to be signed by this PEM public key (default for the "
                             "workspace's log: its audit public key, .hybridtrain/keys/audit-signing.pub.pem)."
    )] = None,
    no_signature_check: Annotated[bool, typer.Option(
        "--no-signature-check", help="Check the hash chain and head only, not the head's signature. Without it, a "
                                     "signature that cannot be checked (no --public-key for --log, or the workspace's "
                                     "audit public key is missing) fails verification (exit 8): a deleted key must "
                                     "not silently turn the check off.")] = False,
    anchor: Annotated[list[str] | None, typer.Option(
        help="A published head, SEQ:SHA256, the log must still contain; repeatable.")] = None,
    home: HomeOpt = None,
) -> None:
    """Verify the audit log's hash chain, head anchor and the head's signature: list every edited, removed, reordered
    or cut-off record. Exit 0 only when all of that verified (or --no-signature-check was given); 8 otherwise."""
    try:
        from hybridtrain.governance import audit_key
        from hybridtrain.governance.audit_log import AuditLog

        ws = Workspace.resolve(home)
        log_path = _given_path(log, "--log", "the audit log file") if log is not None else None
        if log_path is not None and log_path.is_dir():
            raise SpecError("--log", [Problem(str(log_path), "a directory: give the audit log file itself, e.g. "
                                                             ".hybridtrain/audit/audit.jsonl")])
        if public_key is not None and no_signature_check:
            raise SpecError("--no-signature-check", [Problem(
                "--public-key", "give one: --public-key checks the signature, --no-signature-check skips it")])
        audit = AuditLog(log_path) if log_path is not None else AuditLog.in_workspace(ws.root)  # reading makes no key
        # Without --public-key, a workspace log is checked against the workspace's own audit public key.
        key = (_read_key(_given_path(public_key, "--public-key", "the audit public key (PEM)"), "--public-key",
                         "the audit signing key") if public_key is not None
               else audit_key.verify_key(ws.root) if log_path is None else None)
        # The workspace's audit key is made by the first append: once it exists, records were written here.
        written = log_path is None and audit_key.has_key(ws.root)
        anchors = [_parse_anchor(a) for a in anchor or []]
        if not audit.path.exists() and not audit.head_path.exists() and not written:
            raise SpecError("--log", [Problem(str(audit.path), "no audit log here: nothing has been recorded at this "
                                                                "path (check --log or --home)")])
        report = audit.verify(public_key=key, anchors=anchors, require_records=written)
    except HybridtrainError as exc:
        raise fail(exc) from None
    unchecked = None
    if key is None and not no_signature_check:
        unchecked = (f"the head's signature could not be checked: the workspace's audit public key "
                     f"{audit_key.public_key_path(ws.root)} is missing" if log_path is None
                     else "the head's signature was not checked: no --public-key was given")
        unchecked += ("; restore it, or pass --public-key with the audit public key, or --no-signature-check to "
                      "check the chain and head only" if log_path is None
                      else "; pass --public-key with the audit public key, or --no-signature-check to check the "
                           "chain and head only")
    for warning in report.warnings:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    head = f"seq {report.head.seq}:{report.head.hash}" if report.head else "none"
    if report.ok and unchecked is None:
        signature = "signature verified" if key is not None else "signature NOT checked: --no-signature-check"
        console.print(f"audit log {report.log}: {report.records} records verified; head {head} ({signature})",
                      highlight=False, markup=False)
        return
    if not report.ok:
        err_console.print(f"audit log {report.log} does NOT verify ({len(report.problems)} problem(s), "
                          f"{report.records} lines):", style="red", highlight=False, markup=False)
        for p in report.problems:
            err_console.print(f"  - {p}", highlight=False, markup=False)
    if unchecked is not None:  # not evidence of tampering, but not a verified log either
        err_console.print(f"error: audit log {report.log} is not verified: {unchecked}", style="red",
                          highlight=False, markup=False)
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
    png: Annotated[str | None, typer.Option(
        help="Also write the cost-per-version chart here (PNG); it is logged to the model's newest MLflow run too.")] = None,
    storage_price: Annotated[float, typer.Option(
        help="Storage price, USD per GB-month (0 or more), applied to checkpoints, artifacts and bundles.")] = 0.023,
    attach: Annotated[bool, typer.Option(help="Write each version's hybridtrain.cost.* tags in MLflow.")] = False,
    home: HomeOpt = None,
) -> None:
    """What each version of MODEL cost: on-prem, on-demand and spot compute, wasted attempts, transfers, storage.

    Every option is checked before anything is written: a refused command leaves no chart and no tags."""

    try:
        if not math.isfinite(storage_price) or storage_price < 0:
            raise SpecError("--storage-price", [Problem(f"{storage_price:g}", "must be a finite price of 0 or more, "
                                                                              "USD per GB-month (e.g. 0.023)")])
        png_path = _output_file(png, "--png", "the chart file (PNG)") if png is not None else None
        ws = Workspace.resolve(home)
        sites = SitesCatalog.load(ws.sites_file)
        registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
        records = load_run_records(registry, ws.experiment, model)
        if not records:
            raise SpecError("ledger", [Problem(model, f"no run records of this model in {ws.tracking_uri} (experiment "
                                                      f"{ws.experiment}); check the name, or run the lifecycle first")])
        book = CostLedger(sites, storage_price).for_model(records, model)
        if png_path is not None:  # the local file first: if it cannot be written, no tag has been either
            try:
                write_chart(book, png_path)
            except OSError as exc:
                raise SpecError("--png", [Problem(str(png_path), f"cannot be written ({exc.strerror or exc})")]) \
                    from None
        if attach:
            for line in book.lines:
                if line.version != UNVERSIONED:
                    registry.set_version_tags(model, line.version, line.tags())
    except HybridtrainError as exc:
        raise fail(exc) from None
    Console(width=max(console.width, 150)).print(render_table(book))  # eleven columns: never squeeze them
    console.print(f"{book.runs} run(s); storage at ${storage_price:g}/GB-month; totals are the sum of the run records",
                  highlight=False)
    if png_path is not None:
        console.print(f"wrote {png_path}", highlight=False, markup=False)
        # The same picture in MLflow, beside the newest run's learning curves and cost breakdown.
        newest = max(records, key=lambda r: r.finished_at)
        registry.log_bytes(newest.run_id, png_path.read_bytes(), f"plots/ledger-{model}.png")
        console.print(f"logged it to MLflow run {newest.run_id} as plots/ledger-{model}.png", highlight=False,
                      markup=False)
    if attach:
        console.print("attached hybridtrain.cost.* tags to each version", highlight=False)


def _output_file(text: str, option: str, what: str) -> Path:
    """An output file the user named, checked before anything is written: not empty, not a directory, and its
    directory exists or can be made."""
    from hybridtrain.governance.audit_log import path_problem

    path = _given_path(text, option, what)
    if path.is_dir():
        raise SpecError(option, [Problem(str(path), f"a directory: give {what}, e.g. {path / 'ledger.png'}")])
    problem = path_problem(path, directory=False)
    if problem:
        raise SpecError(option, [Problem(str(path), f"cannot be written: {problem}")])
    return path


# -- rollback / retire ---------------------------------------------------------------------------


def _read_key(path: Path, option: str = "--public-key", what: str = "the release signing key"):
    """The PEM public key at ``path``; ``SpecError`` naming ``option`` and the file when it cannot be used."""
    try:
        return VerifyKey.from_pem(Path(path).read_bytes())
    except FileNotFoundError:
        raise SpecError(option, [Problem(str(path), f"no such file: give the PEM public key of {what}")]) from None
    except IsADirectoryError:
        raise SpecError(option, [Problem(str(path), f"a directory: give the PEM public key file of {what}")]) from None
    except OSError as exc:
        raise SpecError(option, [Problem(str(path), f"cannot be read ({exc.strerror or exc})")]) from None
    except ValueError as exc:
        raise SpecError(option, [Problem(str(path), str(exc))]) from None


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

    key = _read_key(public_key or ws.release_public_key, "--public-key" if public_key else
                    "--public-key (default .hybridtrain/keys/release.pub.pem)")
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
                  f"{'v' + outcome.previous if outcome.previous else 'none'}"
                  + (" (finished the rollback an interruption had left half-done)" if outcome.resumed else ""),
                  highlight=False, markup=False)
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
                  f"{', '.join(t.target for t in outcome.release.targets) or 'no targets'}; bundle kept in the archive"
                  + (" (finished the retire an interruption had left half-done)" if outcome.resumed else ""),
                  highlight=False, markup=False)


@bundle_app.command("verify")
def bundle_verify(
    path_text: Annotated[str, typer.Argument(
        metavar="PATH", help="A bundle directory, or a packed bundle (.tar) from the archive.")],
    public_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Check that a model bundle is exactly what the release key signed: every file, the manifest, the signature."""
    import tempfile

    from hybridtrain.governance.bundle import ModelBundle

    try:
        path = _given_path(path_text, "bundle verify", "a bundle directory or a packed bundle (.tar)")
        ws = Workspace.resolve(home)
        key = _read_key(public_key or ws.release_public_key)
        if not path.exists():
            raise SpecError("bundle verify", [Problem(str(path), "no such bundle directory or archive")])
        if not path.is_dir() and not path.is_file():
            raise SpecError("bundle verify", [Problem(str(path), "neither a directory nor a file: give a bundle "
                                                                 "directory or a packed bundle (.tar)")])
        with tempfile.TemporaryDirectory(prefix="hybridtrain-bundle-verify-") as tmp:
            # A packed bundle is unpacked to a temporary copy, but refusals name the user's file.
            bundle = (ModelBundle(path) if path.is_dir()
                      else ModelBundle.unpack(path, Path(tmp) / "bundle", name=str(path)))
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
