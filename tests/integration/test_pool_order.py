"""A GPU pool's workers start waiting train runs in the order of their placement tiers, on a real Prefect server.

The pool is made by ``ensure_pools`` (what ``hybridtrain deploy`` runs) from a sites catalog whose on-prem site
has one GPU, so the pool's run limit is 1; the runs are queued by ``run_stage`` (what the lifecycle's training
dispatch calls) with their placement's tier; one ``prefect worker start --pool`` process, polling every queue of
the pool, starts them. The stage flow is a stand-in that holds its slot until the test lets go.
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import start_worker, wait_for_workers, wait_until
from tests.fixtures.workspaces import ROOT, make_workspace
from tests.integration import pool_order_flows

pytestmark = pytest.mark.slow
POOL = "tier-order"  # its own pool: the session's server is shared with other test files
RUN_TIMEOUT_S = 240.0  # a bound on each wait, not a sleep: three process starts on a loaded 2-core VM


class Queued(Exception):
    """Raised by ``after_queued`` to return from ``run_stage`` as soon as the run is queued."""

    def __init__(self, run) -> None:
        super().__init__(str(run.id))
        self.run = run


def stop_waiting(run) -> None:
    raise Queued(run)


@pytest.fixture(scope="module")
def pool(prefect_server, tmp_path_factory):
    from deployments.bootstrap import BootstrapReport, ensure_pools

    base = tmp_path_factory.mktemp("pool-order")
    root = make_workspace(base / "ws")
    sites_file = root / "deployments" / "sites.yaml"
    data = yaml.safe_load(sites_file.read_text())
    onprem, cloud = data["sites"]
    onprem.update(gpu_count=1, work_pool=POOL)
    cloud["work_pool"] = f"{POOL}-cloud"
    sites_file.write_text(yaml.safe_dump(data, sort_keys=False))
    ws = Workspace.resolve(root)
    ensure_pools(ws.load_sites(), BootstrapReport())
    fl = pool_order_flows.slot_holder
    fl.from_source(source=str(ROOT), entrypoint="tests/integration/pool_order_flows.py:slot_holder").deploy(
        name=POOL, work_pool_name=POOL, print_next_steps=False, ignore_warnings=True)
    log = base / "worker.log"
    proc = start_worker(POOL, ROOT, prefect_server, log)
    try:
        wait_for_workers([POOL], [proc], [log])
        yield {"ws": ws, "base": base, "log": log}
    finally:
        stop_with_children(proc)


def queue(pool, tier: str, release: str | None = None):
    """One run of the stand-in stage, queued as the lifecycle queues a train run with its placement's tier."""
    from orchestration.dispatch import run_stage
    from orchestration.queues import decision_tags

    with pytest.raises(Queued) as queued:
        run_stage(pool_order_flows.slot_holder, object, site="onprem-dc1", params={"release": release},
                  ws=pool["ws"], run_id=uuid.uuid4().hex, mode="pools", timeout_s=RUN_TIMEOUT_S,
                  tags=decision_tags(0.1, tier), queue_tier=tier, after_queued=stop_waiting)
    return queued.value.run


def read(run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def ended(*run_ids):
    """The runs, once every one of them has ended; None before."""
    runs = [read(i) for i in run_ids]
    return runs if all(r.state.is_final() for r in runs) else None


def test_a_freed_slot_goes_to_the_stay_run_queued_after_a_spot_run(pool):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert client.read_work_pool(POOL).concurrency_limit == 1
    release = pool["base"] / "release"
    holder = queue(pool, "on_demand", release=str(release))
    wait_until(lambda: read(holder.id).state.is_running(), "the first run to hold the pool's one slot",
               timeout=RUN_TIMEOUT_S)
    spot = queue(pool, "spot")
    stay = queue(pool, "stay")
    assert (holder.work_queue_name, spot.work_queue_name, stay.work_queue_name) == (
        "tier-1-on-demand", "tier-2-spot", "tier-0-stay")
    assert spot.expected_start_time < stay.expected_start_time  # in arrival order the spot run would go first
    release.write_text("")
    runs = wait_until(lambda: ended(holder.id, spot.id, stay.id), "the three runs to end", timeout=RUN_TIMEOUT_S,
                      every=0.5)
    held, spot_run, stay_run = runs
    assert all(r.state.is_completed() for r in runs), ([(r.name, r.state) for r in runs], pool["log"].read_text()[-3000:])
    # One slot: the stay run started once the holder had ended, and the spot run once the stay run had.
    assert held.end_time <= stay_run.start_time < stay_run.end_time <= spot_run.start_time, [
        (r.work_queue_name, r.start_time, r.end_time) for r in runs]
