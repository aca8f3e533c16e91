"""Promotion gates: all pass on consistent evidence; each one fails on its own; the report lists every failure."""

from __future__ import annotations

import dataclasses

import pytest

from hybridtrain.errors import GateFailed, SpecError
from hybridtrain.governance.gates import GATES, dataset_tag, evaluate_gates
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import PromotionSpec
from tests.fixtures.bundles import CHECKPOINT_SHA, DATASETS
from tests.fixtures.gate_cases import CASES, other_bundle_md5


def test_consistent_evidence_passes_every_gate_in_order(good):
    report = evaluate_gates(good)
    assert report.passed, report.lines()
    assert [r.name for r in report.results] == GATES.names == [
        "lineage", "signature", "thresholds", "not_worse", "cost", "rollback_target", "approval"]
    report.raise_if_failed()
    assert report.result("rollback_target").reason == "rollback target: v1 (the current champion becomes `previous`)"
    assert report.result("lineage").evidence["checkpoint"] == {"recorded": CHECKPOINT_SHA, "bundle": CHECKPOINT_SHA,
                                                               "mlflow": CHECKPOINT_SHA}
    assert report.tags()["hybridtrain.gate.cost"] == "passed: ledger total $12.5000 is within $25.00"


# Each case changes one piece of evidence; exactly that gate must fail, with this in its reason.
@pytest.mark.parametrize("gate", list(CASES))
def test_each_gate_fails_on_its_own(good, tmp_path, gate):
    change, reason = CASES[gate]
    report = evaluate_gates(change(good, tmp_path))
    assert [r.name for r in report.failures] == [gate], report.lines()
    assert reason in report.result(gate).reason
    with pytest.raises(GateFailed) as exc:
        report.raise_if_failed()
    assert exc.value.gate == gate and reason in exc.value.reason
    assert exc.value.report is report


def test_a_bundle_with_other_dataset_hashes_fails_lineage_only(good, tmp_path):
    report = evaluate_gates(other_bundle_md5(tmp_path, good))
    assert [r.name for r in report.failures] == ["lineage"]
    assert f"approved: the bundle's datasets.json says {'9' * 32}.dir" in report.result("lineage").reason


def test_a_checkpoint_mismatch_fails_lineage(good):
    report = evaluate_gates(dataclasses.replace(good, checkpoint_sha256="d" * 64, version_tags={
        dataset_tag(t): m for t, m in DATASETS.items()}))
    assert [r.name for r in report.failures] == ["lineage"]
    assert f"checkpoint: the bundle says {CHECKPOINT_SHA}, training recorded {'d' * 64}" in report.failures[0].reason
    missing = evaluate_gates(dataclasses.replace(good, checkpoint_sha256=None), ["lineage"])
    assert "training recorded no final checkpoint hash" in missing.failures[0].reason


def test_the_report_lists_every_failing_gate_and_the_error_names_the_first(good, tmp_path):
    bad = dataclasses.replace(good, trusted_key=SigningKey.generate().public, cost_usd=None, metrics={"auc": 0.5})
    report = evaluate_gates(bad)
    assert [r.name for r in report.failures] == ["signature", "thresholds", "not_worse", "cost"]
    with pytest.raises(GateFailed) as exc:
        report.raise_if_failed()
    message = str(exc.value)
    assert exc.value.gate == "signature" and message.startswith("promotion gate 'signature' failed:")
    assert "4 of 7 gates failed" in message
    for name in ("signature:", "thresholds:", "not_worse:", "cost: no ledger total for v2"):
        assert name in message


def test_the_first_version_passes_not_worse_and_rollback_target(good):
    first = dataclasses.replace(good, version="1", champion_version=None, champion_metrics=None, rollback_versions=[],
                                bundle=None)
    report = evaluate_gates(first, ["not_worse", "rollback_target"])
    assert report.passed
    assert report.result("not_worse").reason.startswith("no champion yet; the candidate (auc 0.8200) becomes the first")
    assert report.result("rollback_target").reason.startswith("first champion: there is no earlier version")


def test_a_champion_without_comparable_metrics_fails_not_worse(good):
    no_metrics = evaluate_gates(dataclasses.replace(good, champion_metrics=None), ["not_worse"])
    assert "champion v1 has no metrics on this test split" in no_metrics.failures[0].reason
    no_primary = evaluate_gates(dataclasses.replace(good, champion_metrics={"accuracy": 0.7}), ["not_worse"])
    assert no_primary.failures[0].reason.startswith("could not be evaluated: the champion has no usable 'auc' metric")


def test_without_a_cost_limit_the_cost_gate_passes_and_reports_the_total(good):
    report = evaluate_gates(dataclasses.replace(good, promotion=PromotionSpec()), ["cost"])
    assert report.passed and report.results[0].reason == "no promotion.max_cost_usd set (ledger total $12.5000)"


def test_approval_by_a_person_passes_the_approval_gate(good):
    inputs = dataclasses.replace(good, promotion=PromotionSpec(require_approval=True), approved_by="ana@example.com")
    assert evaluate_gates(inputs, ["approval"]).results[0].reason == "approved by ana@example.com"


def test_a_spec_chooses_its_gates_and_unknown_names_list_the_valid_ones(good):
    chosen = dataclasses.replace(good, promotion=PromotionSpec(gates=["cost", "signature"], max_cost_usd=1.0))
    report = evaluate_gates(chosen)
    assert [r.name for r in report.results] == ["cost", "signature"] and not report.passed
    with pytest.raises(SpecError) as exc:
        evaluate_gates(good, ["lineage", "vibes"])
    assert ("unknown promotion gate 'vibes'; choose one of: lineage, signature, thresholds, not_worse, cost, "
            "rollback_target, approval") in str(exc.value)
