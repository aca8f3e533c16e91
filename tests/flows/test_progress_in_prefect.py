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


def test_sync_progress_reaches_the_run_log_and_ends_its_artifact_at_100(prefect_server, workspace):
    import logging

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId

    from hybridtrain import stages
    from hybridtrain.reporting import progress
    from hybridtrain.stages.site_access import workspace_repo
    from hybridtrain.workspace import Workspace
    from orchestration.progress import bind_progress

    ws = Workspace.resolve(workspace)
    parts = workspace / "data" / "approved" / "probe"
    parts.mkdir(parents=True)
    for i in range(6):
        (parts / f"part-{i}.bin").write_bytes(bytes([i]) * 20_000)
    approved = workspace_repo(ws, ws.load_sites(), "onprem-dc1").add("data/approved/probe", "approved", "onprem-dc1")
    # A sync moves only what prepare-data approved: its record, as prepare-data writes it, and the job's spec.
    stages.audit(ws).append(actor="test", action="tier_promotion", subject="dataset data/approved/probe",
                            inputs={"path": "data/approved/probe", "tier_from": "curated", "tier_to": "approved",
                                    "to_md5": approved.md5, "site": "onprem-dc1"}, outcome=f"approved {approved.md5}")
    from hybridtrain.specs.job import load_spec
    spec = load_spec(workspace / "jobs" / "churn.yaml", ws.load_sites())
    steps: list[progress.ProgressEvent] = []

    class Collect(logging.Handler):
        def emit(self, record):
            event = progress.event_of(record)
            if event is not None and event.stage == "sync" and event.kind == "step":
                steps.append(event)

    @flow(name="sync-progress-probe")
    def probe() -> str:
        from prefect import runtime

        bind_progress()
        stages.sync(ws, approved, "cloud-eu", spec)
        return str(runtime.flow_run.id)

    collect = Collect()
    logging.getLogger(progress.LOGGER).addHandler(collect)
    try:
        run_id = probe()
    finally:
        logging.getLogger(progress.LOGGER).removeHandler(collect)
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:  # the run logger sends its lines in the background, in batches
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            if any(log.message.startswith("sync finished") for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sync-progress"])))
    moved = [e.fields["bytes"] for e in steps]
    total = steps[-1].total
    assert len(moved) >= 4 and moved == sorted(set(moved)), moved  # byte counts as objects arrive, not just the end
    assert moved[0] == 0 and moved[-1] == total and total > 120_000  # six parts and the manifest
    assert steps[-1].fields["files"] == 7
    messages = [log.message for log in logs]
    assert [m for m in messages if m.startswith("sync ") and "files)" in m] == [e.message for e in steps]
    assert any(m.startswith(f"sync finished: {total:,.0f} bytes in 7 files") for m in messages), messages
    mine = [a for a in artifacts if str(a.flow_run_id) == run_id]
    assert [a.type for a in mine] == ["progress"]
    assert mine[0].data == pytest.approx(100.0)


def test_a_slow_artifact_call_holds_up_no_thread_and_the_last_value_still_lands(prefect_server, monkeypatch):
    """While the API takes its time over one progress artifact, other threads reporting progress (a
    sweep's trials) go on at once; the stage's last value is in the artifact when its report returns."""
    import contextvars
    import threading

    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient, get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from hybridtrain.reporting import progress
    from orchestration.progress import bind_progress

    entered, release = threading.Event(), threading.Event()
    create = SyncPrefectClient.create_artifact

    def slow_create(self, artifact):
        entered.set()
        release.wait(60)  # the API answers when the test says so
        return create(self, artifact)

    monkeypatch.setattr(SyncPrefectClient, "create_artifact", slow_create)

    @flow(name="slow-progress-probe")
    def probe() -> tuple[str, float]:
        from prefect import runtime

        bind_progress()
        first = threading.Thread(target=contextvars.copy_context().run,
                                 args=(progress.report, "train", "start", "train started", ), kwargs={"done": 0, "total": 4})
        first.start()
        assert entered.wait(30), "the artifact was never created"
        other_done = threading.Event()

        def other() -> None:
            for step in range(1, 4):
                progress.report("train", "step", f"train step {step}/4", done=step, total=4)
            other_done.set()

        t0 = time.monotonic()
        second = threading.Thread(target=contextvars.copy_context().run, args=(other,))
        second.start()
        went_on = other_done.wait(10)
        waited = time.monotonic() - t0
        release.set()
        first.join(30)
        second.join(30)
        assert went_on, "a thread reporting progress waited for another thread's API call"
        progress.report("train", "end", "train finished", done=4, total=4)
        return str(runtime.flow_run.id), waited

    run_id, waited = probe()
    assert waited < 5
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["train-progress"])))
    mine = [a for a in artifacts if str(a.flow_run_id) == run_id]
    assert [a.type for a in mine] == ["progress"]  # one artifact, created once, then updated
    assert mine[0].data == pytest.approx(100.0)
    assert mine[0].description == "train: train finished"
