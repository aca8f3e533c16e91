"""hybridtrain worker serves the control pool `hybridtrain deploy` makes, as it serves a site's pool."""

from __future__ import annotations

import os
import sys

import pytest
from typer.testing import CliRunner

from orchestration.cli import app


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch):
    monkeypatch.setattr(os, "environ", os.environ.copy())


def test_the_control_pool_gets_a_worker_with_the_workspace_as_its_home(workspace, monkeypatch):
    import deployments.bootstrap

    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setattr(deployments.bootstrap, "check_server", lambda what, url: None)
    monkeypatch.setattr(os, "chdir", lambda path: None)
    monkeypatch.setattr(os, "execve", lambda exe, cmd, env: started.append((cmd, env)))
    result = CliRunner().invoke(app, ["worker", "--pool", "control", "--home", str(workspace)])
    assert result.exit_code == 0, result.output
    ((cmd, env),) = started
    assert cmd == [sys.executable, "-m", "prefect", "worker", "start", "--pool", "control", "--type", "process"]
    assert env["HYBRIDTRAIN_HOME"] == str(workspace)


def test_an_unknown_pool_lists_the_site_pools_and_control(workspace, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never reached: refused before
    result = CliRunner().invoke(app, ["worker", "--pool", "gpu", "--home", str(workspace)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "(pools: cloud, onprem) nor 'control' (the control flows' pool)" in text
