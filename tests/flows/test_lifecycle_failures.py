"""Bad specs and bad data fail the flow with the documented message; a leak stops the sync."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from hybridtrain.errors import DataError, LeakDetected, SpecError
from tests.fixtures.lifecycle_runs import retrack, run_failing
from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(prefect_server, pseudonym_key, tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("failures") / "ws", rows=2500)


def test_invalid_spec_fails_with_every_field_named(root):
    bad = root / "jobs" / "bad.yaml"
    data = yaml.safe_load((root / "jobs" / "churn.yaml").read_text())
    data["model"]["epoch"] = 3
    data["schema"]["label"] = "left"
    bad.write_text(yaml.safe_dump(data))
    exc = run_failing(bad, root)
    assert isinstance(exc, SpecError)
    assert {p.path for p in exc.problems} == {"model.epoch", "schema.label"}


def test_missing_column_fails_naming_the_column(root):
    raw = pd.read_csv(root / "data" / "raw" / "churn.csv", dtype=str).drop(columns=["tenure_months"])
    md5 = retrack(root, raw, "no_tenure")
    spec = spec_writer(root)("no-tenure", dataset__path="data/raw/no_tenure.csv", dataset__md5=md5)
    exc = run_failing(spec, root)
    assert isinstance(exc, DataError)
    assert [p.path for p in exc.problems] == ["tenure_months"]
    assert "column is missing" in str(exc)


def test_raw_value_in_another_column_is_caught_and_nothing_is_synced(root):
    raw = pd.read_csv(root / "data" / "raw" / "churn.csv", dtype=str)
    raw["region"] = raw["region"].where(raw.index % 50 != 0, raw["email"])  # an export bug copies emails
    md5 = retrack(root, raw, "leaky")
    spec = spec_writer(root)("leaky", dataset__path="data/raw/leaky.csv", dataset__md5=md5,
                             metadata__name="leaky", registry__model_name="leaky-model")
    exc = run_failing(spec, root)
    assert isinstance(exc, LeakDetected)
    assert "email" in exc.hits
    assert "nothing was synced" in str(exc)
    cloud_store = root / ".hybridtrain" / "stores" / "cloud-eu" / "dvc"
    assert not cloud_store.exists() or not any(cloud_store.rglob("*"))
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    runs = Registry(ws.tracking_uri, ws.mlflow_artifacts).recent_runs(ws.experiment, 1)
    assert runs[0].info.status == "FAILED" and runs[0].data.tags["hybridtrain.job"] == "leaky"


def test_pinned_version_that_does_not_exist_says_what_to_do(root):
    spec = spec_writer(root)("ghost", dataset__md5="f" * 32)
    exc = run_failing(spec, root)
    assert isinstance(exc, DataError)
    assert "set dataset.md5 to" in str(exc)
