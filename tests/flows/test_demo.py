"""`hybridtrain demo` twice, as a user runs it: the second run trains longer and takes the champion
(``previous`` -> the first), and `hybridtrain rollback` moves it back — each a CLI subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow

ROWS = 3000


def cli(root: Path, api: str, *args: str) -> str:
    env = {**os.environ, "PREFECT_API_URL": api, "HYBRIDTRAIN_HOME": str(root), "CI": "true"}
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli", *args], check=False, cwd=root,
                          env=env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_a_second_demo_moves_the_champion_and_rollback_moves_it_back(prefect_server, tmp_path):
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    root = build_workspace(tmp_path / "ws", rows=ROWS)
    # The demo's spec, sized for a test: 2 epochs first (a quick, under-trained champion), 4 the second time.
    spec_writer(root)("demo", model__epochs=2, evaluation__thresholds={"auc": 0.7})
    first = cli(root, prefect_server, "demo", "--rows", str(ROWS), "--spec", "jobs/demo.yaml")
    assert "alias champion -> v1" in first, first[-3000:]
    second = cli(root, prefect_server, "demo", "--rows", str(ROWS), "--spec", "jobs/demo.yaml")
    assert "already has a champion: this run trains 4 epochs instead of 2" in second, second[-3000:]
    assert "alias champion -> v2" in second and "previous -> v1" in second, second[-3000:]
    ws = Workspace.resolve(root)
    reg = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    assert reg.by_alias("churn-classifier", "champion").version == "2"
    assert reg.by_alias("churn-classifier", "previous").version == "1"
    back = cli(root, prefect_server, "rollback", "churn-classifier", "--spec", "jobs/demo.yaml")
    assert "champion v2 -> v1" in back, back
    assert reg.by_alias("churn-classifier", "champion").version == "1"
