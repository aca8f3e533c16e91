"""hybridtrain drill: bad options and a missing or broken sites catalog are refused in one message, before anything is made.

The drill itself runs in tests/integration/test_drill.py; these tests stop it before it trains.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridtrain.drill import environment
from hybridtrain.drill.runner import run_drill
from hybridtrain.errors import SpecError
from hybridtrain.workspace import Workspace
from orchestration.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch):
    # Commands set Prefect/DVC defaults in os.environ for their process; keep them out of other tests.
    monkeypatch.setattr(os, "environ", os.environ.copy())


def tree(root: Path) -> set[str]:
    """Every path under ``root`` but the git repo's own, relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.relative_to(root).parts}


def one_line(text: str) -> str:
    return " ".join(text.split())  # the console may wrap a long path


def test_an_out_that_is_a_file_is_refused_and_the_file_kept(workspace):
    target = workspace / "notes.txt"
    target.write_text("keep me\n")
    before = tree(workspace)
    result = runner.invoke(app, ["drill", "--out", str(target), "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, FileExistsError)
    text = one_line(result.output)
    assert f"--out: {target} is a file, not a directory" in text and "leave out --out" in text
    assert target.read_text() == "keep me\n"
    assert tree(workspace) == before  # no .hybridtrain/drills, no .hybridtrain at all


def test_an_out_under_a_file_is_refused(workspace):
    (workspace / "notes.txt").write_text("keep me\n")
    result = runner.invoke(app, ["drill", "--out", "notes.txt/report", "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    assert f"--out: {workspace / 'notes.txt'} (in notes.txt/report) is a file" in one_line(result.output)
    assert not (workspace / ".hybridtrain").exists()


@pytest.mark.parametrize("catalog", [None, "sites: [\n"], ids=["missing", "broken"])
def test_a_missing_or_broken_sites_catalog_leaves_nothing_behind(workspace, catalog):
    sites = workspace / "deployments" / "sites.yaml"
    if catalog is None:
        sites.unlink()
    else:
        sites.write_text(catalog)
    before = tree(workspace)
    result = runner.invoke(app, ["drill", "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    assert str(sites) in one_line(result.output)
    assert tree(workspace) == before
    assert not (workspace / ".hybridtrain").exists()


def test_every_bad_option_is_named_in_one_pass(workspace):
    (workspace / "notes.txt").write_text("")
    result = runner.invoke(app, ["drill", "--scenario", "bogus", "--steps", "-1", "--interval", "1",
                                 "--out", "notes.txt", "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    text = one_line(result.output)
    assert "4 problems found" in text
    for option in ("--scenario: unknown drill scenario 'bogus'", "--steps: -1 is too few",
                   "--interval: must be at least 2 steps, got 1", "--out:"):
        assert option in text
    assert "Traceback" not in result.output and not (workspace / ".hybridtrain").exists()


def test_bad_options_and_a_missing_catalog_are_reported_together(tmp_path):
    result = runner.invoke(app, ["drill", "--scenario", "bogus", "--steps", "-1", "--home", str(tmp_path)])
    assert result.exit_code == 2, result.output
    text = one_line(result.output)
    assert "3 problems found" in text and "--scenario" in text and "--steps" in text
    assert f"{tmp_path / 'deployments' / 'sites.yaml'}: file not found" in text
    assert list(tmp_path.iterdir()) == []


def test_a_drill_that_fails_before_its_report_removes_the_directories_it_made(workspace, monkeypatch):
    def broken_prepare(self):
        raise RuntimeError("DVC push failed")

    monkeypatch.setattr(environment.DrillEnv, "prepare", broken_prepare)
    ws = Workspace.resolve(workspace)
    before = tree(workspace)
    with pytest.raises(RuntimeError) as raised:
        run_drill(ws, ["kill-9"], out=Path("reports/drill-1"), record=False)
    assert "DVC push failed" in str(raised.value)
    assert tree(workspace) == before  # neither reports/ nor .hybridtrain/drills/ (nor its scratch)

    (workspace / "mine").mkdir()  # an --out that existed before the drill is the user's: kept
    with pytest.raises(RuntimeError):
        run_drill(ws, ["kill-9"], out=workspace / "mine", record=False)
    assert (workspace / "mine").is_dir()
    assert tree(workspace) == before | {"mine"}


def test_run_drill_refuses_before_making_anything(workspace):
    (workspace / "notes.txt").write_text("")
    with pytest.raises(SpecError) as raised:
        run_drill(Workspace.resolve(workspace), ["bogus"], steps=10, out=workspace / "notes.txt", record=False)
    assert [p.path for p in raised.value.problems] == ["--scenario", "--steps", "--out"]
    assert not (workspace / ".hybridtrain").exists()
