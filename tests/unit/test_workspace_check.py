"""Workspace.checked: a workspace root that does not exist, is a file or holds no sites catalog is refused, located at
the setting that chose it (the CLI's --home, a flow's workspace parameter, HYBRIDTRAIN_HOME) with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridtrain.errors import SpecError
from hybridtrain.workspace import Workspace

FLOW = {"name": "workspace", "fix": "FIX", "env_fix": "ENV-FIX", "unset_fix": "UNSET-FIX"}


@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, Path]:
    for name in ("HYBRIDTRAIN_HOME", "HYBRIDTRAIN_SITES_FILE"):
        monkeypatch.delenv(name, raising=False)
    ws = tmp_path / "ws"
    (ws / "deployments").mkdir(parents=True)
    (ws / "deployments" / "sites.yaml").write_text("apiVersion: hybridtrain/v1\nsites: []\n")
    (tmp_path / "a-file").write_text("not a workspace\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    return {"ws": ws, "nope": tmp_path / "nope", "a-file": tmp_path / "a-file", "empty": tmp_path / "empty"}


def refusal(root, **names) -> tuple[str, str]:
    with pytest.raises(SpecError) as exc:
        Workspace.checked(root, **{**FLOW, **names})
    [problem] = exc.value.problems
    return problem.path, problem.message


@pytest.mark.parametrize(("place", "says"), [
    ("nope", "does not exist"), ("a-file", "is a file, not a directory"),
    ("empty", "is not a workspace (no file {empty}/deployments/sites.yaml)"),
])
def test_a_given_root_that_is_no_workspace_is_named_by_the_callers_name_with_the_fix(places, place, says):
    where, message = refusal(str(places[place]))
    assert where == "workspace"
    assert message.startswith(f"{places[place]} ") and says.format(**places) in message and message.endswith("; FIX")


def test_a_workspace_is_returned_and_nothing_is_created(places):
    ws = Workspace.checked(str(places["ws"]), **FLOW)
    assert ws.root == places["ws"].resolve() and not ws.state_dir.exists()


def test_empty_means_hybridtrain_home_and_a_wrong_one_is_named(places, monkeypatch):
    monkeypatch.setenv("HYBRIDTRAIN_HOME", str(places["nope"]))
    for empty in (None, ""):
        where, message = refusal(empty)
        assert where == "HYBRIDTRAIN_HOME" and "does not exist" in message and message.endswith("; ENV-FIX")
    monkeypatch.setenv("HYBRIDTRAIN_HOME", str(places["ws"]))
    assert Workspace.checked("", **FLOW).root == places["ws"].resolve()


def test_neither_given_nor_set_names_the_current_directory_with_the_unset_fix(places):
    where, message = refusal("")
    assert where == "workspace"
    assert message == (f"the current directory {places['empty'].resolve()} is not a workspace (no "
                       "deployments/sites.yaml); UNSET-FIX")


def test_a_sites_file_setting_that_names_no_file_is_named(places, monkeypatch):
    monkeypatch.setenv("HYBRIDTRAIN_SITES_FILE", str(places["nope"] / "sites.yaml"))
    assert refusal(str(places["ws"]))[0] == "HYBRIDTRAIN_SITES_FILE"


def test_the_cli_and_the_flows_share_the_check_each_naming_its_own_setting(places, monkeypatch):
    from hybridtrain.cli.options import OptionError, checked_workspace
    from orchestration.context import checked_workspace as flow_workspace

    with pytest.raises(OptionError) as cli:
        checked_workspace(places["nope"])
    assert str(cli.value) == (f"--home: {places['nope']} does not exist ({places['nope']}); give the workspace root, "
                              "the folder holding deployments/sites.yaml")
    with pytest.raises(OptionError) as cli:
        checked_workspace(None)
    assert str(cli.value).endswith("run from the workspace root or pass --home ROOT")

    monkeypatch.setenv("HYBRIDTRAIN_HOME", str(places["ws"]))
    with pytest.raises(SpecError) as flow:
        flow_workspace(str(places["nope"]))
    [problem] = flow.value.problems
    assert str(problem) == (f"workspace: {places['nope']} does not exist ({places['nope']}); give the workspace root, "
                            "the folder holding deployments/sites.yaml, or leave it empty to use HYBRIDTRAIN_HOME "
                            f"({places['ws']})")
    with pytest.raises(SpecError) as flow:
        flow_workspace("/etc")
    assert "workspace: /etc is not a workspace (no file /etc/deployments/sites.yaml)" in str(flow.value)
    assert flow_workspace("").root == places["ws"].resolve()
