"""Human approval before promotion (Prefect pause/resume) and the tier/policy rules on syncing data."""

from __future__ import annotations

import threading
import time

import pytest

from hybridtrain.errors import SpecError
from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow
PAUSE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def root(prefect_server, pseudonym_key, tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("approval") / "ws", rows=3000)


def wait_for_paused_run(timeout_s: float):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            paused = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))))
            if paused:
                return paused[0]
            time.sleep(0.5)  # polling the API for the pause, bounded by the deadline
    raise AssertionError("the lifecycle never paused for approval")


def test_promotion_waits_for_approval_and_records_who_approved(root):
    from prefect.flow_runs import resume_flow_run

    from flows.lifecycle import lifecycle
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    spec = spec_writer(root)("approve", promotion__require_approval=True, promotion__approval_timeout_s=PAUSE_TIMEOUT_S)
    result: dict = {}

    def run() -> None:
        result["summary"] = lifecycle(spec_path=str(spec), workspace=str(root), dispatch="inline")

    t = threading.Thread(target=run)
    t.start()
    paused = wait_for_paused_run(PAUSE_TIMEOUT_S)
    ws = Workspace.resolve(root)
    assert Registry(ws.tracking_uri).by_alias("churn-classifier", "champion") is None  # nothing moved yet
    resume_flow_run(paused.id, run_input={"approve": True, "approved_by": "alice@example.com", "note": "ok"})
    t.join(timeout=PAUSE_TIMEOUT_S)
    summary = result["summary"]
    assert summary.promoted and summary.gates["approval"] == "passed"
    tags = Registry(ws.tracking_uri).version("churn-classifier", summary.model_version).tags
    assert "alice@example.com" in str(tags)


def test_data_may_only_be_synced_to_sites_the_policy_allows(root):
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    spec = load_spec(spec_writer(root)("restricted", data_policy__sensitivity="restricted",
                                       placement__site=None))
    prep = stages.preprocess(ws, spec)
    cloud = root / ".hybridtrain" / "stores" / "cloud-eu" / "dvc"
    before = set(cloud.rglob("*")) if cloud.exists() else set()  # an earlier test in this module synced
    with pytest.raises(SpecError) as exc:  # curated (unapproved) data may not leave at all
        stages.sync(ws, prep.curated, "cloud-eu", spec)
    assert "curated data may not leave site onprem-dc1" in str(exc.value)
    approved = prep.curated.model_copy(update={"tier": "approved"})
    with pytest.raises(SpecError) as exc:  # approved, but restricted data stays on-prem by policy
        stages.sync(ws, approved, "cloud-eu", spec)
    assert "restricted data never leaves on-prem" in str(exc.value) and "nothing was synced" in str(exc.value)
    assert (set(cloud.rglob("*")) if cloud.exists() else set()) == before  # not one object was pushed
