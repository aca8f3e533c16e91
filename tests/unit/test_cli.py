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


def test_run_with_a_run_key_that_names_no_checkpoint_series_is_refused_before_anything_starts(tmp_path):
    result = runner.invoke(app, ["run", str(ROOT / "jobs/churn.yaml"), "--run-key", "../../etc", "--home", str(ROOT)])
    assert result.exit_code == 2, result.output
    assert "--run-key: '../../etc' is not a run key" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_schema_is_json_schema_of_the_spec():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["title"].startswith("hybridtrain TrainingJob")


def test_schema_out_is_refused_where_no_file_can_be_and_written_whole(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for out, says in ((tmp_path, "is a directory"), (tmp_path / "a-file" / "s.json", "which is not a directory"),
                      (tmp_path / "no" / "s.json", "which is not a directory")):  # each was a traceback
        result = runner.invoke(app, ["schema", "--out", str(out)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert " ".join(result.output.split()).startswith(f"error: --out: '{out}' ") and says in result.output
    result = runner.invoke(app, ["schema", "--out", str(tmp_path / "s.json")])
    assert result.exit_code == 0 and json.loads((tmp_path / "s.json").read_text())["title"].startswith("hybridtrain")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "s.json"]  # no temporary file left


def test_status_refuses_a_bad_limit_a_missing_home_and_an_unreadable_store(workspace):
    result = runner.invoke(app, ["status", "--limit", "0", "--home", str(workspace)])
    assert result.exit_code == 2 and " ".join(result.output.split()) == \
        "error: --limit: 0 is not a number of runs; give 1 to 1000"  # MLflow raised on 0 and -1
    result = runner.invoke(app, ["status", "--home", str(workspace / "typo")])
    assert result.exit_code == 2 and "--home" in result.output and "does not exist" in result.output
    assert not (workspace / "typo").exists()  # it used to say "no runs yet", exit 0
    store = workspace / ".hybridtrain" / "mlflow" / "mlflow.db"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("not a database")
    result = runner.invoke(app, ["status", "--home", str(workspace)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    said = " ".join(result.output.split())  # the store's own one line: the file, what is wrong, what to do
    assert f"MLflow tracking store {store}" in said and "cannot be read as an SQLite database" in said
    assert "move it aside and run again" in said


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


def test_ctrl_c_during_a_run_says_how_to_resume_it(tmp_path, monkeypatch, capsys):
    import typer

    import flows.lifecycle
    from hybridtrain.workspace import Workspace
    from orchestration import cli

    seen = {}

    def interrupted(**params):
        seen.update(params)
        raise KeyboardInterrupt

    monkeypatch.setattr(flows.lifecycle, "lifecycle", interrupted)
    ws = Workspace.resolve(tmp_path)
    with pytest.raises(typer.Exit) as exc:
        cli._run_lifecycle(ws, ROOT / "jobs/churn.yaml", None, "inline")
    assert exc.value.exit_code == 130
    key = seen["run_key"]  # the run was given a key it can be resumed by
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith("interrupted:") and f"--run-key {key}`" in said and "Traceback" not in said
