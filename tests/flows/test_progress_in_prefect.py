"""The core's progress events in Prefect: lines in the run's log and a progress artifact that follows training."""

from __future__ import annotations

import time

import pytest


def test_progress_events_reach_the_run_log_and_the_progress_artifact(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId

    from hybridtrain.reporting import progress
    from orchestration.progress import bind_progress

    @flow(name="progress-probe")
    def probe() -> str:
        from prefect import runtime

        bind_progress()
        shown = progress.TrainingProgress("cloud-eu", epochs=2, rows=100)
        shown.start()
        shown.epoch(0, {"train_loss": 0.7, "val_auc": 0.6})
        shown.epoch(1, {"train_loss": 0.5, "val_auc": 0.8})
        return str(runtime.flow_run.id)

    run_id = probe()
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:  # the run logger sends its lines in the background, in batches
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            if any("epoch 2/2" in log.message for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["train-progress"])))
    messages = [log.message for log in logs]
    assert "train started at cloud-eu: 2 epochs, 100 rows" in messages
    assert sum(m.startswith("train epoch") for m in messages) == 2, messages  # each once, not twice
    mine = [a for a in artifacts if str(a.flow_run_id) == run_id]
    assert [a.type for a in mine] == ["progress"]
    assert mine[0].data == pytest.approx(100.0)
