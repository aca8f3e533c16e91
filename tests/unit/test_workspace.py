"""Settings precedence: CLI flag > HYBRIDTRAIN_* environment > default."""

from __future__ import annotations

from hybridtrain.workspace import Workspace


def test_defaults_are_inside_the_workspace(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDTRAIN_HOME", raising=False)
    monkeypatch.delenv("HYBRIDTRAIN_MLFLOW_TRACKING_URI", raising=False)
    ws = Workspace.resolve(tmp_path)
    assert ws.root == tmp_path.resolve()
    assert ws.sites_file == tmp_path.resolve() / "deployments" / "sites.yaml"
    assert ws.tracking_uri == f"sqlite:///{tmp_path.resolve()}/.hybridtrain/mlflow/mlflow.db"
    assert not ws.state_dir.exists()  # resolving creates nothing


def test_environment_overrides_default_and_flag_overrides_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDTRAIN_HOME", str(tmp_path / "env-home"))
    monkeypatch.setenv("HYBRIDTRAIN_MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    ws = Workspace.resolve()
    assert ws.root == (tmp_path / "env-home").resolve()
    assert ws.tracking_uri == "http://mlflow.example:5000"
    ws = Workspace.resolve(tmp_path / "flag-home", tracking_uri="sqlite:///x.db", sites_file="other/sites.yaml")
    assert ws.root == (tmp_path / "flag-home").resolve()
    assert ws.tracking_uri == "sqlite:///x.db"
    assert ws.sites_file == (tmp_path / "flag-home").resolve() / "other" / "sites.yaml"


def test_prefect_env_only_when_prefect_is_unconfigured(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    ws = Workspace.resolve(tmp_path)
    assert ws.prefect_env()["PREFECT_HOME"] == str(tmp_path.resolve() / ".hybridtrain" / "prefect")
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example/api")
    assert ws.prefect_env() == {}
