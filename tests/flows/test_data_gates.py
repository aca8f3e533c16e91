"""Data gates: unusable data fails at its own site, before sync — nothing synced, no model registered."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hybridtrain.errors import DataError
from tests.fixtures.lifecycle_runs import retrack, run_failing
from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(prefect_server, pseudonym_key, tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("gates") / "ws", rows=2500)


def raw(root) -> pd.DataFrame:
    return pd.read_csv(root / "data" / "raw" / "churn.csv", dtype=str)


def all_nan_feature(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(satisfaction_score=np.nan)


def single_class_label(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(churned="0")


@pytest.mark.parametrize(("case", "make", "spec_changes", "where"), [
    ("allnan", all_nan_feature, {}, "column satisfaction_score"),
    ("oneclass", single_class_label, {}, "column churned"),
    # The demo's fine levels on a 2,500-row sample: k-anonymity removes most rows.
    ("suppressed", None, {"sensitive__columns__date_of_birth__level": "year",
                          "sensitive__columns__postcode__level": "outward"}, "sensitive.max_suppressed_fraction"),
    # Every row suppressed: a clear error, not a bare AssertionError.
    ("nothingleft", None, {"sensitive__k_anonymity": 100000}, "split.train"),
])
def test_bad_data_stops_before_sync_and_registration(root, case, make, spec_changes, where):
    changes = dict(spec_changes)
    if make is not None:
        md5 = retrack(root, make(raw(root)), case)
        changes.update(dataset__path=f"data/raw/{case}.csv", dataset__md5=md5)
    spec = spec_writer(root)(case, metadata__name=case, registry__model_name=f"{case}-model", **changes)
    exc = run_failing(spec, root)
    assert isinstance(exc, DataError), repr(exc)
    assert where in {p.path for p in exc.problems}, str(exc)
    assert "nothing was synced" in str(exc)

    cloud_store = root / ".hybridtrain" / "stores" / "cloud-eu"
    assert not cloud_store.exists() or not any(p.is_file() for p in cloud_store.rglob("*"))
    assert not (root / "data" / "approved" / case).exists() or not any((root / "data" / "approved" / case).rglob("*"))
    from mlflow import MlflowClient

    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    client = MlflowClient(ws.tracking_uri, registry_uri=ws.tracking_uri)
    assert client.search_model_versions(f"name='{case}-model'") == []


def test_cli_run_prints_one_clear_error_and_keeps_the_traceback_in_the_log(root, prefect_server):
    import os
    import subprocess
    import sys

    md5 = retrack(root, all_nan_feature(raw(root)), "allnan-cli")
    spec = spec_writer(root)("allnan-cli", metadata__name="allnan-cli", registry__model_name="allnan-cli-model",
                             dataset__path="data/raw/allnan-cli.csv", dataset__md5=md5)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "HYBRIDTRAIN_HOME": str(root), "CI": "true"}
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli", "run", str(spec), "--dispatch", "inline"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == DataError.exit_code, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert out.count("error:") == 1 and "column satisfaction_score" in out, out[-4000:]
    log = out.split("the run's log, with Prefect's traceback: ", 1)[1].split(")", 1)[0]
    text = open(log, encoding="utf-8").read()
    assert "Traceback" in text and "DataError" in text
