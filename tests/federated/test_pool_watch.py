"""PoolSites' fault rules without a server: which site pools count as down, API calls tried again while busy, and
which steps a restarted aggregator adopts."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

import httpx
import pytest

from flows.federated import PoolWatch
from orchestration.dispatch import retry_transient

ALLOWED = 15.0  # three 5-s heartbeat intervals


def test_a_pool_whose_heartbeats_fall_behind_the_others_is_down():
    lags = {"dc1": (2.0, ALLOWED), "dc2": (4.0, ALLOWED), "dc3": (40.0, ALLOWED)}
    assert PoolWatch._judge(lags) == {"dc3"}


def test_heartbeats_late_everywhere_drop_no_one():
    # A busy server records every worker's heartbeat 60-75 s late: no pool is behind the others.
    lags = {"dc1": (60.0, ALLOWED), "dc2": (70.0, ALLOWED), "dc3": (74.0, ALLOWED)}
    assert PoolWatch._judge(lags) == set()
    # ... and one that stopped beating still stands out against them.
    assert PoolWatch._judge({**lags, "dc3": (60.0 + ALLOWED, ALLOWED)}) == {"dc3"}


def test_a_pool_without_workers_is_down_and_a_lone_pool_is_judged_by_the_clock():
    assert PoolWatch._judge({"dc1": (1.0, ALLOWED), "dc2": None}) == {"dc2"}
    assert PoolWatch._judge({"dc1": (ALLOWED + 1, ALLOWED)}) == {"dc1"}
    assert PoolWatch._judge({"dc1": (ALLOWED - 1, ALLOWED)}) == set()


def busy(status: int = 503) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/api/deployments/x/create_flow_run")
    return httpx.HTTPStatusError("busy", request=request, response=httpx.Response(status, request=request))


def test_a_busy_api_is_asked_again_until_it_answers(monkeypatch):
    monkeypatch.setattr("orchestration.dispatch.time.sleep", lambda s: None)
    answers = iter([busy(), httpx.ConnectError("refused"), "run"])

    def call():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert retry_transient(float("inf"), call) == "run"


def test_errors_that_are_not_transient_or_past_the_deadline_are_raised(monkeypatch):
    monkeypatch.setattr("orchestration.dispatch.time.sleep", lambda s: None)
    with pytest.raises(httpx.HTTPStatusError):
        retry_transient(float("inf"), lambda: (_ for _ in ()).throw(busy(404)))
    with pytest.raises(httpx.HTTPStatusError):
        retry_transient(0.0, lambda: (_ for _ in ()).throw(busy(503)))


class FakeDeployments:
    """``run_deployment`` as the Prefect server answers it: one flow run per idempotency key."""

    def __init__(self):
        self.runs: dict[str, object] = {}

    def __call__(self, name, parameters, timeout, idempotency_key, as_subflow):
        from prefect.client.schemas.objects import FlowRun
        from prefect.states import Scheduled

        if idempotency_key not in self.runs:
            self.runs[idempotency_key] = FlowRun(flow_id=uuid4(), name=parameters["tag"], parameters=parameters,
                                                 state=Scheduled())
        return self.runs[idempotency_key]


def aggregator(run_id: str, attempt: str):
    from flows.federated import PoolSites

    sites = object.__new__(PoolSites)
    sites.spec = SimpleNamespace(name="fedjob")
    sites.run_id, sites.run_key, sites.attempt = run_id, "nightly", attempt
    return sites


@pytest.mark.parametrize(("earlier", "adopted"), [("running", True), ("completed", True), ("cancelled", False),
                                                  ("failed", False)])
def test_a_restarted_aggregator_adopts_the_steps_in_flight_and_resubmits_the_dropped(monkeypatch, earlier, adopted):
    from prefect.states import Cancelled, Completed, Failed, Running

    fake = FakeDeployments()
    monkeypatch.setattr("flows.federated.run_deployment", fake)
    first = aggregator("mlflow-run-1", "flow-run-1")
    params = {"tag": "fed-round-2-dc1", "run_id": "mlflow-run-1"}
    mine = first._submit("federated-round/onprem", params, "fed-round-2-dc1", float("inf"))
    assert first._submit("federated-round/onprem", params, "fed-round-2-dc1", float("inf")) is mine  # API retry
    mine.state = {"running": Running, "completed": Completed, "cancelled": Cancelled, "failed": Failed}[earlier]()

    again = aggregator("mlflow-run-2", "flow-run-2")  # the same job and run key, after a crash
    run = again._submit("federated-round/onprem", {**params, "run_id": "mlflow-run-2"}, "fed-round-2-dc1",
                        float("inf"))
    assert (run is mine) == adopted
    if not adopted:
        assert run.parameters["run_id"] == "mlflow-run-2" and run.state.is_scheduled()


def test_every_step_has_a_tag_a_restarted_aggregator_finds_again(monkeypatch):
    """Adoption needs the same tag for the same step in the next attempt: no clock or attempt in it."""
    from flows.federated import PoolSites

    tags = []
    monkeypatch.setattr(PoolSites, "_each", lambda self, step, result, sites, tag, params: tags.append(tag) or {})
    sites = aggregator("mlflow-run-1", "flow-run-1")
    for _ in range(2):
        sites.prepare(["dc1"], 0)
        sites.prepare(["dc2"], 3)
        sites.train(2, {"dc1": None}, {})
        sites.evaluate(2, {"dc1": None}, {})
    assert tags[:4] == tags[4:] == ["fed-prepare-r0", "fed-prepare-r3", "fed-round-2", "fed-evaluate-r2"]


def test_a_secure_rounds_later_attempt_is_a_step_of_its_own_that_carries_the_participants(monkeypatch):
    """Attempt 1 of a secure round keeps the round's tag (adopted after a restart as before); attempt 2, asked of the
    survivors when a site dropped, gets its own tag, so it is not the attempt-1 flow run adopted again."""
    from flows.federated import PoolSites
    from hybridtrain.federated.secure_aggregation import SecureRound, new_private_key, public_key

    calls = []
    monkeypatch.setattr(PoolSites, "_each", lambda self, step, result, sites, tag, params: calls.append(
        (tag, sites, params)) or {})
    keys = {s: public_key(new_private_key()) for s in ("dc1", "dc2", "dc3")}
    sites = aggregator("mlflow-run-1", "flow-run-1")
    first = SecureRound(attempt=1, rows={"dc1": 10, "dc2": 20, "dc3": 30}, public_keys=keys)
    second = SecureRound(attempt=2, rows={"dc1": 10, "dc2": 20}, public_keys={s: keys[s] for s in ("dc1", "dc2")})
    sites.train(4, {"dc1": None, "dc2": None, "dc3": None}, {}, first)
    sites.train(4, {"dc1": None, "dc2": None}, {}, second)
    assert [(tag, asked) for tag, asked, _ in calls] == [("fed-round-4", ["dc1", "dc2", "dc3"]),
                                                         ("fed-round-4-a2", ["dc1", "dc2"])]
    assert all(p["secure"] is first and p["rnd"] == 4 for p in calls[0][2].values())
    assert all(p["secure"] is second for p in calls[1][2].values())


def test_the_run_summary_shows_a_round_that_took_more_than_one_secure_attempt():
    from flows.federated import FederatedSummary

    rounds = [{"round": 1, "participants": ["dc1", "dc2", "dc3"], "dropped": {}, "global_metrics": {"val_auc": 0.7},
               "rows": {}, "attempts": [{"attempt": 1}]},
              {"round": 2, "participants": ["dc1", "dc2"], "dropped": {"dc3": "site dc3 is down"},
               "global_metrics": {"val_auc": 0.8}, "rows": {}, "attempts": [{"attempt": 1}, {"attempt": 2}]}]
    summary = FederatedSummary(job="j", flow_run_id=None, mlflow_run_id="m", run_key="k", mode={}, rounds=rounds,
                               metrics={"auc": 0.8}, model_name="m", model_version="1", promoted=False, gates={},
                               cost_usd=0.0, bytes_crossed=0, resumed_after_round=None)
    lines = summary.to_markdown().splitlines()
    assert "| 1 | dc1, dc2, dc3 |  | 0.7000 |" in lines  # one attempt: nothing to say
    assert "| 2 | dc1, dc2 (2 secure-aggregation attempts) | dc3: site dc3 is down | 0.8000 |" in lines


def test_a_secure_rounds_later_attempt_has_a_flow_run_name_of_its_own(monkeypatch):
    import prefect.runtime.flow_run

    from flows.federated import _round_run_name
    from hybridtrain.federated.secure_aggregation import SecureRound

    def named(**params) -> str:
        monkeypatch.setattr(prefect.runtime.flow_run, "parameters", params, raising=False)
        return _round_run_name()

    keys = {"dc1": "00" * 32, "dc2": "11" * 32}
    assert named(rnd=3, site="dc1") == named(rnd=3, site="dc1", secure=None) == "fed-round-3-dc1"
    first = SecureRound(attempt=1, rows={"dc1": 5, "dc2": 7}, public_keys=keys)
    assert named(rnd=3, site="dc1", secure=first) == "fed-round-3-dc1"
    again = first.model_copy(update={"attempt": 2})
    assert named(rnd=3, site="dc2", secure=again) == "fed-round-3-a2-dc2"
    assert named(rnd=3, site="dc2", secure=again.model_dump(mode="json")) == "fed-round-3-a2-dc2"
