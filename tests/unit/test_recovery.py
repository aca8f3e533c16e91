"""Recovery rules: preemption re-places, lost sites fail over within policy or wait, failures retry bounded."""

from __future__ import annotations

import pytest

from hybridtrain.errors import DataError, NoFeasiblePlacement, Preempted, Problem, SiteUnavailable, TransientError
from hybridtrain.placement.engine import HEALTH_RULE
from hybridtrain.specs.job import RecoverySpec
from hybridtrain.training.recovery import Outcome, Placed, RecoveryExhausted, Supervisor, classify

CLASSES = {"onprem": "fixed", "cloud": "burst", "spot": "opportunistic"}


class World:
    """Sites with a policy (``allowed``), health that tests change, and a script of attempt outcomes."""

    def __init__(self, allowed: list[str], script: list[BaseException | None], health: dict[str, str] | None = None):
        self.allowed = allowed
        self.script = list(script)
        self.unhealthy = dict(health or {})
        self.ran: list[str] = []
        self.moves: list[tuple[str, str]] = []
        self.waits: list[str] = []
        self.places: list[dict[str, str]] = []
        self.now = 0.0
        self.on_sleep = lambda: None

    def attempt(self, site: str) -> str:
        self.ran.append(site)
        outcome = self.script.pop(0)
        if outcome is not None:
            raise outcome
        return f"model from {site}"

    def place(self, exclude: dict[str, str]) -> Placed:
        self.places.append(dict(exclude))
        ok = [s for s in self.allowed if s not in exclude]  # cheapest first
        if not ok:
            raise NoFeasiblePlacement("churn", {f"{s} ({CLASSES[s]})": f"{HEALTH_RULE}: {exclude[s]}" for s in exclude
                                                if s in self.allowed}, hint="every site the policy allows is unavailable")
        return Placed(ok[0], CLASSES[ok[0]])

    def health(self) -> dict[str, str]:
        return dict(self.unhealthy)

    def move(self, source: str, destination: str) -> None:
        self.moves.append((source, destination))

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep()

    def supervisor(self, **policy) -> Supervisor:
        return Supervisor(job="churn", policy=RecoverySpec(**policy), attempt=self.attempt, place=self.place,
                          health=self.health, move=self.move, on_wait=self.waits.append, sleep=self.sleep,
                          clock=lambda: self.now)


def preempted(site: str, step: int = 40) -> Preempted:
    return Preempted("churn", step, f"ckpt/{step:012d}", site=site)


def test_classify_tells_preemption_from_failure_from_mistake():
    assert classify(preempted("spot")) is Outcome.preempted
    assert classify(SiteUnavailable("onprem", "ssh down")) is Outcome.site_lost
    assert classify(TransientError("connection reset")) is Outcome.failed
    assert classify(ConnectionResetError()) is Outcome.failed
    assert classify(DataError("churn.csv", [Problem("label", "all null")])) is None
    assert classify(ValueError("bug")) is None


def test_a_spot_preemption_resumes_on_another_site_with_the_checkpoint_moved():
    w = World(["spot", "cloud"], [preempted("spot"), None])
    result, where = w.supervisor().run(Placed("spot", "opportunistic"))
    assert result == "model from cloud" and where.site == "cloud"
    assert w.ran == ["spot", "cloud"] and w.moves == [("spot", "cloud")]
    assert "spot" in w.places[0] and "reclaimed" in w.places[0]["spot"]  # left out of the one decision after


def test_a_preemption_on_owned_capacity_may_resume_in_place():
    w = World(["onprem", "cloud"], [preempted("onprem"), None])
    sup = w.supervisor()
    _, where = sup.run(Placed("onprem", "fixed"))
    assert where.site == "onprem" and w.moves == []  # the engine put it back; the checkpoint is already there
    assert [a.outcome for a in sup.attempts] == [Outcome.preempted, Outcome.succeeded]
    assert sup.attempts[0].step == 40


def test_a_preempted_spot_job_with_no_other_allowed_site_resumes_where_it_was():
    w = World(["spot"], [preempted("spot"), None])
    _, where = w.supervisor().run(Placed("spot", "opportunistic"))
    assert where.site == "spot" and w.ran == ["spot", "spot"]


