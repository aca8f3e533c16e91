"""``audit verify``, ``ledger``, ``rollback`` and ``retire`` from the command line, on a real workspace and MLflow store;
user mistakes exit non-zero without a traceback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.governance import build_releaser, register
from hybridtrain.errors import SpecError
from hybridtrain.governance.audit_key import workspace_log
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.gates import CHECKPOINT_TAG, GateInputs, dataset_tag, evaluate_gates
from hybridtrain.governance.ledger import RUN_RECORD_ARTIFACT, RUN_RECORD_TAG, AttemptRecord, RunRecord
from hybridtrain.governance.promotion import promote
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.bundles import CHECKPOINT_SHA, DATASETS, make_bundle
from tests.fixtures.workspaces import make_workspace

runner = CliRunner()
app = typer.Typer()
register(app)
KEY = SigningKey.generate()
MODEL = "churn-classifier"


def flat(text: str) -> str:
    return " ".join(text.split())


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    root = make_workspace(tmp_path_factory.mktemp("cli") / "ws")
    keys = root / ".hybridtrain" / "keys"
    keys.mkdir(parents=True)
    (keys / "release.pub.pem").write_bytes(KEY.public.to_pem())
    spec = yaml.safe_load((root / "jobs" / "churn.yaml").read_text())
    spec["promotion"] = {"max_cost_usd": 25, "release_targets": [
        {"name": "onprem-serving", "path": "serving"},
        {"name": "cloud-serving", "kind": "object_store", "site": "cloud-eu", "prefix": "serving"}]}
    (root / "jobs" / "churn-released.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return Workspace.resolve(root)


@pytest.fixture(scope="module")
def registry(ws) -> Registry:
    return Registry(ws.tracking_uri, ws.mlflow_artifacts)


def test_audit_verify_passes_then_names_an_edited_record(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", signing_key=KEY)
    for i in range(4):
        log.append(actor="t", action="sync", subject=f"dataset {i}", outcome="ok")
    (tmp_path / "pub.pem").write_bytes(KEY.public.to_pem())
    head = log.head()
    ok = invoke("audit", "verify", "--log", str(log.path), "--public-key", str(tmp_path / "pub.pem"),
                "--anchor", f"{head.seq}:{head.hash}")
    assert ok.exit_code == 0, ok.output
    assert f"4 records verified; head seq 4:{head.hash} (signature verified)" in flat(ok.output)
    rows = log.path.read_text().splitlines(keepends=True)
    rows[1] = rows[1].replace('"outcome":"ok"', '"outcome":"no"')
    log.path.write_text("".join(rows))
    bad = invoke("audit", "verify", "--log", str(log.path))
    assert bad.exit_code == 8, bad.output
    assert "does NOT verify (1 problem(s), 4 lines)" in flat(bad.output)
    assert "seq 2 (line 2): edited" in flat(bad.output)


def test_audit_verify_mistakes_exit_non_zero(tmp_path):
    missing = invoke("audit", "verify", "--log", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2 and "no audit log here" in flat(missing.output)
    log = AuditLog(tmp_path / "a.jsonl")
    log.append(actor="t", action="gate", subject="m", outcome="passed")
    anchor = invoke("audit", "verify", "--log", str(log.path), "--anchor", "five:abc")
    assert anchor.exit_code == 2 and "expected SEQ:SHA256" in flat(anchor.output)
    key = invoke("audit", "verify", "--log", str(log.path), "--public-key", str(tmp_path / "none.pem"))
    assert key.exit_code == 2 and "no such file: give the PEM public key" in flat(key.output)


def test_ledger_prints_each_version_writes_the_chart_and_attaches_tags(ws, registry, tmp_path):
    run_ids = []
    t0 = datetime(2026, 5, 1, tzinfo=UTC)
    for v, seconds in (("1", 3600), ("2", 1800)):
        run_id = registry.start_run(ws.experiment, f"ledger-{v}", {RUN_RECORD_TAG: "ledger-model"})
        (tmp_path / "m").mkdir(exist_ok=True)
        registry.register((tmp_path / "m").as_uri(), "ledger-model", run_id, {})
        record = RunRecord(model="ledger-model", version=v, run_id=run_id, finished_at=t0 + timedelta(days=int(v)),
                           attempts=[AttemptRecord(site="cloud-eu", capacity_class="burst", gpus=1, seconds=seconds,
                                                   outcome="succeeded")])
        registry.log_text(run_id, record.model_dump_json(), RUN_RECORD_ARTIFACT)
        run_ids.append(run_id)
    result = invoke("ledger", "ledger-model", "--png", str(tmp_path / "cost.png"), "--attach", "--home", str(ws.root))
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "Cost ledger of ledger-model (USD)" in out and "2 run(s)" in out
    assert "6.1449" in out  # total: 1.5 GPU-hours on demand at $4.0966
    assert (tmp_path / "cost.png").read_bytes()[:4] == b"\x89PNG"
    assert registry.version("ledger-model", "2").tags["hybridtrain.cost.on_demand_usd"] == "2.048300"
    unknown = invoke("ledger", "nobody", "--home", str(ws.root))
    assert unknown.exit_code == 2 and "no run records of this model" in flat(unknown.output)


def promote_version(ws: Workspace, registry: Registry, tmp: Path, auc: float) -> str:
    spec = load_spec(ws.root / "jobs" / "churn-released.yaml")
    releaser = build_releaser(ws, spec.promotion.release_targets, None)
    run_id = registry.start_run(ws.experiment, "lifecycle", {"hybridtrain.job": "churn"})
    (tmp / "model").mkdir(exist_ok=True)
    tags = {**{dataset_tag(t): m for t, m in DATASETS.items()}, CHECKPOINT_TAG: CHECKPOINT_SHA}
    info = registry.register((tmp / "model").as_uri(), MODEL, run_id, tags)
    champion = registry.by_alias(MODEL, CHAMPION)
    bundle = make_bundle(tmp / f"bundle-{info.version}", KEY, model=MODEL, version=info.version)
    inputs = GateInputs.for_spec(
        spec, info.version, version_tags=info.tags, datasets=dict(DATASETS), checkpoint_sha256=CHECKPOINT_SHA,
        bundle=bundle, trusted_key=KEY.public, metrics={"auc": auc, "accuracy": 0.8}, cost_usd=3.0,
        champion_version=champion.version if champion else None,
        champion_metrics={"auc": auc - 0.05} if champion else None,
        rollback_versions=releaser.available_versions(MODEL))
    promote(registry, releaser, workspace_log(ws.root), bundle=bundle, report=evaluate_gates(inputs),
            trusted_key=KEY.public, actor="test")
    return info.version


def test_rollback_and_retire_from_the_command_line(ws, registry, tmp_path):
    home = ("--home", str(ws.root))
    assert [promote_version(ws, registry, tmp_path, auc) for auc in (0.80, 0.85)] == ["1", "2"]
    serving = ws.root / "serving" / "current" / f"{MODEL}.json"
    assert '"version":"2"' in serving.read_text()

    back = invoke("rollback", MODEL, *home, "--actor", "ana")
    assert back.exit_code == 0, back.output
    assert f"{MODEL}: champion v2 -> v1; previous -> none" in flat(back.output)
    assert "onprem-serving (directory" in back.output and "cloud-serving (object_store" in back.output
    assert '"version":"1"' in serving.read_text()
    cloud = ws.root / ".hybridtrain" / "stores" / "cloud-eu" / "serving" / "current" / f"{MODEL}.json"
    assert '"version":"1"' in cloud.read_text()

    champion = invoke("retire", MODEL, "1", *home)
    assert champion.exit_code == 9 and "v1 is the champion (it is being served)" in flat(champion.output)
    gone = invoke("retire", MODEL, "2", *home, "--spec", "jobs/churn-released.yaml")
    assert gone.exit_code == 0, gone.output
    assert f"{MODEL} v2 retired: removed from onprem-serving, cloud-serving" in flat(gone.output)
    assert not (ws.root / "serving" / "versions" / MODEL / "2").exists()

    again = invoke("rollback", MODEL, *home)
    assert again.exit_code == 9 and "has no previous version to roll back to" in flat(again.output)
    records = list(AuditLog.in_workspace(ws.root).records())
    assert [r.action for r in records][-2:] == ["rollback", "retire"] and records[-2].actor == "ana"
    assert invoke("audit", "verify", *home).exit_code == 0


def test_rollback_and_retire_mistakes_exit_non_zero(ws, tmp_path):
    home = ("--home", str(ws.root))
    nobody = invoke("rollback", "no-such-model", *home)
    assert nobody.exit_code == 9 and "has no champion" in flat(nobody.output)
    no_version = invoke("retire", "no-such-model", "4", *home)
    assert no_version.exit_code == 9 and "has no version 4; versions: none" in flat(no_version.output)
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(SpecError) as exc:
        build_releaser(ws, [], tmp_path / "bad.pem")
    assert "--public-key" in str(exc.value) and "not a PEM public key" in str(exc.value)
    bad_key = invoke("audit", "verify", *home, "--public-key", str(tmp_path / "bad.pem"))
    assert bad_key.exit_code == 2 and "not a PEM public key" in flat(bad_key.output)
