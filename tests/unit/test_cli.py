"""CLI: user mistakes give a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from typer.testing import CliRunner

from orchestration.cli import app
from tests.fixtures.workspaces import ROOT

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch):
    # Commands set Prefect/DVC defaults in os.environ for their process; keep them out of other tests.
    monkeypatch.setattr(os, "environ", os.environ.copy())


def test_validate_accepts_the_project_files():
    result = runner.invoke(app, ["validate", str(ROOT / "jobs/churn.yaml"), str(ROOT / "deployments/sites.yaml"),
                                 "--home", str(ROOT)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "SitesCatalog" in result.output


def test_validate_reports_every_problem_without_traceback(tmp_path):
    data = yaml.safe_load((ROOT / "jobs/churn.yaml").read_text())
    data["model"]["hidden_layers"] = [0]
    data["dataset"]["site"] = "mars"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["validate", str(bad), "--home", str(ROOT)])
    assert result.exit_code == 2
    assert "model.hidden_layers" in result.output and "dataset.site" in result.output
    assert "Traceback" not in result.output


def test_run_with_a_missing_spec_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml"), "--home", str(ROOT)])
    assert result.exit_code == 2
    assert "file not found" in result.output and "Traceback" not in result.output


def test_schema_is_json_schema_of_the_spec():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["title"].startswith("hybridtrain TrainingJob")


def test_worker_refuses_a_pool_the_sites_catalog_lacks(workspace, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never reached: refused before
    result = runner.invoke(app, ["worker", "--pool", "gpu", "--home", str(workspace)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())  # the console wraps a long workspace path
    assert "--pool 'gpu' is not a pool of" in text and "(pools: cloud, onprem)" in text


def test_deploy_with_a_code_repo_for_an_unknown_pool_names_the_pools(workspace, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # refused before any request
    result = runner.invoke(app, ["deploy", "--code-repo", "gpu=file:///srv/ml.git", "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    assert "pool 'gpu' is not in the sites catalog (pools: cloud, onprem)" in result.output
