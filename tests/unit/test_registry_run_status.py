"""Logging a dataset or a model into a run leaves the run's status alone: a lifecycle run is RUNNING until it is ended,
so if its process dies the stale-run reaper (which ends RUNNING runs KILLED) finds it."""

from __future__ import annotations

import mlflow
import pytest

from hybridtrain.tracking.model_registry import Registry
from tests.fixtures.record_models import fitted


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "artifacts")


def log_dataset(registry: Registry, run_id: str, tmp_path) -> None:
    registry.log_dataset(run_id, name="churn-approved", digest="0" * 32, source=str(tmp_path), context="training",
                         tags={"dvc.tier": "approved"})


def test_a_running_run_stays_running_after_a_dataset_and_a_model_are_logged_into_it(registry, tmp_path):
    run_id = registry.start_run("status-tests", "lifecycle", {"hybridtrain.job": "churn"})
    log_dataset(registry, run_id, tmp_path)
    assert registry.run_status(run_id) == "RUNNING"
    assert registry.client.get_run(run_id).info.end_time is None
    net, feat, columns = fitted()
    ref = registry.log_model(run_id, net, feat.to_dict(), feat.n_features, columns=columns)
    assert registry.run_status(run_id) == "RUNNING"
    run = registry.client.get_run(run_id)
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["churn-approved"]
    assert [o.model_id for o in run.outputs.model_outputs] == [ref.model_id]  # the model is the run's output
    assert registry.client.get_logged_model(ref.model_id).experiment_id == run.info.experiment_id
    assert mlflow.active_run() is None  # nothing is left attached to this thread
    registry.end_run(run_id)
    assert registry.run_status(run_id) == "FINISHED"


def test_logging_into_an_ended_run_does_not_reopen_it(registry, tmp_path):
    run_id = registry.start_run("status-tests", "killed", {"hybridtrain.job": "churn"})
    registry.end_run(run_id, "KILLED")
    ended = registry.client.get_run(run_id).info.end_time
    log_dataset(registry, run_id, tmp_path)
    info = registry.client.get_run(run_id).info
    assert (info.status, info.end_time) == ("KILLED", ended)
