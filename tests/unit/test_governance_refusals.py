"""Governance commands refuse user mistakes and unusable paths the way a user sees it: one clear error naming the
option or file and the fix, a non-zero exit, no traceback — and nothing changed or written by a refused command.
Above all, no governance action happens unaudited, and a wiped audit log does not verify."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.governance import build_releaser, register
from hybridtrain.errors import BundleRejected
from hybridtrain.governance import audit_key
from hybridtrain.governance.audit_log import AuditLog, AuditLogUnwritable
from hybridtrain.governance.gates import CHECKPOINT_TAG, GateInputs, dataset_tag, evaluate_gates
from hybridtrain.governance.ledger import RUN_RECORD_ARTIFACT, RUN_RECORD_TAG, AttemptRecord, RunRecord
from hybridtrain.governance.promotion import promote
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.bundles import CHECKPOINT_SHA, DATASETS, make_bundle
from tests.fixtures.workspaces import ROOT, make_workspace

runner = CliRunner()
app = typer.Typer()
register(app)
KEY = SigningKey.generate()
MODEL = "churn-classifier"
SPEC = "jobs/churn-released.yaml"


def flat(text: str) -> str:
    return " ".join(text.split())


def invoke(*args: str):
    """The command in-process; any exception other than the CLI's own exit is a traceback a user would see."""
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output, result.output
    return result


