"""Federated training through real Prefect workers, one per data site's pool, driven by the CLI in its own process.

Three on-prem data sites (``onprem-dc1`` in pool ``onprem``, ``onprem-dc2`` and ``onprem-dc3`` in
pools of their own), restricted data that may not leave its site (so ``plan`` picks federated),
the aggregator at ``onprem-dc1``, secure aggregation on. One run meets both faults. A site's worker is
killed while its round runs: the round goes on without it (the survivors mask their kept updates again for a
second attempt), records it, and the site rejoins the next round once its worker is back. Then the aggregator (the ``hybridtrain run`` process) is killed while the sites train round 2 and
run again with the same run key: it resumes after the last committed round and adopts the round-2
steps in flight. Beside each worker runs its warm pool (as
``make worker`` starts them), so a step's process starts in seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hybridtrain.drill.processes import kill_tree, stop_with_children
from tests.fixtures.federated_jobs import DATA_SITES, build_federated_workspace, federated_spec
from tests.fixtures.processes import start_worker, wait_for_workers
from tests.fixtures.workspaces import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
POOLS = {"onprem-dc1": "onprem", "onprem-dc2": "onprem-dc2", "onprem-dc3": "onprem-dc3"}
FLOWS = ("federated_prepare", "federated_round", "federated_evaluate")
# Bound on each wait for a run's progress (the CLI, prepare, two rounds, evaluate, register: a few minutes on a
# quiet 2-core VM; about 15 with the load average at 20).
TIMEOUT_S = 1200
# A safety net only: the killed site is dropped by SITE_LOST_S, healthy sites report long before this.
ROUND_TIMEOUT_S = 300
# The killed worker's heartbeats (every 5 s here, tests.fixtures.processes) are overdue 15 s after the last one
# got through, counted against the other pools' (so late heartbeats everywhere on a loaded VM drop no one); its
# site is dropped this long after. The restarted worker (and its warm pool) must be up within it once the next
# round has started, or the site is dropped from that round too.
SITE_LOST_S = 60


def write_deployments(root: Path) -> None:
    """The federated stage flows for each data site's pool (and nothing else, to keep `prefect deploy` short)."""
    path = root / "deployments" / "prefect.yaml"
    data = yaml.safe_load(path.read_text())
    template = next(d for d in data["deployments"] if d["entrypoint"] == "flows/federated.py:federated_round")
    data["deployments"] = [
        {**template, "name": pool, "entrypoint": f"flows/federated.py:{flow}",
         "work_pool": {**template["work_pool"], "name": pool}}
        for pool in POOLS.values() for flow in FLOWS]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def fed_pools(prefect_server, pseudonym_key, tmp_path_factory):
    """Per site pool, a process worker and beside it a warm pool (``make worker``): one spare that has imported the
    federated flows, so a step starts in seconds instead of a new interpreter importing torch, MLflow and DVC."""
    from deployments.bootstrap import bootstrap
    from hybridtrain.workspace import Workspace

    base = tmp_path_factory.mktemp("fedpools")
    root, parts = build_federated_workspace(base / "ws")
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    write_deployments(root)
    bootstrap(Workspace.resolve(root))
    procs: dict[str, tuple[subprocess.Popen, subprocess.Popen]] = {}

    def start(*pools: str) -> None:
        logs = [base / f"worker-{pool}.log" for pool in pools]
        for pool, log in zip(pools, logs, strict=True):
            sock = base / "run" / f"{pool}.sock"
            sock.parent.mkdir(exist_ok=True, mode=0o700)
            env = {**os.environ, "PREFECT_API_URL": prefect_server, "HYBRIDTRAIN_HOME": str(root),
                   "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain", "HYBRIDTRAIN_WARM_SOCKET": str(sock)}
            with open(base / f"warm-{pool}.log", "ab") as fh:
                daemon = subprocess.Popen(
                    [sys.executable, "-m", "workers.warm_pool", "--spares", "1", "--preload", "flows.federated",
                     "--wait-for-spare", "30"], cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
            procs[pool] = (start_worker(pool, root, prefect_server, log, env=env), daemon)
        wait_for_workers(list(pools), [procs[p][0] for p in pools], logs)
        for pool in pools:
            if procs[pool][1].poll() is not None:
                raise RuntimeError(f"warm pool of {pool} exited: {(base / f'warm-{pool}.log').read_text()[-2000:]}")

    start(*POOLS.values())  # all at once: each worker's start-up is mostly its own imports
    try:
        yield {"root": root, "parts": parts, "api": prefect_server, "procs": procs, "start": start, "base": base}
    finally:
        stop_with_children(*(p for pair in procs.values() for p in pair))


def run_cli(env_root: Path, api: str, *args: str) -> subprocess.Popen:
    """``hybridtrain run ... --dispatch pools`` in its own process group; its output goes to a file
    (``proc.log``): a pipe nobody reads would fill up and stop it."""
    env = {**os.environ, "PREFECT_API_URL": api, "HYBRIDTRAIN_HOME": str(env_root),
           "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain"}
    log = env_root.parent / f"run-{time.time_ns()}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "run", *args, "--dispatch", "pools"],
                                cwd=env_root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    proc.log = log
    return proc


def round_store(root: Path, job: str, run_key: str):
    from hybridtrain import stages
    from hybridtrain.federated.rounds import RoundStore
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    return RoundStore(stages.checkpoint_store(ws, ws.load_sites().get("onprem-dc1")), job, run_key)


def wait_for(what: str, check, proc: subprocess.Popen | None = None, timeout_s: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.log.read_text()[-4000:]}")
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}: {proc.log.read_text()[-4000:] if proc else ''}")


