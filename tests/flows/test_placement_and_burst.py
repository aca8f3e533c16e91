"""Placement from live Prefect state and the burst controller, on a real server with real queued runs.

The on-prem pool is filled with real flow runs of its train-stage deployment (running ones holding
all 8 GPUs, waiting ones behind them); no worker picks them up, so the queue is exactly as made.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hybridtrain.workspace import Workspace
from tests.fixtures.workspaces import ROOT, build_workspace, spec_writer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(prefect_server, pseudonym_key, tmp_path_factory):
    from deployments.bootstrap import bootstrap
    from flows.data import prepare_data
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec

    root = build_workspace(tmp_path_factory.mktemp("burst") / "ws")
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    ws = Workspace.resolve(root)
    bootstrap(ws)
    write = spec_writer(root)
    base = {"placement__site": None, "budget_usd": 500}
    specs = {
        "new": load_spec(write("new", **base, deadline="2h", resources__gpus=4, resources__max_hours=1)),
        "filler": load_spec(write("filler", **base, deadline="3h", resources__gpus=4, resources__max_hours=4)),
        "restricted": load_spec(write("restricted", **base, deadline="3h", resources__gpus=4,
                                      resources__max_hours=4, data_policy__sensitivity="restricted")),
    }
    run_id = stages.open_run(ws, specs["filler"], None)
    prepared = prepare_data(spec=specs["filler"], run_id=run_id, workspace=str(root))
    return {"ws": ws, "specs": specs, "approved": prepared.anon.approved, "run_id": run_id}


def make_run(env, spec_name: str, *, running: bool, minutes_ago: int = 5, deployment: str = "train-stage/onprem",
             spec=None, tags=None, **extra):
    from prefect.client.orchestration import get_client
    from prefect.states import Running, Scheduled

    spec = spec or env["specs"][spec_name]
    params = {"spec": spec.to_dict(), "approved": env["approved"].model_dump(mode="json"), "site": "onprem-dc1",
              "run_id": env["run_id"], "run_key": f"{spec_name}-{minutes_ago}"}
    if deployment != "train-stage/onprem":  # a sweep's trial or a federated site's round: their own parameters
        params = {"spec": params["spec"], "site": "onprem-dc1", **extra}
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        when = datetime.now(UTC) - timedelta(minutes=minutes_ago)
        fr = client.create_flow_run_from_deployment(dep.id, parameters=params, state=Scheduled(scheduled_time=when),
                                                    tags=tags)
        if running:
            client.set_flow_run_state(fr.id, Running(), force=True)
    return str(fr.id)


@pytest.fixture
def filled_pool(env):
    from prefect.client.orchestration import get_client

    ids = [make_run(env, "filler", running=True, minutes_ago=30 + i) for i in range(2)]  # 8 of 8 GPUs busy
    yield ids
    with get_client(sync_client=True) as client:
        for fr in client.read_flow_runs():
            client.delete_flow_run(fr.id)


def decide(env):
    from hybridtrain import stages
    from orchestration.queues import PrefectQueues

    now = datetime.now(UTC)
    queues = PrefectQueues(env["ws"].load_sites()).snapshot(now)
    return stages.place(env["ws"], env["specs"]["new"], env["approved"].size, queues, now), queues


def test_idle_onprem_pool_keeps_the_job_home(env):
    outcome, queues = decide(env)
    assert queues["onprem-dc1"].running == 0 and queues["onprem-dc1"].gpus_in_use == 0
    assert outcome.site == "onprem-dc1" and outcome.meets_deadline and not outcome.needs_sync


def test_filled_onprem_pool_makes_the_next_job_burst(env, filled_pool):
    outcome, queues = decide(env)
    q = queues["onprem-dc1"]
    assert (q.running, q.gpus_in_use) == (2, 8)
    assert (queues["cloud-eu"].running, queues["cloud-eu"].gpus_in_use) == (0, 0)  # one query, runs kept apart by pool
    assert outcome.site == "cloud-eu" and outcome.meets_deadline and outcome.needs_sync
    onprem = next(c for c in outcome.candidates if c["site"] == "onprem-dc1" and c["capacity"] == "fixed")
    assert onprem["meets_deadline"] == "no"  # it was allowed, but the queue would make it late
    assert any("on-prem" in r or "onprem" in r for r in outcome.reasons), outcome.reasons


def test_sweep_trials_federated_rounds_and_every_node_of_a_multi_node_run_count_as_busy_gpus(env, filled_pool):
    """Placement sees the GPUs every kind of training run holds in the pool, not only single-node train runs."""
    from prefect.client.orchestration import get_client

    from flows.federated import federated_round
    from flows.sweep import sweep_trial
    from flows.training import train_stage
    from orchestration.queues import GPU_FLOWS

    assert set(GPU_FLOWS) == {train_stage.name, sweep_trial.name, federated_round.name}
    with get_client(sync_client=True) as client:  # the pool is now all trials and rounds, no train-stage run
        for run in filled_pool:
            client.delete_flow_run(run)
    filler = env["specs"]["filler"]
    approved = env["approved"].model_dump(mode="json")
    make_run(env, "filler", running=True, deployment="sweep-trial/onprem", approved=approved,
             parent_run_id=env["run_id"], storage="sqlite:///unused.db", study="s",
             ticket={"number": 0, "trial_id": 1, "params": {}})
    make_run(env, "filler", running=True, deployment="federated-round/onprem", run_id=env["run_id"], run_key="k",
             rnd=1, approved=approved, featurizer={}, aggregation_site="onprem-dc1", tag="t")
    outcome, queues = decide(env)
    q = queues["onprem-dc1"]
    assert (q.running, q.gpus_in_use) == (2, 8)
    assert outcome.site == "cloud-eu"  # it would wait behind them at home
    with get_client(sync_client=True) as client:
        for fr in client.read_flow_runs():
            client.delete_flow_run(fr.id)
    two_nodes = filler.model_copy(update={"resources": filler.resources.model_copy(update={"gpus": 4, "nodes": 2})})
    make_run(env, "filler", running=True, spec=two_nodes)  # one run, 2 nodes × 4 GPUs
    outcome, queues = decide(env)
    assert (queues["onprem-dc1"].running, queues["onprem-dc1"].gpus_in_use) == (1, 8)
    assert outcome.site == "cloud-eu"


def test_lifecycle_bursts_when_the_onprem_pool_is_full(env, filled_pool):
    from flows.lifecycle import lifecycle

    summary = lifecycle(spec_path="jobs/new.yaml", workspace=str(env["ws"].root), dispatch="inline")
    assert summary.placement["site"] == "cloud-eu"
    assert [s.site for s in summary.stages if s.stage == "train"] == ["cloud-eu"]
    assert summary.sync_route == "onprem-dc1->cloud-eu"
    from hybridtrain.tracking.model_registry import Registry

    tags = Registry(env["ws"].tracking_uri).client.get_run(summary.mlflow_run_id).data.tags
    assert tags["hybridtrain.placement.site"] == "cloud-eu"
    assert tags["hybridtrain.placement.meets_deadline"] == "true"


def test_the_queue_snapshot_reads_each_waiting_runs_place_in_line(env, filled_pool):
    """Runs carry their placement's due time as a tag; the snapshot's backlog keeps it (a run without the tag is
    due after every run that has one), so a new run's wait is computed over the pool's real line."""
    from orchestration.queues import PrefectQueues, decision_tags

    soon = datetime.now(UTC) + timedelta(hours=1)
    make_run(env, "filler", running=False, minutes_ago=10, tags=decision_tags(4.0, "on_demand", soon + timedelta(days=2)))
    make_run(env, "filler", running=False, minutes_ago=9, tags=decision_tags(4.0, "on_demand", soon))
    make_run(env, "filler", running=False, minutes_ago=8)
    backlog = PrefectQueues(env["ws"].load_sites()).snapshot()["onprem-dc1"].backlog
    assert [round(r.due) if r.due != float("inf") else None for r in backlog] == [
        round((soon + timedelta(days=2)).timestamp()), round(soon.timestamp()), None]
    assert [r.hours for r in backlog] == [4.0, 4.0, 4.0]


def test_burst_controller_moves_late_runs_and_holds_data_that_may_not_leave(env, filled_pool):
    from prefect.client.orchestration import get_client

    from flows.burst import burst_controller

    late = make_run(env, "filler", running=False, minutes_ago=10)
    kept_home = make_run(env, "restricted", running=False, minutes_ago=9)
    actions = burst_controller(workspace=str(env["ws"].root), interval_s=60)
    by_run = {a["run"]: a for a in actions if a["run"]}
    assert by_run[late]["action"] == "moved" and by_run[late]["to"] == "cloud-eu"
    assert by_run[kept_home]["action"] == "held"
    with get_client(sync_client=True) as client:
        original = client.read_flow_run(late)
        assert original.state.is_cancelled() and original.state.message.startswith("moved:")
        new_id = original.state.message.removeprefix("moved:").split(":", 1)[0]
        replacement = client.read_flow_run(new_id)
        assert replacement.work_pool_name == "cloud" and replacement.parameters["site"] == "cloud-eu"
        assert client.read_flow_run(kept_home).state.is_scheduled()
    # The data went ahead of the work, and the move is on the job's MLflow run.
    from hybridtrain import stages
    from tasks.burst import Relocation

    moved = stages.find_result(env["ws"], env["run_id"], "relocation", Relocation)
    assert moved.new_run_id == new_id and moved.to_site == "cloud-eu"
    assert moved.transfer.destination == "cloud-eu" and moved.transfer.what.endswith(env["approved"].md5)
