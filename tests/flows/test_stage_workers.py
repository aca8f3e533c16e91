"""Which pools a site-health check asks for live workers: only those a stage would run in — never a pool that does
not exist (the embedded default has none: a preempted run's health check crashed on the 404)."""

from __future__ import annotations

import uuid

import pytest

from hybridtrain.workspace import Workspace
from orchestration.dispatch import stage_workers, workers_online
from tasks.health import check_sites


@pytest.fixture
def names(prefect_server) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"stage-{tag}", f"pool-{tag}"


def test_a_pool_that_does_not_exist_has_no_workers(names):
    assert workers_online(names[1]) == 0


def test_only_a_stage_dispatched_to_a_pool_needs_its_workers(names):
    stage, pool = names
    assert stage_workers(stage, "inline") is None
    assert stage_workers(stage, "auto")(pool) is None  # not deployed there: it runs in this process
    assert stage_workers(stage, "pools")(pool) == 0  # sent to the pool, which has no worker: the site is unhealthy


def test_site_health_on_the_embedded_default_needs_no_worker(workspace, names):
    ws = Workspace.resolve(workspace)
    assert check_sites(ws, names[0], "auto") == {}  # the stage is deployed to no pool: it runs here
