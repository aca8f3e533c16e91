"""CodeSource: `hybridtrain deploy --code-repo` gives each pool's deployments pull steps that clone the deployed commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from deployments.code_source import CodeSource
from hybridtrain.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
POOLS = ["cloud", "onprem"]


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "c"], check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return repo, sha


def test_each_pool_clones_the_deployed_commit(checkout):
    repo, sha = checkout
    code = CodeSource.parse(["cloud=https://git.example/ml.git"], POOLS, repo)
    config = code.apply(yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text()))
    by_pool = {}
    for dep in config["deployments"]:
        by_pool.setdefault(dep["work_pool"]["name"], []).append(dep)
    for dep in by_pool["cloud"]:
        assert dep["pull"] == [
            {"prefect.deployments.steps.git_clone": {"repository": "https://git.example/ml.git", "commit_sha": sha}}]
        assert "HYBRIDTRAIN_HOME" not in dep["work_pool"]["job_variables"]["env"]  # the worker's own applies
    for dep in by_pool["onprem"]:  # no repository for this pool: it keeps the shared checkout
        assert "pull" not in dep and dep["work_pool"]["job_variables"]["env"]["HYBRIDTRAIN_HOME"]
    assert config["pull"][0]["prefect.deployments.steps.set_working_directory"]


def test_a_bare_url_serves_every_pool(checkout):
    repo, sha = checkout
    code = CodeSource.parse(["file:///srv/git/ml.git"], POOLS, repo)
    assert code.repositories == {"cloud": "file:///srv/git/ml.git", "onprem": "file:///srv/git/ml.git"}
    assert code.commit == sha
    assert CodeSource.parse([], POOLS, repo) is None


@pytest.mark.parametrize(("items", "ref", "message"), [
    (["gpu=https://git.example/ml.git"], "HEAD", "pool 'gpu' is not in the sites catalog (pools: cloud, onprem)"),
    (["cloud="], "HEAD", "'cloud=' has no repository URL"),
    (["https://git.example/ml.git"], "no-such-branch", "'no-such-branch' is not a commit of a git checkout"),
])
def test_bad_input_names_the_option_and_the_fix(checkout, items, ref, message):
    with pytest.raises(SpecError) as exc:
        CodeSource.parse(items, POOLS, checkout[0], ref)
    assert message in str(exc.value)
