"""Canary: the verdict from two versions' live stats, and the pointer's start/conclude steps with their audit records."""

from __future__ import annotations

import numpy as np
import pytest

from hybridtrain.errors import ReleaseRefused
from hybridtrain.governance.audit_log import AuditLog, AuditLogUnwritable
from hybridtrain.governance.release import DirectoryTarget
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.serving import canary
from hybridtrain.serving.canary import CanaryPlan, LiveStats
from tests.fixtures.bundles import make_bundle

KEY = SigningKey.generate()
MODEL = "churn-classifier"


def stats(n: int, latency_ms: float, error_every: int = 0, score_mean: float = 0.3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    s = LiveStats()
    for i in range(n):
        s.record(latency_ms + rng.random(), bool(error_every and i % error_every == 0),
                 np.clip(rng.normal(score_mean, 0.1, 3), 0, 1))
    return s.snapshot()


def plan(**kw) -> CanaryPlan:
    return CanaryPlan(model=MODEL, version="2", started_at="2026-11-25T00:00:00Z", min_requests=50, **kw)


def test_waits_until_both_versions_have_enough_requests():
    v = canary.judge(plan(), stats(100, 3), stats(49, 3))
    assert v.decision == "wait" and "49 canary" in v.reasons[0]


def test_a_version_that_behaves_like_the_current_is_promoted():
    v = canary.judge(plan(), stats(200, 3, seed=1), stats(100, 3.2, seed=2))
    assert v.decision == "promote", v.reasons
    assert v.evidence["score_ks"] < 0.2


@pytest.mark.parametrize("canary_stats, word", [
    (stats(100, 3, error_every=10, seed=2), "error rate"),
    (stats(100, 40, seed=2), "too slow"),
    (stats(100, 3, score_mean=0.8, seed=2), "shifted"),
])
def test_errors_latency_or_a_shifted_score_distribution_roll_back(canary_stats, word):
    v = canary.judge(plan(), stats(200, 3, seed=1), canary_stats)
    assert v.decision == "rollback"
    assert any(word in r for r in v.reasons), v.reasons


def test_start_and_conclude_move_pointers_and_are_audited(tmp_path):
    t = DirectoryTarget("edge-serving", tmp_path / "t", KEY.public)
    for v in ("1", "2"):
        t.accept(make_bundle(tmp_path / "b" / v, KEY, model=MODEL, version=v))
    audit = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ReleaseRefused, match="serves no version"):
        canary.start(t, audit, model=MODEL, version="2", actor="test")
    t.set_current(MODEL, "1")
    with pytest.raises(ReleaseRefused, match="does not hold v3"):
        canary.start(t, audit, model=MODEL, version="3", actor="test")
    p = canary.start(t, audit, model=MODEL, version="2", actor="test", share=0.25, min_requests=50)
    assert canary.plan_of(t, MODEL) == p and t.current(MODEL) == "1"

    canary.conclude(t, audit, p, canary.Verdict("rollback", ["p99 too slow"], {}), actor="server")
    assert canary.plan_of(t, MODEL) is None and t.current(MODEL) == "1"
    p = canary.start(t, audit, model=MODEL, version="2", actor="test")
    canary.conclude(t, audit, p, canary.Verdict("promote", ["ok"], {}), actor="server")
    canary.conclude(t, audit, p, canary.Verdict("rollback", ["late"], {}), actor="other server")  # already done
    assert canary.plan_of(t, MODEL) is None and t.current(MODEL) == "2"
    outcomes = [r.outcome for r in audit.records()]
    assert outcomes == ["started: 25% of edge-serving's requests go to v2, v1 keeps the rest",
                        "rolled back: edge-serving keeps v1",
                        "started: 10% of edge-serving's requests go to v2, v1 keeps the rest",
                        "promoted: edge-serving serves v2 (was v1)"]
    assert audit.verify().ok


def test_reset_starts_a_fresh_window_for_a_canary():
    s = LiveStats()
    s.record(3.0, False, [0.9, 0.8])
    s.record(4.0, True)
    s.reset()
    assert s.snapshot()["requests"] == 0 and s.snapshot()["scores"].size == 0
    s.record(1.0, False, [0.1])
    snap = s.snapshot()
    assert (snap["requests"], snap["error_rate"], list(snap["scores"])) == (1, 0.0, [0.1])


def _served_target(tmp_path) -> DirectoryTarget:
    t = DirectoryTarget("edge-serving", tmp_path / "t", KEY.public)
    for v in ("1", "2"):
        t.accept(make_bundle(tmp_path / "b" / v, KEY, model=MODEL, version=v))
    t.set_current(MODEL, "1")
    return t


def test_a_canary_step_whose_record_cannot_be_written_moves_nothing(tmp_path):
    t = _served_target(tmp_path)
    audit = AuditLog(tmp_path / "audit" / "audit.jsonl")
    p = canary.start(t, audit, model=MODEL, version="2", actor="test")
    (tmp_path / "audit").rename(tmp_path / "aside")
    (tmp_path / "audit").write_text("a file where the log's directory belongs\n")
    with pytest.raises(AuditLogUnwritable):
        canary.conclude(t, audit, p, canary.Verdict("promote", ["ok"], {}), actor="server")
    assert canary.plan_of(t, MODEL) == p and t.current(MODEL) == "1"  # neither pointer moved
    canary.clear(t, MODEL)
    with pytest.raises(AuditLogUnwritable):
        canary.start(t, audit, model=MODEL, version="2", actor="test")
    assert canary.plan_of(t, MODEL) is None


class _AppendFails:
    """A real audit log whose append fails after its preflight passed (the disk filled up in between)."""

    def __init__(self, log: AuditLog):
        self.log = log

    def check_appendable(self) -> None:
        self.log.check_appendable()

    def append(self, **_: object) -> None:
        raise OSError(28, "No space left on device")


def test_a_canary_whose_start_record_fails_is_not_left_started(tmp_path):
    t = _served_target(tmp_path)
    audit = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(OSError, match="No space"):
        canary.start(t, _AppendFails(audit), model=MODEL, version="2", actor="test")
    assert canary.plan_of(t, MODEL) is None and t.current(MODEL) == "1"
    assert list(audit.records()) == []
