"""The sweep flow on a real Prefect server, MLflow and DVC: trials as subflow runs, real Optuna storage, real pruning.

One sweep of 4 trials, one at a time, with the trials' values enqueued in the study beforehand (as
``study.enqueue_trial`` lets a user seed a sweep), so each trial's fate is known whatever the timing: two good
ones complete, one whose values the model refuses (a dropout of 1.5, enqueued by hand outside the sweep's
range) fails without stopping the sweep, and one with a learning rate too small to learn in an epoch is pruned
by the median pruner early. The best goes through the gates. (Trials side by
side: ``tests/unit/test_sweep_slots.py`` and, in two pools, ``tests/integration/test_sweep_pools.py``; with
two slots here, trials 2 and 3 ran together in CI and 3 finished before the pruner had its two trials.)
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow

SWEEP = {
    "n_trials": 4, "parallelism": 1, "study_name": "flow-sweep",
    "sampler": {"name": "random", "seed": 3},
    "pruner": {"name": "median", "warmup_epochs": 1, "startup_trials": 2},
    "parameters": {"learning_rate": {"type": "float", "low": 1e-6, "high": 0.1, "log": True},
                   "dropout": {"type": "float", "low": 0.0, "high": 0.5}},
}
# One at a time: the pruner starts after two finished trials (0 and 1, the failed 2 does not count), so
# neither good trial can be pruned, and trial 3, far behind both, is pruned at its first report after warm-up.
# The sweep asks a trial when one ends, and a ready trial may take a free slot before an earlier-asked one that
# is still getting ready: trial 3 is asked only once both good trials have ended, so it always meets the pruner
# with two finished trials. (With the failed trial second, trials 2 and 3 were asked 40 ms apart and 3 once
# trained first, with one finished trial, and completed.)
ENQUEUED = [
    {"learning_rate": 0.01, "dropout": 0.1},       # 0: completes
    {"learning_rate": 0.003, "dropout": 0.0},      # 1: completes
    {"learning_rate": 0.01, "dropout": 1.5},       # 2: the model refuses it -> failed
    {"learning_rate": 1e-6, "dropout": 0.4},       # 3: pruned early
]


@pytest.fixture(scope="module")
def root(prefect_server, pseudonym_key, tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("sweep") / "ws", rows=3000)


def test_sweep_runs_trials_as_subflows_prunes_survives_a_failure_and_promotes_the_best(root):
    import optuna
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.sweep import sweep
    from hybridtrain.specs.sweep import SweepSpec
    from hybridtrain.sweeps.study import SweepStudy, storage_url
    from hybridtrain.workspace import Workspace

    spec = spec_writer(root)("sweep", sweep=SWEEP, model__epochs=3, model__threads=1)
    ws = Workspace.resolve(root)
    url = storage_url(ws)
    study = SweepStudy.open(url, "flow-sweep", SweepSpec.model_validate(SWEEP)).study
    for params in ENQUEUED:
        study.enqueue_trial(params)

    started = datetime.now(UTC)  # other test files on this worker may have run sweeps on the same server
    summary = sweep(spec_path=str(spec), workspace=str(root), dispatch="inline")

    states = {r.trial: r.state for r in summary.trials}
    assert states[2] == "failed" and states[0] == "complete" and states[1] == "complete", summary.trials
    assert states[3] == "pruned"
    pruned = next(r for r in summary.trials if r.trial == 3)
    assert pruned.epochs < 3  # stopped early, not after its 3 epochs
    assert summary.best_trial in (0, 1) and summary.best_value > 0.6
    failed = next(r for r in summary.trials if r.trial == 2)
    assert "model.dropout" in failed.message and failed.epochs == 0
    assert summary.trial_epochs == 3 + 3 + pruned.epochs
    # The study in the workspace's SQLite file says the same.
    stored = optuna.load_study(study_name="flow-sweep", storage=url)
    assert sorted(t.state.name for t in stored.trials) == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]
    assert stored.best_trial.number == summary.best_trial
    [reported] = [t.intermediate_values for t in stored.trials if t.number == 3]
    assert sorted(reported) == list(range(1, pruned.epochs + 1))
    assert reported[pruned.epochs] == pytest.approx(pruned.value)

    # One parent flow run, a subflow run per trial attempt under it, and the table artifact.
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if r.created and r.created >= started]
        flows = {f.id: f.name for f in client.read_flows()}
        parent = next(r for r in runs if flows[r.flow_id] == "hyperparameter-sweep")
        trials = [r for r in runs if flows[r.flow_id] == "sweep-trial"]
        assert len(trials) == 4 and all(r.parent_task_run_id is not None for r in trials)
        parents = {client.read_task_run(r.parent_task_run_id).flow_run_id for r in trials}
        assert parents == {parent.id}
        assert sorted(r.state.type.value for r in trials) == ["COMPLETED", "COMPLETED", "COMPLETED", "FAILED"]
        table = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sweep-churn"])))
        assert len(table) == 1 and table[0].flow_run_id == parent.id
        rows = table[0].data
        note = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sweep-churn-summary"])))[0].data
    assert "sweep/optimization_history.png" in note and "sweep/param_importances.png" in note  # links to MLflow
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert [r["state"] for r in rows] == ["complete", "complete", "failed", "pruned"]
    assert {"trial", "params", "metric", "state", "site", "capacity class", "cost (USD)"} <= set(rows[0])

    # The best went through the gates; the plots are in MLflow; every trial's cost is in the version's ledger.
    assert summary.model_version is not None and set(summary.gates) >= {"lineage", "cost", "not_worse"}
    from hybridtrain.tracking.model_registry import Registry

    registry = Registry(ws.tracking_uri)
    names = {f.path for f in registry.client.list_artifacts(summary.mlflow_run_id, "sweep")}
    assert {"sweep/optimization_history.png", "sweep/param_importances.png", "sweep/trials.json"} <= names
    record = json.loads(registry.read_text(summary.mlflow_run_id, "ledger/run_record.json"))
    assert len(record["attempts"]) == 4  # every trial's attempt, the failed one as wasted
    assert [a["outcome"] for a in record["attempts"]].count("failed") == 1
    # The trials that ended, the pruned one too, are the history the next sweep's trials are planned with.
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec
    from hybridtrain.sweeps.plan import trial_job

    trained = stages.past_run_hours(ws, trial_job(load_spec(spec).name))
    assert len(trained) == 3 and all(h > 0 for h in trained)
    # Each trial's MLflow run names its attempt's flow run, as a lifecycle's does: the stale-run reaper ends it
    # KILLED if that process dies (it had no such tag and stayed RUNNING).
    trial_runs = registry.client.search_runs([registry.client.get_experiment_by_name(ws.experiment).experiment_id],
                                             filter_string="tags.`hybridtrain.sweep` = 'flow-sweep'")
    tagged = {r.data.tags["hybridtrain.sweep.trial"]: r.data.tags.get("hybridtrain.prefect_flow_run_id")
              for r in trial_runs if "hybridtrain.sweep.trial" in r.data.tags}
    attempts = {r.name.split("-")[1]: str(r.id) for r in trials}  # trial-<n>-attempt-1-at-<site>
    assert tagged == {n: attempts[n] for n in ("0", "1", "3")}  # trial 2's values are refused before its run opens
