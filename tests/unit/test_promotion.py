"""promote / rollback / retire against a real MLflow registry (SQLite): gates guard the alias, rollback restores the
previous version on every target, retire removes a version everywhere, and the audit log records each step."""

from __future__ import annotations

import dataclasses

import pytest

from hybridtrain.errors import BundleRejected, GateFailed, ReleaseRefused
from hybridtrain.governance.gates import evaluate_gates
from hybridtrain.governance.promotion import promote, retire, rollback
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, Registry
from tests.fixtures.gate_cases import CASES
from tests.fixtures.promotion_world import KEY, World


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    root = tmp_path_factory.mktemp("mlflow")
    return Registry(f"sqlite:///{root}/mlflow.db", root / "artifacts")


@pytest.fixture
def world(registry, tmp_path) -> World:
    return World(registry, tmp_path)


def test_registering_the_same_model_of_a_run_again_returns_its_version(world):
    """A retried promotion (or MLflow's retry of a create that landed) must not add a duplicate version."""
    source = world.tmp / "retried-model"
    source.mkdir()
    first = world.registry.register(source.as_uri(), world.model, world.run_id, {"attempt": 1})
    again = world.registry.register(source.as_uri(), world.model, world.run_id, {"attempt": 2})
    assert again.version == first.version
    assert [v.version for v in world.registry.versions(world.model)] == [first.version]
    assert again.tags["attempt"] == "2"


def test_promote_then_roll_back_restores_the_previous_version_everywhere(world):
    first = world.promote(world.register(0.80))
    assert first.previous is None and world.alias(CHAMPION) == "1" and world.served() == ["1", "1"]
    assert first.report.result("rollback_target").reason.startswith("first champion")
    second = world.promote(world.register(0.85))
    assert second.previous == "1" and (world.alias(CHAMPION), world.alias(PREVIOUS)) == ("2", "1")
    assert world.served() == ["2", "2"]
    tags = world.registry.version(world.model, "2").tags
    assert tags["hybridtrain.governance.promotion"] == "champion" and tags["hybridtrain.gate.lineage"].startswith("passed")
    assert tags["hybridtrain.release.cloud"].startswith("current at ")
    assert tags["hybridtrain.governance.bundle.manifest_sha256"] == second.release.manifest_sha256

    world.targets[1].remove(world.model, "1")  # the cloud target no longer holds v1: rollback re-releases it
    back = rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
    assert (back.from_version, back.to_version, back.previous) == ("2", "1", None)
    assert world.alias(CHAMPION) == "1" and world.alias(PREVIOUS) is None  # no way back to the bad version
    assert world.served() == ["1", "1"] and world.targets[1].versions(world.model) == ["1", "2"]
    assert world.registry.version(world.model, "2").tags["hybridtrain.governance.promotion"] == "rolled-back"

    with pytest.raises(ReleaseRefused, match="has no previous version to roll back to"):
        rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
    assert world.actions() == [("gate", "passed"), ("promotion", "champion"), ("release", "current"),
                               ("gate", "passed"), ("promotion", "champion"), ("release", "current"),
                               ("rollback", "champion")]
    assert world.audit.verify().ok


def test_rollback_moves_previous_to_the_champion_before_it(world):
    for auc in (0.80, 0.82, 0.84):
        world.promote(world.register(auc))
    assert (world.alias(CHAMPION), world.alias(PREVIOUS)) == ("3", "2")
    rollback(world.registry, world.releaser, world.audit, world.model, actor="t")
    assert (world.alias(CHAMPION), world.alias(PREVIOUS)) == ("2", "1") and world.served() == ["2", "2"]


def test_retire_removes_a_version_from_every_target_and_keeps_its_bundle(world):
    for auc in (0.80, 0.82, 0.84):
        world.promote(world.register(auc))
    with pytest.raises(ReleaseRefused, match="v3 is the champion"):
        retire(world.registry, world.releaser, world.audit, world.model, "3", actor="t")
    with pytest.raises(ReleaseRefused, match="has no version 9; versions: 1, 2, 3"):
        retire(world.registry, world.releaser, world.audit, world.model, "9", actor="t")
    out = retire(world.registry, world.releaser, world.audit, world.model, "2", actor="t")
    assert [t.versions(world.model) for t in world.targets] == [["1", "3"], ["1", "3"]]
    assert out.previous == "1" and world.alias(PREVIOUS) == "1"  # v2 was previous: it moves to the one before
    assert world.registry.version(world.model, "2").tags["hybridtrain.status"] == "retired"
    assert world.releaser.archive.has(world.model, "2")
    assert world.actions()[-1] == ("retire", "removed")
    rollback(world.registry, world.releaser, world.audit, world.model, actor="t")
    assert world.alias(CHAMPION) == "1" and world.served() == ["1", "1"]


@pytest.mark.parametrize("gate", list(CASES))
def test_each_failing_gate_leaves_the_alias_and_the_targets_untouched(world, gate):
    world.promote(world.register(0.80))
    inputs = world.register(0.82)  # the same evidence as test_gates' passing case, changed as CASES says
    change, reason = CASES[gate]
    bad = change(dataclasses.replace(inputs, version_tags={**inputs.version_tags}), world.tmp)
    with pytest.raises(GateFailed) as exc:
        world.promote(bad)
    assert exc.value.gate == gate and reason in str(exc.value)
    assert world.alias(CHAMPION) == "1" and world.alias(PREVIOUS) is None and world.served() == ["1", "1"]
    assert [t.versions(world.model) for t in world.targets] == [["1"], ["1"]]  # not even staged
    assert world.registry.version(world.model, "2").tags[f"hybridtrain.gate.{gate}"].startswith("failed: ")
    assert world.actions()[-1] == ("gate", "failed")


def test_a_bundle_tampered_after_the_gates_is_refused_before_the_alias_moves(world):
    world.promote(world.register(0.80))
    inputs = world.register(0.85)
    report = evaluate_gates(inputs)
    assert report.passed
    weights = inputs.bundle.root / "weights" / "model.pt"
    weights.write_bytes(b"swapped after review")
    with pytest.raises(BundleRejected, match="weights/model.pt"):
        promote(world.registry, world.releaser, world.audit, bundle=inputs.bundle, report=report,
                trusted_key=KEY.public, actor="t")
    assert world.alias(CHAMPION) == "1" and world.served() == ["1", "1"]
    assert world.actions()[-1] == ("release", "refused")
