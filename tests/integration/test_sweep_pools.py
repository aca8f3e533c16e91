"""A sweep across two work pools with real process workers: trials run in the pool of their placed site, and a preempted trial resumes.

The parent flow runs here and sends each trial to ``sweep-trial/<pool>`` (deployed from
``deployments/prefect.yaml``, and only that flow: the data preparation and sync, which have no
deployment here, run in the parent as ``dispatch: auto`` does); a process worker per pool runs it.
Trial 0 is slow (many epochs): once it has written a checkpoint, its flow-run process gets SIGTERM
— a spot notice. The step ends, a checkpoint is written, the attempt is recorded as preempted, the
trial is placed again and resumes from that checkpoint in a new subflow run, and completes; the
other trial is not disturbed.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import start_worker, wait_for_workers, wait_until
from tests.fixtures.workspaces import ROOT, build_workspace, checkpoint_steps, spec_writer

# Worker start-up and cold flow-run processes take minutes on a loaded 2-core VM.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
WAIT_S = 600.0  # the sweep's data preparation and each cold flow-run process come first; slow on a loaded VM

SWEEP = {
    "n_trials": 2, "parallelism": 2, "study_name": "pool-sweep", "sampler": {"name": "random", "seed": 5},
    "pruner": {"name": "none"},
    "parameters": {"learning_rate": {"type": "float", "low": 1e-4, "high": 3e-2, "log": True},
                   "epochs": {"type": "int", "low": 2, "high": 100}},
}


def write_deployments(root: Path) -> None:
    """The sweep-trial deployments of both pools and nothing else: a short `prefect deploy`, and no scheduled
    flows (the burst controller every 2 min) starting runs beside the sweep's."""
    path = root / "deployments" / "prefect.yaml"
    data = yaml.safe_load(path.read_text())
    data["deployments"] = [d for d in data["deployments"] if d["entrypoint"] == "flows/sweep.py:sweep_trial"]
    assert {d["work_pool"]["name"] for d in data["deployments"]} == {"onprem", "cloud"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def drop_data_stage_deployments() -> None:
    """Delete the data stages' deployments that earlier test files left on this session's Prefect server.

    With ``dispatch="auto"`` a stage goes to its pool when its deployment exists; those deployments
    point at another test's workspace, so here the data stages must run in the sweep's own process."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for name in ("prepare-data/onprem", "prepare-data/cloud", "sync-data/onprem", "sync-data/cloud"):
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except ObjectNotFound:
                pass


@pytest.fixture(scope="module")
def pools(prefect_server, pseudonym_key, tmp_path_factory):
    from deployments.bootstrap import bootstrap

    base = tmp_path_factory.mktemp("sweep-pools")
    root = build_workspace(base / "ws", rows=3000)
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    write_deployments(root)
    bootstrap(Workspace.resolve(root))
    drop_data_stage_deployments()
    logs = [base / "worker-onprem.log", base / "worker-cloud.log"]
    procs = [start_worker("onprem", root, prefect_server, logs[0]), start_worker("cloud", root, prefect_server, logs[1])]
    try:
        wait_for_workers(["onprem", "cloud"], procs, logs)
        yield root, logs
    finally:
        stop_with_children(*procs)


def running_trial_pid(number: int) -> int | None:
    """The process of trial ``number``'s first attempt, once its worker started it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    # Filtered by name on the server: earlier test files ran many flow runs on this session's server.
    name = FlowRunFilterName(like_=f"trial-{number}-attempt-1-")
    with get_client(sync_client=True) as client:
        for fr in client.read_flow_runs(flow_run_filter=FlowRunFilter(name=name)):
            if fr.name.startswith(f"trial-{number}-attempt-1-") and fr.state and fr.state.is_running() \
                    and fr.infrastructure_pid:
                return int(str(fr.infrastructure_pid).rsplit(":", 1)[-1])
    return None


def test_trials_run_in_their_pools_and_a_preempted_trial_resumes(pools):
    import threading

    from prefect.client.orchestration import get_client

    from flows.sweep import sweep
    from hybridtrain.specs.sweep import SweepSpec
    from hybridtrain.sweeps.study import SweepStudy, storage_url

    root, logs = pools
    # The test spec pins placement to cloud-eu: every trial runs in the cloud pool, its data synced there once.
    spec = spec_writer(root)("pool-sweep", sweep=SWEEP, model__threads=1, checkpoint__interval_steps=10)
    study = SweepStudy.open(storage_url(Workspace.resolve(root)), "pool-sweep", SweepSpec.model_validate(SWEEP)).study
    study.enqueue_trial({"learning_rate": 0.003, "epochs": 80})  # 0: long enough to be preempted mid-run
    study.enqueue_trial({"learning_rate": 0.01, "epochs": 2})

    out: dict = {}
    started = datetime.now(UTC)  # earlier test files in this session ran sweep trials on the same server
    # auto: the trials go to their pools (their deployments exist), the data stages run here (theirs do not).
    runner = threading.Thread(target=lambda: out.update(summary=sweep(
        spec_path=str(spec), workspace=str(root), dispatch="auto", promote_best=False)), daemon=True)
    runner.start()
    key = "pool-sweep-t0"
    # Its process first (each look asks the server; the flow run is RUNNING before training starts), then the notice
    # the moment its first checkpoint is there: on a loaded VM the trial trains to the end in ~20 s after it.
    pid = wait_until(lambda: running_trial_pid(0) or (not runner.is_alive() and -1), "trial 0's process",
                     timeout=WAIT_S, every=0.5)
    assert runner.is_alive() and pid > 0, "the sweep ended before trial 0 could be preempted"
    wait_until(lambda: checkpoint_steps(root, "*", "churn", key) or not runner.is_alive(), "trial 0's first checkpoint",
               timeout=WAIT_S, every=0.05)
    assert runner.is_alive(), "the sweep ended before trial 0 could be preempted"
    os.kill(pid, signal.SIGTERM)
    runner.join(timeout=WAIT_S)
    assert not runner.is_alive(), "the sweep did not finish: " + " | ".join(p.read_text()[-2000:] for p in logs)
    summary = out["summary"]

    rows = {r.trial: r for r in summary.trials}
    assert [rows[n].state for n in range(2)] == ["complete", "complete"]
    assert [a.outcome.value for a in rows[1].attempts] == ["succeeded"]
    resumed = rows[0]
    assert [a.outcome.value for a in resumed.attempts] == ["preempted", "succeeded"]
    assert resumed.epochs == 80
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        trial_runs = [fr for fr in client.read_flow_runs()
                      if flows[fr.flow_id] == "sweep-trial" and fr.created and fr.created >= started]
        names = sorted(fr.name.rsplit("-at-", 1)[0] for fr in trial_runs)
        assert names == ["trial-0-attempt-1", "trial-0-attempt-2", "trial-1-attempt-1"]
        assert {fr.work_pool_name for fr in trial_runs} == {"cloud"}  # the pool of cloud-eu, where the spec pins them
        assert all(fr.parent_task_run_id is not None for fr in trial_runs)  # subflow runs of the sweep
    from hybridtrain.stages import load_result
    from hybridtrain.sweeps.trial import TrialOutcome

    final = load_result(Workspace.resolve(root), summary.mlflow_run_id, "sweep-trial-0-attempt-2", TrialOutcome)
    assert final.trained is not None and final.trained.resumed_from_step is not None
    assert final.trained.resumed_from_step > 0  # from the checkpoint written on the notice, not from scratch
