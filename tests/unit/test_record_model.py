"""RecordModel: a registered version scores records through mlflow.pyfunc, with a column signature and clear 400s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import mlflow.pyfunc
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException

from hybridtrain.governance.bundle import BundleDataset, ModelBundle
from hybridtrain.governance.release import EdgeTarget
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training import evaluation
from hybridtrain.training.edge_score import EdgeError, EdgeModel
from hybridtrain.training.featurizer import Featurizer
from tests.fixtures.gate_cases import MODEL
from tests.fixtures.record_models import churn_records, fitted, register_version


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    root = tmp_path_factory.mktemp("mlflow")
    reg = Registry(f"sqlite:///{root}/mlflow.db", root / "artifacts")
    register_version(reg, seed=0)
    mlflow.set_tracking_uri(reg.tracking_uri)
    mlflow.set_registry_uri(reg.tracking_uri)
    return reg


@pytest.fixture(scope="module")
def champion(registry):
    return mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")


@pytest.fixture(scope="module")
def model_dir(registry, tmp_path_factory) -> Path:
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{MODEL}@champion",
                                                    dst_path=str(tmp_path_factory.mktemp("dl"))))


def expected_scores(records) -> np.ndarray:
    net, feat, _ = fitted(0)
    with torch.no_grad():
        return torch.sigmoid(net(torch.from_numpy(feat.transform(records)))).double().numpy()


def test_champion_scores_records_like_featurizer_plus_network(champion):
    records = churn_records(50)
    scores = champion.predict(records)
    assert scores.shape == (50,)
    assert np.all((scores > 0) & (scores < 1))
    np.testing.assert_allclose(scores, expected_scores(records), rtol=0, atol=1e-7)


def test_signature_lists_feature_columns_with_types_and_no_identifiers(champion, model_dir):
    schema = champion.metadata.get_input_schema()
    types = {c.name: c.type.name for c in schema.inputs}
    assert list(types) == ["tenure_months", "monthly_charges", "total_charges", "support_calls_90d",
                           "late_payments_12m", "avg_monthly_gb", "satisfaction_score", "has_streaming",
                           "num_products", "date_of_birth", "contract", "payment_method", "internet_service", "region"]
    assert types["tenure_months"] == "long" and types["monthly_charges"] == "double"
    assert types["has_streaming"] == "boolean"
    assert types["contract"] == "string"
    assert not {"account_id", "email", "full_name", "phone", "postcode", "churned"} & set(types)
    example = json.loads((model_dir / "input_example.json").read_text())
    assert example["columns"] == list(types)
    assert len(example["data"]) == 2


def test_extra_columns_and_missing_values_are_accepted(champion):
    records = churn_records(5)
    records["account_id"] = "acct-1"  # identifiers a caller might still send are ignored
    records.loc[0, "satisfaction_score"] = np.nan
    scores = champion.predict(records)
    assert np.isfinite(scores).all()


def test_missing_column_is_a_400_naming_it(champion):
    records = churn_records(3).drop(columns=["contract"])
    with pytest.raises(MlflowException) as info:
        champion.predict(records)
    assert info.value.get_http_status_code() == 400
    assert "contract" in info.value.message


def test_wrong_type_is_a_400(champion):
    records = churn_records(3)
    records["monthly_charges"] = records["monthly_charges"].astype(object)
    records.loc[1, "monthly_charges"] = "lots"
    with pytest.raises(MlflowException) as info:
        champion.predict(records)
    assert info.value.get_http_status_code() == 400
    assert "monthly_charges" in info.value.message


def test_unseen_category_is_a_400_listing_the_known_values(champion):
    records = churn_records(3)
    records.loc[2, "contract"] = "lifetime"
    with pytest.raises(MlflowException) as info:
        champion.predict(records)
    assert info.value.get_http_status_code() == 400
    assert "contract" in info.value.message and "'lifetime'" in info.value.message
    assert "month-to-month" in info.value.message.lower() or "known values" in info.value.message


def test_registry_load_gives_network_and_featurizer_for_evaluation(registry):
    net, feat = registry.load(MODEL, "1")
    records = churn_records(200)
    labels = (np.arange(len(records)) % 2).astype(int)
    frame = records.assign(churned=labels)
    metrics = evaluation.evaluate(net, Featurizer.from_dict(feat), frame, "churned")
    assert 0.0 <= metrics["auc"] <= 1.0


def test_edge_export_scores_like_the_pyfunc(champion, model_dir):
    edge = model_dir / "artifacts" / "edge"
    records = churn_records(40)
    rows = json.loads(records.to_json(orient="records"))
    np.testing.assert_allclose(EdgeModel(edge).score(rows), champion.predict(records), rtol=0, atol=1e-6)
    bad = dict(rows[0], contract="lifetime")
    with pytest.raises(EdgeError, match="contract"):
        EdgeModel(edge).score([bad])


def run_on_device(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``score.py`` with python and torch only: hybridtrain, mlflow, pandas and sklearn cannot be imported."""
    runner = ("import sys, runpy\n"
              "for m in ('hybridtrain', 'mlflow', 'pandas', 'sklearn'):\n"
              "    sys.modules[m] = None\n"
              f"sys.argv = ['score.py', *{list(args)!r}]\n"
              f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", runner], cwd=script.parent, capture_output=True, text=True,
                          timeout=120)