def flow_run(name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return runs


def finish(proc: subprocess.Popen) -> str:
    proc.wait(timeout=TIMEOUT_S)
    out = proc.log.read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


def job_runs(job: str, prefix: str):
    """The flow runs named ``prefix...`` of the federated job ``job`` (the stage flows' names do not say the job)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=prefix)))
    return [r for r in runs if r.name.startswith(prefix)
            and r.parameters.get("spec", {}).get("metadata", {}).get("name") == job]



def test_a_killed_site_is_dropped_and_rejoins_and_a_killed_aggregator_resumes_adopting_the_round_in_flight(
        fed_pools):
    import json

    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    root = fed_pools["root"]
    # With secure aggregation (the harder path: masked updates, a second attempt among the survivors of round 1).
    spec = federated_spec(root, fed_pools["parts"], name="fedpool", rounds=2, round_timeout_s=ROUND_TIMEOUT_S,
                          site_lost_s=SITE_LOST_S, secure_aggregation=True)
    rs = round_store(root, "fedpool", "pool1")
    proc = run_cli(root, fed_pools["api"], str(spec), "--run-key", "pool1")
    try:
        # dc3's round 1 is running in its worker's process: the site goes down mid-round (SIGKILL, worker and
        # the round's process under it).
        wait_for("dc3's round 1 to run", lambda: any(r.state.is_running() for r in flow_run("fed-round-1-onprem-dc3")),
                 proc)
        kill_tree(*fed_pools["procs"]["onprem-dc3"])  # the worker, its warm pool, the round's process
        # The aggregator drops it (and cancels its round-1 run) once its pool has had no live worker for SITE_LOST_S.
        wait_for("dc3 to be dropped from round 1",
                 lambda: any(r.state.is_cancelled() for r in flow_run("fed-round-1-onprem-dc3")), proc)
        fed_pools["start"]("onprem-dc3")  # the site comes back
        # Then the aggregator dies while the sites train round 2.
        wait_for("round 2 to be submitted to every site", lambda: len(job_runs("fedpool", "fed-round-2-")) == 3,
                 proc)
        assert rs.resume().completed == 1
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rs.resume().completed == 1
    out = finish(run_cli(root, fed_pools["api"], str(spec), "--run-key", "pool1"))  # run again, same run key

    state = rs.resume()
    assert [r.participants for r in state.rounds] == [DATA_SITES[:2], DATA_SITES]
    assert f"no live worker in pool 'onprem-dc3' for {SITE_LOST_S} s" in state.rounds[0].dropped["onprem-dc3"]
    # Round 1's first attempt lost dc3 before its masked update arrived; the survivors masked their kept update
    # again for a second attempt (steps of their own, no retraining); round 2 needed one attempt.
    assert [(a.attempt, a.participants, sorted(a.dropped)) for a in state.rounds[0].attempts] == [
        (1, DATA_SITES, ["onprem-dc3"]), (2, DATA_SITES[:2], [])]
    assert [(a.attempt, a.participants, a.dropped) for a in state.rounds[1].attempts] == [(1, DATA_SITES, {})]
    updates = [o.key for o in rs.store.list(f"{rs.prefix}/updates/")]
    assert updates and all(k.endswith((".masked", "/closed.json", "/asked.json")) for k in updates), updates
    [stale] = flow_run("fed-round-1-onprem-dc3")
    assert stale.state.is_cancelled()  # a worker that comes back does not run the stale round
    # Nothing was trained twice: the resumed aggregator prepared no site and trained no round-1 step again, and it
    # adopted the round-2 steps its predecessor had submitted instead of submitting new ones.
    assert "adopting fed-round-2-" in out, out[-4000:]
    assert len(job_runs("fedpool", "fed-prepare-")) == 3
    round1 = job_runs("fedpool", "fed-round-1-")
    assert sorted(r.name for r in round1 if "-a2-" not in r.name) == [f"fed-round-1-{s}" for s in DATA_SITES]
    retries = [r for r in round1 if "-a2-" in r.name]
    assert sorted(r.name for r in retries) == [f"fed-round-1-a2-{s}" for s in DATA_SITES[:2]]
    assert all(r.state.is_completed() for r in retries), [(r.name, r.state) for r in retries]
    round2 = job_runs("fedpool", "fed-round-2-")
    assert len(round2) == 3 and all(r.state.is_completed() for r in round2), [(r.name, r.state) for r in round2]
    # Every site step ran in its own site's pool.
    for site, pool in POOLS.items():
        assert [r.work_pool_name for r in flow_run(f"fed-round-2-{site}")] == [pool]
    assert "Federated training of **fedpool**" in out
    ws = Workspace.resolve(root)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    version = registry.versions("fedpool-model")[-1]
    tags = version.tags
    assert tags["hybridtrain.federated.rounds"] == "2"
    assert tags["hybridtrain.federated.secure_aggregation"] == "pairwise-masking-x25519-chacha20"
    assert json.loads(tags["hybridtrain.federated.participants"]) == {"1": DATA_SITES[:2], "2": DATA_SITES}
    for site, part in zip(DATA_SITES, fed_pools["parts"], strict=True):
        assert tags[f"hybridtrain.federated.site.{site}.dataset.raw.md5"] == part["md5"]
    # The ledger charged each site's rounds (dc3's lost one as wasted) and recorded every update crossing
    # (the version keeps the total; the breakdown is on its run).
    run_tags = registry.client.get_run(version.run_id).data.tags
    assert float(tags["hybridtrain.cost.gpu_hours"]) > 0 and float(run_tags["hybridtrain.cost.wasted_gpu_hours"]) > 0
    record = json.loads(registry.read_text(version.run_id, "ledger/run_record.json"))
    updates = [t for t in record["transfers"] if t["what"].startswith("model update")]
    assert {(t["source"], t["destination"]) for t in updates} == {("onprem-dc2", "onprem-dc1"),
                                                                   ("onprem-dc3", "onprem-dc1")}
    assert {a["site"] for a in record["attempts"] if a["outcome"] == "failed"} == {"onprem-dc3"}
