"""Sample-data commands (``data generate``, ``split-sites``): a mistaken option, ``--pin`` target or ``--home`` is
one line naming it, exit status 2, no traceback — refused before any data, DVC state, commit, push or directory
is made, and the file named by ``--pin`` is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.main import app
from tests.fixtures.workspaces import ROOT, make_workspace

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch):
    # Commands set Prefect/DVC defaults in os.environ for their process; keep them out of other tests.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name in ("HYBRIDTRAIN_HOME", "HYBRIDTRAIN_SITES_FILE", "HYBRIDTRAIN_POLICY_FILE", "PREFECT_HOME",
                 "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` (the git repo included) and a digest of each file: what a command changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def refused(args: list[str], option: str) -> str:
    """Run the CLI; assert a usage error: exit 2, one stderr line naming ``option``, no traceback. The line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and option in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


# -- split-sites --pin: only a job spec, checked before anything is generated ---------------------------------------


@pytest.mark.parametrize(("pin", "said"), [
    ("deployments/policy.yaml", "is a PlacementPolicy"),
    ("deployments/sites.yaml", "is a SitesCatalog"),
    ("deployments/prefect.yaml", "no apiVersion: hybridtrain/v1"),
    ("jobs/nope.yaml", "no file jobs/nope.yaml"),
    ("jobs", "is a directory"),
    ("jobs/list.yaml", "holds a YAML list"),
    ("jobs/empty.yaml", "file is empty"),
])
def test_split_sites_refuses_a_pin_that_is_not_a_job_spec_before_generating_anything(workspace, pin, said):
    (workspace / "jobs" / "list.yaml").write_text("- apiVersion: hybridtrain/v1\n- kind: TrainingJob\n")
    (workspace / "jobs" / "empty.yaml").write_text("")
    before = tree(workspace)
    line = refused(["split-sites", "--sites", "onprem-dc1,cloud-eu", "--rows", "1000", "--pin", pin,
                    "--home", str(workspace)], "--pin")
    assert said in line and "job spec" in line and pin in line
    assert tree(workspace) == before  # policy.yaml byte-identical; no data/, .dvc/, .dvcignore or .hybridtrain/
    assert (workspace / "deployments" / "policy.yaml").read_bytes() == (ROOT / "deployments/policy.yaml").read_bytes()


# -- data generate --pin -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pin", "said"), [
    ("deployments/sites.yaml", "is a SitesCatalog"),
    ("deployments/policy.yaml", "is a PlacementPolicy"),
    ("jobs/nope.yaml", "no file jobs/nope.yaml"),
    ("jobs", "is a directory"),
    ("jobs/other.yaml", "dataset.path data/raw/other.csv, not data/raw/churn.csv"),
])
def test_data_generate_refuses_a_pin_with_nothing_to_pin_before_generating_anything(workspace, pin, said):
    spec = yaml.safe_load((workspace / "jobs" / "churn.yaml").read_text())
    spec["dataset"]["path"] = "data/raw/other.csv"
    (workspace / "jobs" / "other.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    before = tree(workspace)
    line = refused(["data", "generate", "--rows", "300", "--pin", pin, "--home", str(workspace)], "--pin")
    assert said in line, line
    assert tree(workspace) == before


def test_data_generate_pins_keeping_comments_and_says_when_the_spec_already_pins_it(workspace):
    spec = workspace / "jobs" / "churn.yaml"
    original = spec.read_text()
    first = runner.invoke(app, ["data", "generate", "--rows", "300", "--pin", "jobs/churn.yaml",
                                "--home", str(workspace)])
    assert first.exit_code == 0, first.output
    md5 = (workspace / "data" / "raw" / "churn.csv.dvc").read_text().split("md5: ")[1].split()[0]
    assert f"dataset.md5 set to {md5}" in first.stdout
    changed = [(a, b) for a, b in zip(original.splitlines(), spec.read_text().splitlines(), strict=True) if a != b]
    assert changed == [('  md5: "1b67c909866b3aa7a4ff33213e9b059f"', f'  md5: "{md5}"')]  # comments kept

    pinned = spec.read_bytes()
    again = runner.invoke(app, ["data", "generate", "--rows", "300", "--pin", "jobs/churn.yaml",
                                "--home", str(workspace)])
    assert again.exit_code == 0, again.output
    assert f"already pins {md5}" in again.stdout
    assert spec.read_bytes() == pinned

    # A spec without dataset.md5 gets one (the pinned-version rule): nothing is silently skipped.
    bare = workspace / "jobs" / "bare.yaml"
    bare.write_text("".join(line for line in original.splitlines(keepends=True) if not line.startswith("  md5:")))
    third = runner.invoke(app, ["data", "generate", "--pin", "jobs/bare.yaml", "--home", str(workspace)])
    assert third.exit_code == 0, third.output
    assert yaml.safe_load(bare.read_text())["dataset"]["md5"] == md5


# -- numbers out of range ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "option", "said"), [
    (["data", "generate", "--rows", "0"], "--rows", "between 100 and 10,000,000"),
    (["data", "generate", "--rows", "-5"], "--rows", "got -5"),
    (["data", "generate", "--rows", "99"], "--rows", "between 100"),
    (["data", "generate", "--rows", str(10**20)], "--rows", "held in memory"),
    (["data", "generate", "--seed", "-1"], "--seed", ">= 0"),
    (["split-sites", "--sites", "onprem-dc1", "--rows", "0"], "--rows", "between 100 and 10,000,000"),
    (["split-sites", "--sites", "onprem-dc1", "--rows", "-1"], "--rows", "got -1"),
    (["split-sites", "--sites", "onprem-dc1,cloud-eu", "--rows", "1"], "--rows", "each site's part needs at least 100"),
    (["split-sites", "--sites", "onprem-dc1", "--seed", "-1"], "--seed", ">= 0"),
    (["split-sites", "--sites", ""], "--sites", "at least one site"),
    (["split-sites", "--sites", " , ,"], "--sites", "at least one site"),
    (["split-sites", "--sites", ",".join(f"s{i}" for i in range(13))], "--sites", "at most 12 sites"),
])
def test_numbers_out_of_range_are_one_line_naming_the_option_and_create_nothing(workspace, args, option, said):
    before = tree(workspace)
    line = refused([*args, "--home", str(workspace)], option)
    assert said in line, line
    assert tree(workspace) == before


