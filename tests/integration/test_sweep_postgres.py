"""Sweep storage on the served stack's database: a real PostgreSQL server (Debian's postgresql) on loopback.

The study is opened from ``HYBRIDTRAIN_SWEEP_STORAGE=postgresql://…`` (psycopg 3) by the sweep's
parent, a trial reports its epochs through a second connection as a worker elsewhere would, and the
median pruner stops a trial that is behind; a wrong URL is one clear error naming the setting.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hybridtrain.errors import SpecError
from hybridtrain.specs.sweep import SweepSpec
from tests.fixtures.postgres import free_port, postgres_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with postgres_cluster() as url:
        yield url


def test_study_on_postgresql_from_the_setting_with_pruning(postgres, tmp_path, monkeypatch):
    from hybridtrain.sweeps.study import SweepStudy, TrialPruned, open_for_trial, storage_url
    from hybridtrain.workspace import Workspace

    monkeypatch.setenv("HYBRIDTRAIN_SWEEP_STORAGE", postgres)
    url = storage_url(Workspace.resolve(tmp_path))
    assert url.startswith("postgresql+psycopg://")
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
                                      "pruner": {"startup_trials": 1, "warmup_epochs": 1}})
    study = SweepStudy.open(url, "pg-sweep", sweep)
    first = study.ask()
    reporter = open_for_trial(url, "pg-sweep", sweep).reporter(first)
    reporter(0, {"val_auc": 0.8})
    reporter(1, {"val_auc": 0.85})
    study.tell(first, "complete", 0.85)
    second = study.ask()
    with pytest.raises(TrialPruned):
        open_for_trial(url, "pg-sweep", sweep).reporter(second)(0, {"val_auc": 0.7})
    study.tell(second, "pruned")
    assert SweepStudy.open(url, "pg-sweep", sweep).counts() == {"complete": 1, "pruned": 1}
    assert not (tmp_path / ".hybridtrain").exists()  # nothing went to the SQLite default


def test_a_killed_sweeps_trial_fails_and_runs_again_on_postgresql(postgres, tmp_path):
    # The heartbeats are the database's clock on both sides (PostgreSQL's now(), a timestamp column): no time zone
    # or host clock can make a live trial look stale or a dead one fresh.
    from hybridtrain.sweeps.study import STALE_AFTER_S, SweepStudy, storage_url
    from hybridtrain.workspace import Workspace
    from tests.fixtures.sweep_study import age_heartbeats, killed_parent

    url = storage_url(Workspace.resolve(tmp_path), postgres)
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
                                      "sampler": {"name": "random"}})
    dead = killed_parent(url, "pg-stale", sweep)
    assert SweepStudy.open(url, "pg-stale", sweep).counts() == {"complete": 1, "running": 1}  # not stale yet
    assert age_heartbeats(url, "pg-stale", STALE_AFTER_S + 60) == 2
    resumed = SweepStudy.open(url, "pg-stale", sweep)
    assert resumed.counts() == {"complete": 1, "interrupted": 1, "waiting": 1} and resumed.ended() == 1
    retry = resumed.ask()
    assert (retry.retry_of, retry.params) == (dead["held"], dead["params"])


def test_an_unreachable_database_is_one_clear_error(tmp_path):
    from hybridtrain.sweeps.study import SweepStudy, storage_url
    from hybridtrain.workspace import Workspace

    url = storage_url(Workspace.resolve(tmp_path), f"postgresql://u:secret@127.0.0.1:{free_port()}/nope")
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}}})
    with pytest.raises(SpecError) as info:
        SweepStudy.open(url, "s", sweep)
    text = str(info.value)
    assert "HYBRIDTRAIN_SWEEP_STORAGE" in text and "cannot open the study database" in text
    assert "secret" not in text  # the password is not echoed