def cli(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it (``hybridtrain ...``), in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    env.pop(audit_key.ENV_KEY_FILE, None)
    result = subprocess.run([sys.executable, "-m", "orchestration.cli", *args], capture_output=True, text=True,
                            timeout=180, env=env)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


@pytest.fixture(autouse=True)
def _workspace_audit_key(monkeypatch):
    monkeypatch.delenv(audit_key.ENV_KEY_FILE, raising=False)


class World:
    """The QA fixture: a workspace with v1..v3 of the model registered, v1 then v2 promoted (v2 champion, v1
    previous) and released to a directory target and an object-store target; v3 registered only."""

    def __init__(self, tmp: Path):
        self.root = make_workspace(tmp / "ws")
        keys = self.root / ".hybridtrain" / "keys"
        keys.mkdir(parents=True)
        (keys / "release.pub.pem").write_bytes(KEY.public.to_pem())
        spec = yaml.safe_load((self.root / "jobs" / "churn.yaml").read_text())
        spec["promotion"] = {"max_cost_usd": 25, "release_targets": [
            {"name": "onprem-serving", "path": "serving"},
            {"name": "cloud-serving", "kind": "object_store", "site": "cloud-eu", "prefix": "serving"}]}
        (self.root / SPEC).write_text(yaml.safe_dump(spec, sort_keys=False))
        self.ws = Workspace.resolve(self.root)
        self.registry = Registry(self.ws.tracking_uri, self.ws.mlflow_artifacts)
        self.tmp = tmp
        self.run_id = self.registry.start_run(self.ws.experiment, "lifecycle", {"hybridtrain.job": "churn"})
        for auc in (0.80, 0.85):
            self.promote(self.register(), auc)
        assert self.register() == "3"
        self.audit_dir = self.root / ".hybridtrain" / "audit"
        self.home = ("--home", str(self.root))

    def register(self) -> str:
        model = self.tmp / f"model-{len(self.registry.versions(MODEL)) + 1}"
        model.mkdir()
        tags = {**{dataset_tag(t): m for t, m in DATASETS.items()}, CHECKPOINT_TAG: CHECKPOINT_SHA}
        return self.registry.register(model.as_uri(), MODEL, self.run_id, tags).version

    def promote(self, version: str, auc: float) -> None:
        spec = load_spec(self.root / SPEC)
        releaser = build_releaser(self.ws, spec.promotion.release_targets, None)
        champion = self.registry.by_alias(MODEL, CHAMPION)
        bundle = make_bundle(self.tmp / f"bundle-{version}", KEY, model=MODEL, version=version)
        inputs = GateInputs.for_spec(
            spec, version, version_tags=self.registry.version(MODEL, version).tags, datasets=dict(DATASETS),
            checkpoint_sha256=CHECKPOINT_SHA, bundle=bundle, trusted_key=KEY.public,
            metrics={"auc": auc, "accuracy": 0.8}, cost_usd=3.0,
            champion_version=champion.version if champion else None,
            champion_metrics={"auc": auc - 0.05} if champion else None,
            rollback_versions=releaser.available_versions(MODEL))
        promote(self.registry, releaser, audit_key.workspace_log(self.root), bundle=bundle,
                report=evaluate_gates(inputs), trusted_key=KEY.public, actor="test")

    def alias(self, name: str) -> str | None:
        info = self.registry.by_alias(MODEL, name)
        return info.version if info else None

    def current(self) -> list[str]:
        onprem = self.root / "serving" / "current" / f"{MODEL}.json"
        cloud = self.root / ".hybridtrain" / "stores" / "cloud-eu" / "serving" / "current" / f"{MODEL}.json"
        return [yaml.safe_load(p.read_text())["version"] for p in (onprem, cloud)]

    def records(self) -> list[str]:
        return [r.action for r in AuditLog.in_workspace(self.root).records()]

    def keys(self) -> list[str]:
        return sorted(p.name for p in (self.root / ".hybridtrain" / "keys").iterdir())


@pytest.fixture
def world(tmp_path) -> World:
    return World(tmp_path)


# -- 1. no governance action without its audit record -------------------------------------------


def test_rollback_and_retire_are_refused_before_acting_when_the_audit_log_cannot_be_written(world):
    assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.current()) == ("2", "1", ["2", "2"])
    before = world.records()
    aside = world.audit_dir.with_name("audit-moved")
    world.audit_dir.rename(aside)
    world.audit_dir.write_text("not a directory\n")  # .hybridtrain/audit is now a regular file

    back = cli("rollback", MODEL, "--spec", SPEC, *world.home)
    assert back.returncode == 9, back.stderr
    error = flat(back.stderr)
    assert str(world.audit_dir / "audit.jsonl") in error and "nothing was changed" in error
    assert "is not a directory" in error and "move it aside" in error
    assert len(back.stderr.strip().splitlines()) == 1  # one line
    assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.current()) == ("2", "1", ["2", "2"])

    gone = invoke("retire", MODEL, "3", "--spec", SPEC, *world.home)
    assert gone.exit_code == 9 and "could not be audited" in flat(gone.output)
    assert world.registry.version(MODEL, "3").tags.get("hybridtrain.status") is None

    world.audit_dir.unlink()
    aside.rename(world.audit_dir)
    assert world.records() == before  # nothing was appended by the refused commands either
    back = invoke("rollback", MODEL, "--spec", SPEC, *world.home)
    assert back.exit_code == 0, back.output
    assert world.records()[-1] == "rollback" and world.current() == ["1", "1"]


def test_a_log_that_does_not_match_its_head_refuses_the_rollback_before_it_acts(world):
    log = world.audit_dir / "audit.jsonl"
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:-1]))  # cut the last record off
    back = invoke("rollback", MODEL, "--spec", SPEC, *world.home)
    assert back.exit_code == 8 and "cut off the end" in flat(back.output)
    assert (world.alias(CHAMPION), world.current()) == ("2", ["2", "2"])


def test_the_audit_preflight_reads_only_and_names_what_blocks_the_append(tmp_path):
    root = tmp_path / "ws"
    log = audit_key.workspace_log(root)
    log.check_appendable()
    assert not root.exists()  # no directory, no key: a writer that appends nothing makes nothing
    (root / ".hybridtrain").mkdir(parents=True)
    (root / ".hybridtrain" / "audit").write_text("a file where the log's directory belongs\n")
    for attempt in (log.check_appendable,
                    lambda: log.append(actor="t", action="gate", subject="model m v1", outcome="passed")):
        with pytest.raises(AuditLogUnwritable) as exc:
            attempt()
        assert str(root / ".hybridtrain" / "audit") in str(exc.value) and "\n" not in str(exc.value)
    assert not (root / ".hybridtrain" / "keys").exists()