def test_split_sites_refuses_a_part_too_small_before_writing_it(workspace, monkeypatch):
    # The up-front bound aims three standard deviations above 100 rows a part; were a part still short, the
    # split (made in memory) is refused before any file, DVC state or push.
    monkeypatch.setattr("hybridtrain.datasets.sample_sites.min_rows", lambda n_sites, per_site=100: 100)
    before = tree(workspace)
    line = refused(["split-sites", "--sites", "onprem-dc1,cloud-eu", "--rows", "150", "--home", str(workspace)],
                   "--rows")
    assert "cloud-eu only" in line and "use --rows" in line
    assert tree(workspace) == before


def test_split_sites_pins_a_job_spec_to_the_parts(workspace):
    result = runner.invoke(app, ["split-sites", "--sites", "onprem-dc1,cloud-eu", "--rows", "1000",
                                 "--pin", "jobs/churn.yaml", "--home", str(workspace)])
    assert result.exit_code == 0, result.output
    dataset = yaml.safe_load((workspace / "jobs" / "churn.yaml").read_text())["dataset"]
    assert dataset["path"] == "data/raw/churn-onprem-dc1.csv"
    assert [p["site"] for p in dataset["sites"]] == ["cloud-eu"]
    for rel in ("data/raw/churn-onprem-dc1.csv", "data/raw/churn-cloud-eu.csv"):
        assert len((workspace / rel).read_text().splitlines()) > 100  # a header and at least 100 rows


# -- --home ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["data", "generate"], ["split-sites", "--sites", "onprem-dc1"]])
def test_a_home_that_is_a_file_a_typo_or_no_workspace_is_refused_leaving_nothing(tmp_path, command):
    a_file = tmp_path / "afile"
    a_file.write_text("not a workspace\n")
    assert "is a file" in refused([*command, "--home", str(a_file)], "--home")

    typo = tmp_path / "nohome"
    assert "does not exist" in refused([*command, "--home", str(typo)], "--home")
    assert not typo.exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "not a workspace" in refused([*command, "--home", str(empty)], "--home")
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("command", [["data", "generate"], ["demo"]])
def test_a_bad_rows_as_a_user_runs_it_leaves_a_workspace_untouched(tmp_path, command):
    root = make_workspace(tmp_path / "ws")
    before = tree(root)
    out = subprocess.run([sys.executable, "-m", "orchestration.cli", *command, "--rows", "0"],
                         cwd=root, capture_output=True, text=True, timeout=120, check=False,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDTRAIN_", "PREFECT_"))})
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "--rows" in out.stderr
    assert "Traceback" not in out.stderr
    assert tree(root) == before


# -- docs ------------------------------------------------------------------------------------------------------------


def test_readme_shows_split_sites_as_the_command_it_is():
    readme = (ROOT / "README.md").read_text()
    assert "hybridtrain data split-sites" not in readme
    assert "hybridtrain split-sites --sites" in readme
    assert runner.invoke(app, ["split-sites", "--help"]).exit_code == 0
    assert runner.invoke(app, ["data", "split-sites", "--help"]).exit_code != 0