def test_edge_script_runs_without_hybridtrain_mlflow_or_pandas(champion, model_dir, tmp_path):
    records = churn_records(5)
    (tmp_path / "records.json").write_text(records.to_json(orient="records"))
    out = run_on_device(model_dir / "artifacts" / "edge" / "score.py", str(tmp_path / "records.json"))
    assert out.returncode == 0, out.stderr
    scores = [float(x) for x in out.stdout.split()]
    np.testing.assert_allclose(scores, champion.predict(records), rtol=0, atol=1e-6)


def test_edge_target_package_verifies_on_the_device_and_refuses_tampering(champion, model_dir, tmp_path):
    key = SigningKey.generate()
    bundle = ModelBundle.build(
        tmp_path / "bundle", model=MODEL, version="1", weights=model_dir, spec={},
        datasets=[BundleDataset(tier="raw", path="data/raw", md5="1" * 32)], evaluation={}, lineage={},
        checkpoint_sha256=None, signing_key=key, environment={})
    EdgeTarget("edge-1", tmp_path / "device", key.public).accept(bundle)
    edge = tmp_path / "device" / "versions" / MODEL / "1" / "weights" / "artifacts" / "edge"
    pem = tmp_path / "release.pub.pem"
    pem.write_bytes(key.public.to_pem())
    records = churn_records(4)
    (tmp_path / "records.json").write_text(records.to_json(orient="records"))
    out = run_on_device(edge / "score.py", str(tmp_path / "records.json"), "--public-key", str(pem))
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose([float(x) for x in out.stdout.split()], champion.predict(records), rtol=0, atol=1e-6)

    feat = json.loads((edge / "featurizer.json").read_text())
    feat["numeric"][0]["mean"] += 1.0
    (edge / "featurizer.json").write_text(json.dumps(feat))
    out = run_on_device(edge / "score.py", str(tmp_path / "records.json"), "--public-key", str(pem))
    assert out.returncode == 1 and out.stdout == ""
    assert "featurizer.json: content changed since signing" in out.stderr


def test_small_request_path_featurizes_exactly_like_the_featurizer(champion):
    scorer = champion.unwrap_python_model().scorer
    records = churn_records(64, seed=9)
    records.loc[3, "satisfaction_score"] = np.nan
    records["region"] = records["region"].astype(object)
    records.loc[5, "region"] = None  # a null category goes to the other bucket, as in training
    for rows in (records.head(1), records.head(7), records):
        np.testing.assert_array_equal(scorer.featurize(rows), scorer.featurizer.transform(rows))
    assert scorer.featurize(records).shape == (64, scorer.featurizer.n_features)


def test_served_hot_path_checks_records_against_the_schema_and_scores_like_predict(champion):
    from hybridtrain.serving.request import BadRecords, RecordReader
    from hybridtrain.serving.server import hot_path

    scorer, reader = hot_path(champion)
    assert isinstance(reader, RecordReader)
    assert set(reader.columns) == set(champion.metadata.get_input_schema().input_names())
    frame = churn_records(40, seed=11)
    frame.loc[2, "satisfaction_score"] = np.nan  # sent as null: imputed as in training
    records = json.loads(frame.to_json(orient="records"))
    records[0]["account_id"] = "A-1"  # extra keys are ignored, as by MLflow
    columns = reader.read(json.dumps({"dataframe_records": records}))
    np.testing.assert_array_equal(scorer.score_columns(columns.values, columns.rows), champion.predict(frame))
    assert reader.read(json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split"))})) is None

    def problem(change) -> str:
        recs = json.loads(frame.head(3).to_json(orient="records"))
        change(recs)
        with pytest.raises(BadRecords) as exc:
            reader.read(json.dumps({"dataframe_records": recs}))
        return str(exc.value)

    assert problem(lambda r: r[1].pop("contract")).startswith("record 1 lacks the feature column contract")
    assert problem(lambda r: r[2].update(monthly_charges="lots")) == \
        'column monthly_charges: record 2 has "lots", but the column takes a number or null'
    assert "takes an integer" in problem(lambda r: r[0].update(num_products=1.5))
    assert "takes true or false" in problem(lambda r: r[0].update(has_streaming="yes"))
    with pytest.raises(MlflowException, match="unseen category 'barter' in 1 record"):
        cols = reader.read(json.dumps({"dataframe_records": [{**records[0], "payment_method": "barter"}]}))
        scorer.score_columns(cols.values, cols.rows)
