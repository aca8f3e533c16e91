"""The whole lifecycle as Prefect flows on a real Prefect server, MLflow SQLite store and DVC repo.

One module-scoped sequence of three runs on the same data: a weak model (first champion), a
strong model (better: champion moves, the old one becomes ``previous``), the weak model again
(worse: registered but the champion stays).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow

WEAK = {"model__features": {"numeric": ["support_calls_90d"], "categorical": []},
        "evaluation__thresholds": {"auc": 0.5}}
SENSITIVE = ["account_id", "full_name", "email", "phone", "date_of_birth", "postcode"]


@pytest.fixture(scope="module")
def runs(prefect_server, pseudonym_key, tmp_path_factory):
    from flows.lifecycle import lifecycle

    root = build_workspace(tmp_path_factory.mktemp("lifecycle") / "ws")
    write = spec_writer(root)
    weak = write("weak", **WEAK)
    strong = write("strong", evaluation__thresholds={"auc": 0.7})
    out = {"root": root}
    out["a"] = lifecycle(spec_path=str(weak), workspace=str(root), dispatch="inline")
    out["b"] = lifecycle(spec_path=str(strong), workspace=str(root), dispatch="inline")
    out["c"] = lifecycle(spec_path=str(weak), workspace=str(root), dispatch="inline")
    return out


def registry(root: Path):
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    return Registry(ws.tracking_uri, ws.mlflow_artifacts)


def dvc_md5(root: Path, path: str) -> str:
    return yaml.safe_load((root / f"{path}.dvc").read_text())["outs"][0]["md5"]


def test_champion_moves_only_for_a_better_model(runs):
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert (a.model_version, a.promoted, a.champion_version) == ("1", True, "1"), (a.reasons, a.metrics)
    assert (b.model_version, b.promoted, b.champion_version, b.previous_version) == ("2", True, "2", "1")
    assert b.metrics["auc"] > a.metrics["auc"] + 0.05
    assert (c.model_version, c.promoted, c.champion_version) == ("3", False, "2")
    # Only the comparison gate said no; every other gate (lineage, signature, cost...) passed.
    assert c.gates["not_worse"].startswith("failed") and c.reasons[0].startswith("gate not_worse")
    assert {g for g, v in c.gates.items() if v != "passed"} == {"not_worse"}, c.gates
    assert b.gates["rollback_target"] == "passed" and a.gates["rollback_target"] == "passed"
    reg = registry(runs["root"])
    assert reg.by_alias("churn-classifier", "champion").version == "2"
    assert reg.by_alias("churn-classifier", "previous").version == "1"
    assert reg.version("churn-classifier", "3").tags["hybridtrain.governance.promotion"] == "not-promoted"
    # Even on this small sample the strong model ranks well; the demo-size check is in tests/model.
    assert b.metrics["auc"] > 0.75, b.metrics


def test_lineage_tags_equal_the_dvc_versions(runs):
    root = runs["root"]
    tags = registry(root).version("churn-classifier", "2").tags
    assert tags["hybridtrain.dataset.raw.md5"] == dvc_md5(root, "data/raw/churn.csv") == runs["b"].datasets["raw"]
    assert tags["hybridtrain.dataset.curated.md5"] == dvc_md5(root, "data/curated/churn")
    assert tags["hybridtrain.dataset.approved.md5"] == dvc_md5(root, "data/approved/churn")
    assert tags["hybridtrain.site"] == "cloud-eu"
    assert tags["hybridtrain.job"] == "churn"
    from hybridtrain.specs.job import load_spec

    assert tags["hybridtrain.spec_hash"] == load_spec(root / "jobs" / "strong.yaml").spec_hash()
    assert tags["hybridtrain.code_version"]  # "unknown" only outside git; the workspace is a git repo
    run_tags = registry(root).client.get_run(runs["b"].mlflow_run_id).data.tags
    assert int(run_tags["hybridtrain.bytes_synced"]) == runs["b"].bytes_synced  # on the run, not the version


def test_a_version_carries_what_a_reader_needs_and_the_run_the_rest(runs):
    reg = registry(runs["root"])
    tags = reg.version("churn-classifier", "2").tags
    assert len(tags) <= 30, sorted(tags)
    assert {"hybridtrain.cost.total_usd", "hybridtrain.metric.auc", "hybridtrain.dataset.approved.md5"} <= set(tags)
    assert any(k.startswith("hybridtrain.gate.") for k in tags)
    assert "hybridtrain.dataset.raw.path" not in tags and "hybridtrain.cost.storage_usd" not in tags
    run_tags = reg.client.get_run(runs["b"].mlflow_run_id).data.tags
    assert run_tags["hybridtrain.dataset.raw.path"] == "data/raw/churn.csv"
    assert "hybridtrain.cost.storage_usd" in run_tags


def test_learning_curves_and_cost_breakdown_are_in_mlflow_and_the_summary(runs):
    reg = registry(runs["root"])
    b = runs["b"]
    for path in ("plots/learning_curves.png", "plots/cost_breakdown.png"):
        assert reg.read_bytes(b.mlflow_run_id, path).startswith(b"\x89PNG"), path
    assert b.pictures == {"Learning curves": "plots/learning_curves.png", "Cost breakdown": "plots/cost_breakdown.png"}
    md = b.render(reg)
    assert md.count("](data:image/png;base64,") == 2
    assert len(b.history) == 4 and "Training: 4 epochs" in md


def test_mlflow_run_records_dataset_inputs_from_dvc(runs):
    reg = registry(runs["root"])
    run = reg.client.get_run(runs["b"].mlflow_run_id)
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"churn-raw", "churn-curated", "churn-approved"}
    assert inputs["churn-approved"].digest == dvc_md5(runs["root"], "data/approved/churn")
    assert "files/md5/" in inputs["churn-approved"].source and "cloud-eu" in inputs["churn-approved"].source
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_auc"] == pytest.approx(runs["b"].metrics["auc"])


def test_first_sync_moves_bytes_and_an_unchanged_resync_moves_none(runs):
    a, b = runs["a"], runs["b"]
    assert a.bytes_synced > 10_000 and a.sync_route == "onprem-dc1->cloud-eu"
    assert b.bytes_synced == 0  # same approved version: content addressing moves nothing
    data, model = a.transfers
    assert (data["source"], data["destination"], data["bytes"]) == ("onprem-dc1", "cloud-eu", a.bytes_synced)
    assert data["cost_usd"] == 0  # on-prem egress is free in sites.yaml
    # The trained model travels back from the cloud site to the registry, at the cloud's egress price.
    assert (model["source"], model["destination"]) == ("cloud-eu", "onprem-dc1") and model["bytes"] > 1000
    assert model["cost_usd"] == pytest.approx(model["bytes"] / 1e9 * 0.09, abs=1e-6)
    assert a.egress_usd == pytest.approx(model["cost_usd"], abs=1e-6)


def test_approved_data_at_the_cloud_site_holds_no_raw_sensitive_value(runs):
    root = runs["root"]
    raw = pd.read_csv(root / "data" / "raw" / "churn.csv", dtype=str)
    raw_values = set()
    for col in SENSITIVE:
        raw_values |= set(raw[col].dropna().str.strip().str.casefold())
    cloud_copy = root / ".hybridtrain" / "sites" / "cloud-eu" / "data" / "approved" / "churn"
    parts = sorted(cloud_copy.rglob("*.parquet"))
    assert parts, "the cloud site's copy of the approved data is missing"
    for part in parts:
        df = pq.read_table(part).to_pandas()
        assert not {"full_name", "phone"} & set(df.columns)
        for col in df.columns:
            values = set(df[col].dropna().astype(str).str.strip().str.casefold())
            assert not values & raw_values, f"raw sensitive value in {part.name}:{col}"


def test_checkpoints_were_written_to_the_training_sites_store(runs):
    store = runs["root"] / ".hybridtrain" / "stores" / "cloud-eu" / "objects" / "checkpoints" / "churn"
    manifests = list(store.rglob("*.json"))
    assert manifests and all(m.with_suffix(".pt").exists() for m in manifests)


def test_summary_and_placement_artifacts_are_in_prefect(runs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    def latest(key: str) -> str:
        with get_client(sync_client=True) as client:
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        assert arts, key
        return max(arts, key=lambda a: a.created).data

    summary = latest("lifecycle-churn")
    assert "champion" in summary and "| train | cloud-eu |" in summary and "## Site crossings" in summary
    assert summary.count("](data:image/png;base64,") == 2  # learning curves and cost, embedded
    placement = latest("placement-churn")
    assert "## Every candidate" in placement
    for site in ("onprem-dc1", "cloud-eu"):
        assert f"| {site} |" in placement, placement


def test_each_stage_result_is_kept_in_the_lifecycle_run(runs):
    from flows.data import Prepared
    from flows.training import Trained
    from hybridtrain import stages
    from hybridtrain.workspace import Workspace

    ws, run_id = Workspace.resolve(runs["root"]), runs["b"].mlflow_run_id
    assert stages.load_result(ws, run_id, "prepare-data", Prepared).anon.approved.md5 == runs["b"].datasets["approved"]
    assert stages.load_result(ws, run_id, "train-stage", Trained).evaluated.metrics["auc"] == runs["b"].metrics["auc"]


def test_every_step_is_in_the_audit_log_and_the_chain_verifies(runs):
    from hybridtrain.governance import audit_key
    from hybridtrain.governance.audit_log import AuditLog

    log = AuditLog.in_workspace(runs["root"])
    report = log.verify(public_key=audit_key.verify_key(runs["root"]))  # every writer signed the head
    assert report.ok and report.head.signature, report.problems
    records = list(log.records())
    actions = [r.action for r in records]
    for action in ("tier_promotion", "placement", "sync", "gate", "promotion", "release"):
        assert action in actions, action
    tiers = [(r.inputs["tier_from"], r.inputs["tier_to"]) for r in records if r.action == "tier_promotion"]
    assert ("raw", "curated") in tiers and ("curated", "approved") in tiers
    assert all(r.actor.startswith("prefect flow run") for r in records)


def test_the_champion_is_released_signed_to_every_target(runs):
    import json

    from hybridtrain.governance.bundle import ModelBundle
    from hybridtrain.governance.signing_key import VerifyKey

    root = runs["root"]
    onprem = root / ".hybridtrain" / "serving" / "onprem"
    cloud = root / ".hybridtrain" / "stores" / "cloud-eu" / "releases"
    for target in (onprem, cloud):
        current = json.loads((target / "current" / "churn-classifier.json").read_text())
        assert current["version"] == "2"
    key = VerifyKey.from_pem((root / ".hybridtrain" / "keys" / "release.pub.pem").read_bytes())
    bundle = ModelBundle(onprem / "versions" / "churn-classifier" / "2")
    bundle.verify(key)
    assert {tier: d.md5 for tier, d in bundle.datasets().items()} == runs["b"].datasets
    assert not (onprem / "versions" / "churn-classifier" / "3").exists()  # not promoted, not released


def test_ledger_is_attached_to_each_version_and_printed(runs):
    from typer.testing import CliRunner

    from orchestration.cli import app

    tags = registry(runs["root"]).version("churn-classifier", "2").tags
    assert float(tags["hybridtrain.cost.total_usd"]) == pytest.approx(runs["b"].cost_usd, abs=1e-6)  # tag: 6 decimals
    out = CliRunner().invoke(app, ["ledger", "churn-classifier", "--home", str(runs["root"])])
    assert out.exit_code == 0, out.output
    assert "total" in out.output.lower() and "2" in out.output


def test_rollback_moves_the_champion_back_everywhere(runs):
    import json

    from typer.testing import CliRunner

    from orchestration.cli import app

    root = runs["root"]
    out = CliRunner().invoke(app, ["rollback", "churn-classifier", "--spec", str(root / "jobs" / "strong.yaml"),
                                   "--home", str(root)])
    assert out.exit_code == 0, out.output
    reg = registry(root)
    assert reg.by_alias("churn-classifier", "champion").version == "1"
    for target in (root / ".hybridtrain" / "serving" / "onprem", root / ".hybridtrain" / "stores" / "cloud-eu" /
                   "releases"):
        assert json.loads((target / "current" / "churn-classifier.json").read_text())["version"] == "1"
    from hybridtrain.governance.audit_log import AuditLog

    assert list(AuditLog.in_workspace(root).records())[-1].action == "rollback"