def test_real_failures_retry_in_place_and_are_bounded_apart_from_preemptions():
    w = World(["onprem"], [TransientError("killed"), preempted("onprem"), TransientError("killed"), None])
    sup = w.supervisor(max_failures=2)
    sup.run(Placed("onprem", "fixed"))
    assert sup.count(Outcome.failed) == 2 and sup.count(Outcome.preempted) == 1

    w = World(["onprem"], [TransientError("a"), TransientError("b"), TransientError("c"), None])
    sup = w.supervisor(max_failures=2)
    with pytest.raises(RecoveryExhausted) as exc:
        sup.run(Placed("onprem", "fixed"))
    assert "recovery.max_failures = 2" in str(exc.value) and len(exc.value.attempts) == 3 and w.script == [None]


def test_preemptions_are_bounded_too():
    w = World(["onprem"], [preempted("onprem")] * 3 + [None])
    with pytest.raises(RecoveryExhausted, match="max_preemptions = 1"):
        w.supervisor(max_preemptions=1).run(Placed("onprem", "fixed"))


def test_a_user_mistake_is_raised_at_once_without_a_retry():
    w = World(["onprem", "cloud"], [DataError("churn.csv", [Problem("label", "all null")]), None])
    with pytest.raises(DataError):
        w.supervisor().run(Placed("onprem", "fixed"))
    assert w.ran == ["onprem"]


def test_a_lost_site_fails_over_to_the_next_allowed_one():
    w = World(["onprem", "cloud"], [SiteUnavailable("onprem", "ssh: connection refused"), None])
    _, where = w.supervisor().run(Placed("onprem", "fixed"))
    assert where.site == "cloud" and w.moves == [("onprem", "cloud")]
    assert w.places[0] == {"onprem": "ssh: connection refused"}


def test_a_job_whose_data_may_not_leave_waits_with_a_reason_and_resumes_when_its_site_is_back():
    # Policy allows only onprem; the site is down for two polls, then healthy again.
    w = World(["onprem"], [SiteUnavailable("onprem", "ssh: connection refused"), None],
              health={"onprem": "ssh: connection refused"})
    polls = []

    def back_after_two():
        polls.append(w.now)
        if len(polls) == 2:
            w.unhealthy.clear()

    w.on_sleep = back_after_two
    _, where = w.supervisor(health_poll_s=30, wait_for_site_s=600).run(Placed("onprem", "fixed"))
    assert where.site == "onprem" and w.ran == ["onprem", "onprem"] and w.moves == []
    assert len(w.waits) == 2 and "is waiting" in w.waits[0] and "onprem (fixed)" in w.waits[0]
    assert "connection refused" in w.waits[0] and polls == [30.0, 60.0]


def test_waiting_ends_with_a_clear_error_after_wait_for_site_s():
    w = World(["onprem"], [SiteUnavailable("onprem", "store: unreachable"), None],
              health={"onprem": "store: unreachable"})
    with pytest.raises(NoFeasiblePlacement) as exc:
        w.supervisor(health_poll_s=30, wait_for_site_s=100).run(Placed("onprem", "fixed"))
    assert "waited 100 s" in str(exc.value) and "store: unreachable" in str(exc.value)
    assert w.now == pytest.approx(100.0) and w.ran == ["onprem"]


def test_a_site_that_just_failed_is_left_out_even_before_a_health_check_notices():
    w = World(["onprem", "cloud"], [SiteUnavailable("onprem", "job lost with its host"), None])
    _, where = w.supervisor().run(Placed("onprem", "fixed"))  # health still says onprem is fine
    assert where.site == "cloud"


def test_the_observed_preemption_rate_comes_from_the_audited_attempts(tmp_path):
    from hybridtrain import stages
    from hybridtrain.governance.audit_log import AuditLog
    from hybridtrain.workspace import Workspace
    from tests.fixtures.workspaces import make_workspace

    ws = Workspace.resolve(make_workspace(tmp_path / "ws"))
    log = AuditLog.in_workspace(ws.root)
    assert stages.observed_preemption_rate(ws, "cloud-eu") is None  # nothing observed yet
    for outcome, seconds in [("preempted: notice", 1800), ("succeeded", 3600), ("preempted: notice", 1800)]:
        log.append(actor="t", action="training_attempt", subject="job churn",
                   inputs={"site": "cloud-eu", "seconds": seconds}, outcome=outcome)
    log.append(actor="t", action="training_attempt", subject="job churn",
               inputs={"site": "onprem-dc1", "seconds": 600}, outcome="preempted")
    assert stages.observed_preemption_rate(ws, "cloud-eu") == pytest.approx(2 / 2.0)  # 2 in 2 hours
    assert stages.observed_preemption_rate(ws, "onprem-dc1") is None  # 10 minutes is too little to say