# -- 2. a wiped log, or a missing public key, does not verify --------------------------------------


@pytest.fixture
def signed(tmp_path) -> Path:
    """A workspace whose audit log has three records, its head signed by the workspace's audit key."""
    root = tmp_path / "ws"
    log = audit_key.workspace_log(root)
    for i in range(3):
        log.append(actor="test", action="gate", subject=f"model m v{i}", outcome="passed")
    return root


def test_a_wiped_log_does_not_verify(signed):
    assert cli("audit", "verify", "--home", str(signed)).returncode == 0
    log = signed / ".hybridtrain" / "audit" / "audit.jsonl"
    log.write_bytes(b"")
    log.with_name("audit.jsonl.head").unlink()
    result = cli("audit", "verify", "--home", str(signed))
    assert result.returncode == 8, result.stdout
    assert "signature verified" not in result.stdout
    assert "the log is empty and its head anchor audit.jsonl.head is missing" in result.stderr
    assert "wiped" in result.stderr
    log.unlink()  # deleted outright: the same
    assert "the log is missing" in cli("audit", "verify", "--home", str(signed)).stderr
    # ...and even when the signature check is skipped, the workspace's audit key says records were written
    skipped = invoke("audit", "verify", "--home", str(signed), "--no-signature-check")
    assert skipped.exit_code == 8 and "wiped" in flat(skipped.output)


