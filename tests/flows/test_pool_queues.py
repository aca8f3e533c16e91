"""A GPU pool's work queues, one per placement tier: their names and priorities, and ``ensure_pools`` making them."""

from __future__ import annotations

import logging
import uuid

import pytest
import yaml

from hybridtrain.placement.queue_state import QueueTier
from hybridtrain.specs.sites import SitesCatalog
from orchestration.queues import DEFAULT_QUEUE, PoolRun, pool_queues, tier_queue
from tests.fixtures.workspaces import ROOT


def test_each_tier_has_its_own_queue_served_in_tier_order_with_untiered_runs_as_on_demand():
    assert [tier_queue(t) for t in QueueTier] == ["tier-0-stay", "tier-1-on-demand", "tier-2-spot", "tier-3-late"]
    assert tier_queue("on_demand") == tier_queue(QueueTier.on_demand)
    assert pool_queues() == [("tier-0-stay", 1), ("tier-1-on-demand", 2), (DEFAULT_QUEUE, 3), ("tier-2-spot", 4),
                             ("tier-3-late", 5)]
    # A run without a tier tag counts as on_demand for the controller and the wait estimates; its queue is
    # served right after the on_demand one.
    untagged = PoolRun("r", "SCHEDULED", "Scheduled", None, {}, None, None, None)
    names = [name for name, _ in pool_queues()]
    assert names.index(DEFAULT_QUEUE) == names.index(tier_queue(untagged.tier)) + 1
    with pytest.raises(KeyError):
        tier_queue("express")


def catalog(tag: str) -> SitesCatalog:
    """The project's sites with pools of their own (the session's server is shared), plus a CPU-only site."""
    data = yaml.safe_load((ROOT / "deployments" / "sites.yaml").read_text())
    onprem, cloud = data["sites"]
    onprem["work_pool"], cloud["work_pool"] = f"q-onprem-{tag}", f"q-cloud-{tag}"
    cpu = {k: v for k, v in onprem.items() if k not in ("gpu_type", "gpu_count", "hosts")}
    data["sites"].append({**cpu, "name": "onprem-cpu", "work_pool": f"q-cpu-{tag}",
                          "store": {"kind": "local", "path": ".hybridtrain/stores/onprem-cpu"}})
    return SitesCatalog.model_validate(data)


def queues(pool: str) -> list[tuple[str, int]]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return sorted(((q.name, q.priority) for q in client.read_work_queues(work_pool_name=pool)),
                      key=lambda q: q[1])


def test_ensure_pools_gives_each_gpu_pool_its_tier_queues_and_puts_them_back_in_order(prefect_server):
    from prefect.client.orchestration import get_client

    from deployments.bootstrap import BootstrapReport, ensure_pools

    tag = uuid.uuid4().hex[:8]
    sites = catalog(tag)
    ensure_pools(sites, BootstrapReport())
    for pool in (f"q-onprem-{tag}", f"q-cloud-{tag}"):
        assert queues(pool) == pool_queues(), pool
    assert queues(f"q-cpu-{tag}") == [(DEFAULT_QUEUE, 1)]  # no GPUs, no tiers
    with get_client(sync_client=True) as client:
        assert "tier-0-stay" not in {q.name for q in client.read_work_queues(work_pool_name="control")}
        # Someone reorders the queues by hand and adds one of their own, ahead of them all.
        late = client.read_work_queue_by_name("tier-3-late", work_pool_name=f"q-onprem-{tag}")
        client.update_work_queue(late.id, priority=1)
        client.create_work_queue(name="mine", work_pool_name=f"q-onprem-{tag}", priority=1)
    report = BootstrapReport()
    ensure_pools(sites, report)
    assert f"q-onprem-{tag}" in report.pools_existing
    assert queues(f"q-onprem-{tag}") == [*pool_queues(), ("mine", 6)], queues(f"q-onprem-{tag}")
    assert queues(f"q-cloud-{tag}") == pool_queues()


def test_a_tiered_run_goes_to_its_tier_queue_only_where_the_pool_has_one(prefect_server, caplog):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from deployments.bootstrap import BootstrapReport, ensure_pools
    from orchestration.dispatch import work_queue

    tag = uuid.uuid4().hex[:8]
    ensure_pools(catalog(tag), BootstrapReport())
    log = logging.getLogger("test.pool_queues")
    assert work_queue(f"q-onprem-{tag}", True, "stay", log) == "tier-0-stay"
    assert work_queue(f"q-onprem-{tag}", True, "late", log) == "tier-3-late"
    assert work_queue(f"q-onprem-{tag}", True, None, log) is None  # no tier: the deployment's default queue
    assert work_queue(f"q-cpu-{tag}", False, "stay", log) is None  # no GPUs: no tier queues
    # A pool deployed before it had tier queues: the default queue, and the log says how to get them.
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=f"q-old-{tag}", type="process", concurrency_limit=2))
    with caplog.at_level(logging.WARNING, logger="test.pool_queues"):
        assert work_queue(f"q-old-{tag}", True, "spot", log) is None
    assert "has no work queue 'tier-2-spot'" in caplog.text and "hybridtrain deploy" in caplog.text
    assert [name for name, _ in queues(f"q-old-{tag}")] == [DEFAULT_QUEUE]  # nothing created in the wrong order