def test_verifying_against_a_public_key_requires_a_head_to_check(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", signing_key=KEY)
    log.path.write_bytes(b"")
    report = log.verify(public_key=KEY.public)
    assert not report.ok and "wiped" in str(report.problems[0])


def test_a_missing_audit_public_key_fails_verification_unless_the_check_is_skipped_on_purpose(signed):
    audit_key.public_key_path(signed).unlink()
    result = cli("audit", "verify", "--home", str(signed))
    assert result.returncode == 8, result.stdout
    assert "signature verified" not in result.stdout
    error = flat(result.stderr)
    assert "could not be checked" in error and str(audit_key.public_key_path(signed)) in error
    assert "--no-signature-check" in error
    skipped = invoke("audit", "verify", "--home", str(signed), "--no-signature-check")
    assert skipped.exit_code == 0, skipped.output
    assert "3 records verified" in flat(skipped.output) and "signature NOT checked" in flat(skipped.output)
    assert "--no-signature-check" in flat(invoke("audit", "verify", "--help").output)


def test_a_log_given_with_log_and_no_key_is_not_reported_as_signature_checked(signed, tmp_path):
    log = str(signed / ".hybridtrain" / "audit" / "audit.jsonl")
    unchecked = invoke("audit", "verify", "--log", log)
    assert unchecked.exit_code == 8 and "no --public-key was given" in flat(unchecked.output)
    both = invoke("audit", "verify", "--log", log, "--public-key", str(audit_key.public_key_path(signed)),
                  "--no-signature-check")
    assert both.exit_code == 2 and "give one" in flat(both.output)


# -- 3. unusable paths: an error, not a traceback --------------------------------------------------


def test_a_directory_given_as_a_public_key_is_an_error(world, tmp_path):
    for args in (("bundle", "verify", str(tmp_path)), ("rollback", MODEL, "--spec", SPEC),
                 ("retire", MODEL, "3", "--spec", SPEC), ("audit", "verify")):
        result = invoke(*args, "--public-key", str(tmp_path), *world.home)
        assert result.exit_code == 2, (args, result.output)
        assert "--public-key" in flat(result.output) and "a directory" in flat(result.output)
    assert (world.alias(CHAMPION), world.current()) == ("2", ["2", "2"])


def test_a_damaged_bundle_archive_is_refused_naming_the_users_file(tmp_path):
    pub = tmp_path / "release.pub.pem"
    pub.write_bytes(KEY.public.to_pem())
    packed = make_bundle(tmp_path / "b", KEY).pack(tmp_path / "whole.tar").read_bytes()
    for name, data in (("trunc.tar", packed[:len(packed) // 3]), ("notes.txt", b"not a tar at all\n" * 40)):
        (tmp_path / name).write_bytes(data)
        result = invoke("bundle", "verify", str(tmp_path / name), "--public-key", str(pub))
        assert result.exit_code == BundleRejected.exit_code, result.output
        out = flat(result.output)
        assert f"model bundle {tmp_path / name} was refused" in out
        assert "hybridtrain-bundle-verify" not in out and "ReadError" not in out and "method gz" not in out
        assert "packed bundle (.tar)" in out and "sign it again" not in out


def test_a_bundle_whose_signature_is_a_directory_is_refused(tmp_path):
    bundle = make_bundle(tmp_path / "b", KEY)
    (bundle.root / "signature.json").unlink()
    (bundle.root / "signature.json").mkdir()
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert "signature.json: a directory where a file belongs" in str(exc.value)


def test_an_audit_log_or_head_that_is_a_directory_is_an_error(signed, tmp_path):
    given = invoke("audit", "verify", "--log", str(tmp_path))
    assert given.exit_code == 2 and "--log" in flat(given.output) and "a directory" in flat(given.output)
    head = signed / ".hybridtrain" / "audit" / "audit.jsonl.head"
    head.unlink()
    head.mkdir()
    result = invoke("audit", "verify", "--home", str(signed))
    assert result.exit_code == 8 and "cannot be read as the head anchor" in flat(result.output)


def test_retire_with_a_release_target_path_that_is_a_file_is_an_error(world):
    serving = world.root / "serving"
    serving.rename(world.root / "serving-moved")
    serving.write_text("not a directory\n")
    result = invoke("retire", MODEL, "1", "--spec", SPEC, *world.home)
    assert result.exit_code == 9, result.output
    out = flat(result.output)
    assert "retiring v1 stopped" in out and str(serving) in out and "release_targets" in out
    assert world.registry.version(MODEL, "1").tags.get("hybridtrain.status") is None
    assert world.records()[-1] == "retire"  # the attempt is on the record


# -- 4. messages that fit the cause ----------------------------------------------------------------


def test_a_bundle_signed_by_another_key_points_at_public_key_not_at_a_rebuild(tmp_path):
    other = SigningKey.generate()
    bundle = make_bundle(tmp_path / "b", other)
    pub = tmp_path / "release.pub.pem"
    pub.write_bytes(KEY.public.to_pem())
    result = invoke("bundle", "verify", str(bundle.root), "--public-key", str(pub))
    assert result.exit_code == BundleRejected.exit_code
    out = flat(result.output)
    assert f"intact but signed by key {other.key_id}" in out and "--public-key" in out
    assert "not promoted or released" not in out


def test_a_refused_promotion_names_the_model_version_not_the_temporary_build_directory(world):
    spec = load_spec(world.root / SPEC)
    releaser = build_releaser(world.ws, spec.promotion.release_targets, None)
    with tempfile.TemporaryDirectory(prefix="hybridtrain-bundle-") as tmp:  # where the flow builds its bundle
        bundle = make_bundle(Path(tmp) / "bundle", KEY, model=MODEL, version="3")
        inputs = GateInputs.for_spec(
            spec, "3", version_tags=world.registry.version(MODEL, "3").tags, datasets=dict(DATASETS),
            checkpoint_sha256=CHECKPOINT_SHA, bundle=bundle, trusted_key=KEY.public,
            metrics={"auc": 0.9, "accuracy": 0.8}, cost_usd=3.0, champion_version="2",
            champion_metrics={"auc": 0.85}, rollback_versions=releaser.available_versions(MODEL))
        report = evaluate_gates(inputs)
        (bundle.root / "weights" / "model.pt").write_bytes(b"swapped after the gates")
        with pytest.raises(BundleRejected) as exc:
            promote(world.registry, releaser, audit_key.workspace_log(world.root), bundle=bundle, report=report,
                    trusted_key=KEY.public, actor="test")
    message = str(exc.value)
    assert f"model bundle {MODEL} v3 (built for this promotion) was refused" in message and tmp not in message
    assert "v3 was not promoted or released" in message
    last = list(AuditLog.in_workspace(world.root).records())[-1]
    assert last.action == "release" and tmp not in last.line().decode()
    assert world.alias(CHAMPION) == "2"


def test_bundle_verify_refuses_an_empty_path(tmp_path):
    result = invoke("bundle", "verify", "", "--home", str(tmp_path))
    assert result.exit_code == 2 and "empty" in flat(result.output)


def test_audit_verify_asks_for_the_audit_key_not_the_release_key(signed, tmp_path):
    result = invoke("audit", "verify", "--home", str(signed), "--public-key", str(tmp_path / "missing.pem"))
    assert result.exit_code == 2 and "the audit signing key" in flat(result.output)
    assert "release signing key" not in flat(result.output)


# -- 5. ledger: prices checked, outputs checked, before anything is written ------------------------


def add_run_record(world: World) -> None:
    run_id = world.registry.start_run(world.ws.experiment, "ledger", {RUN_RECORD_TAG: MODEL})
    record = RunRecord(model=MODEL, version="2", run_id=run_id, finished_at=datetime(2026, 5, 1, tzinfo=UTC),
                       attempts=[AttemptRecord(site="cloud-eu", capacity_class="burst", gpus=1, seconds=3600,
                                               outcome="succeeded")])
    world.registry.log_text(run_id, record.model_dump_json(), RUN_RECORD_ARTIFACT)


@pytest.mark.parametrize("price", ["-1", "nan", "inf"])
def test_ledger_refuses_a_negative_or_non_finite_storage_price_before_attaching(world, price):
    add_run_record(world)
    result = invoke("ledger", MODEL, "--storage-price", price, "--attach", *world.home)
    assert result.exit_code == 2 and "--storage-price" in flat(result.output), result.output
    assert "hybridtrain.cost.total_usd" not in world.registry.version(MODEL, "2").tags


def test_ledger_checks_the_chart_path_before_printing_or_attaching(world, tmp_path):
    add_run_record(world)
    result = invoke("ledger", MODEL, "--png", str(tmp_path), "--attach", *world.home)
    assert result.exit_code == 2 and "--png" in flat(result.output) and "a directory" in flat(result.output)
    assert "Cost ledger" not in result.output
    assert "hybridtrain.cost.total_usd" not in world.registry.version(MODEL, "2").tags
    ok = invoke("ledger", MODEL, "--png", str(tmp_path / "cost.png"), "--attach", *world.home)
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "cost.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# -- 6. a refused action creates no keys -----------------------------------------------------------


def test_refused_rollback_and_retire_create_no_audit_key(world):
    keys = world.root / ".hybridtrain" / "keys"
    for name in ("audit-signing.pem", "audit-signing.pub.pem"):
        (keys / name).unlink()
    champion = invoke("retire", MODEL, "2", "--spec", SPEC, *world.home)
    assert champion.exit_code == 9 and "v2 is the champion" in flat(champion.output)
    world.registry.delete_alias(MODEL, PREVIOUS)
    nothing = invoke("rollback", MODEL, "--spec", SPEC, *world.home)
    assert nothing.exit_code == 9 and "no previous version" in flat(nothing.output)
    assert world.keys() == ["release.pub.pem"]
