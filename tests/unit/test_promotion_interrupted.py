"""promote / rollback / retire stopped part-way (Ctrl-C, a killed process) and run again: the re-run finishes the
operation that was interrupted and the audit log ends up with exactly one true record of it — never ``v1 -> v1``,
never twice; a lifecycle's re-run finishes its interrupted promotion instead of registering another version, or, with a
different model, leaves the orphan ``abandoned`` with the reason."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hybridtrain.errors import GateFailed, ReleaseRefused
from hybridtrain.governance.gates import evaluate_gates
from hybridtrain.governance.promotion import (
    BUNDLE_SHA_TAG,
    PROMOTE_PENDING_TAG,
    PROMOTION_TAG,
    RETIRE_PENDING_TAG,
    ROLLBACK_PENDING_TAG,
    STATUS_TAG,
    PromotionIntent,
    pending_promotions,
    promote,
    retire,
    rollback,
    settle_pending,
)
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, Registry
from tests.fixtures.promotion_world import KEY, World

#: What promote, rollback and retire change, in the order they change it: each call is a point an interruption can
#: follow.
REGISTRY_STEPS = ("register", "set_version_tags", "set_alias", "delete_alias", "delete_version_tag", "move_champion")
TARGET_STEPS = ("accept", "set_current", "remove")


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    root = tmp_path_factory.mktemp("mlflow")
    return Registry(f"sqlite:///{root}/mlflow.db", root / "artifacts")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, arriving right after a given step."""


@contextmanager
def interrupted_after(world: World, step: int | None, seen: list[str]) -> Iterator[None]:
    """Raise ``Interrupted`` right after the ``step``-th change (0-based) to the registry, a target or the audit log;
    ``step=None`` interrupts nothing and only lists the changes in ``seen``."""
    patched: list[tuple[Any, str]] = []

    def wrap(obj: Any, name: str) -> None:
        real: Callable[..., Any] = getattr(obj, name)

        def step_then_maybe_stop(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            seen.append(f"{type(obj).__name__}.{name}")
            if step is not None and len(seen) == step + 1:
                raise Interrupted
            return out

        setattr(obj, name, step_then_maybe_stop)
        patched.append((obj, name))

    for name in REGISTRY_STEPS:
        wrap(world.registry, name)
    wrap(world.releaser.archive, "put")
    for target in world.targets:
        for name in TARGET_STEPS:
            wrap(target, name)
    wrap(world.audit, "append")
    try:
        yield
    finally:
        for obj, name in patched:
            delattr(obj, name)  # the instance attribute goes; the class's method is back


def two_champions(registry: Registry, tmp) -> World:
    """v1 then v2 promoted: champion v2, previous v1, both targets serving v2."""
    tmp.mkdir(parents=True, exist_ok=True)
    world = World(registry, tmp)
    world.promote(world.register(0.80))
    world.promote(world.register(0.85))
    assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.served()) == ("2", "1", ["2", "2"])
    return world


def records(world: World, action: str, since: int) -> list[Any]:
    return [r for r in world.audit.records() if r.action == action and r.seq > since]


def pending_marks(world: World) -> dict[str, dict[str, str]]:
    return {v.version: {k: t for k, t in v.tags.items() if k in (ROLLBACK_PENDING_TAG, RETIRE_PENDING_TAG)}
            for v in world.registry.versions(world.model)
            if ROLLBACK_PENDING_TAG in v.tags or RETIRE_PENDING_TAG in v.tags}


def count_steps(registry: Registry, tmp, act: Callable[[World], Any]) -> list[str]:
    world = two_champions(registry, tmp)
    seen: list[str] = []
    with interrupted_after(world, None, seen):
        act(world)
    return seen


def test_a_rollback_interrupted_after_any_step_is_finished_by_the_rerun_and_audited_once(registry, tmp_path):
    steps = count_steps(registry, tmp_path / "dry", lambda w: rollback(w.registry, w.releaser, w.audit, w.model,
                                                                       actor="t"))
    assert "Registry.set_alias" in steps and "AuditLog.append" in steps, steps
    for step in range(len(steps)):
        world = two_champions(registry, tmp_path / f"at-{step}")
        before = world.audit.head().seq
        seen: list[str] = []
        with pytest.raises(Interrupted), interrupted_after(world, step, seen):
            rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
        where = f"interrupted after {seen[-1]} (step {step})"
        if step < len(steps) - 1:
            again = rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
            assert (again.from_version, again.to_version, again.previous) == ("2", "1", None), where
        else:  # it had done everything: there is nothing left to roll back to
            with pytest.raises(ReleaseRefused, match="has no previous version"):
                rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
        assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.served()) == ("1", None, ["1", "1"]), where
        assert world.registry.version(world.model, "2").tags[PROMOTION_TAG] == "rolled-back", where
        assert pending_marks(world) == {}, where
        done = records(world, "rollback", before)
        assert [(r.outcome, r.inputs["from"], r.inputs["to"]) for r in done] == [
            ("champion v2 -> v1; current on 2 target(s)", "2", "1")], where
        assert world.audit.verify().ok, where


def test_a_retire_interrupted_after_any_step_is_finished_by_the_rerun_and_audited_once(registry, tmp_path):
    steps = count_steps(registry, tmp_path / "dry",
                        lambda w: retire(w.registry, w.releaser, w.audit, w.model, "1", actor="t"))
    assert "ObjectStoreTarget.remove" in steps and "AuditLog.append" in steps, steps
    for step in range(len(steps)):
        world = two_champions(registry, tmp_path / f"at-{step}")
        before = world.audit.head().seq
        seen: list[str] = []
        with pytest.raises(Interrupted), interrupted_after(world, step, seen):
            retire(world.registry, world.releaser, world.audit, world.model, "1", actor="cli:ana")
        where = f"interrupted after {seen[-1]} (step {step})"
        if step < len(steps) - 1:
            again = retire(world.registry, world.releaser, world.audit, world.model, "1", actor="cli:ana")
            assert (again.version, again.previous) == ("1", None), where
        assert world.registry.version(world.model, "1").tags[STATUS_TAG] == "retired", where
        assert [t.versions(world.model) for t in world.targets] == [["2"], ["2"]], where
        assert world.alias(PREVIOUS) is None and pending_marks(world) == {}, where
        done = records(world, "retire", before)
        assert [r.outcome for r in done] == ["removed from 2 target(s); bundle kept in the archive"], where
        with pytest.raises(ReleaseRefused, match="v1 is already retired"):
            retire(world.registry, world.releaser, world.audit, world.model, "1", actor="cli:ana")
        assert len(records(world, "retire", before)) == 1, where  # the refused repeat records nothing
        assert world.audit.verify().ok, where


def test_retiring_a_retired_version_again_says_so_and_records_nothing(registry, tmp_path):
    world = two_champions(registry, tmp_path)
    retire(world.registry, world.releaser, world.audit, world.model, "1", actor="t")
    head = world.audit.head()
    with pytest.raises(ReleaseRefused) as exc:
        retire(world.registry, world.releaser, world.audit, world.model, "1", actor="t")
    assert "v1 is already retired (since " in str(exc.value) and "nothing was changed" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert world.audit.head() == head


def test_a_rollback_whose_champion_and_previous_are_the_same_version_is_refused(registry, tmp_path):
    """The state an older hybridtrain's interrupted rollback left: no intent mark, both aliases on one version."""
    world = two_champions(registry, tmp_path)
    world.registry.set_alias(world.model, PREVIOUS, "2")
    head = world.audit.head()
    with pytest.raises(ReleaseRefused) as exc:
        rollback(world.registry, world.releaser, world.audit, world.model, actor="t")
    assert "champion and previous both point at v2" in str(exc.value) and "\n" not in str(exc.value)
    assert world.audit.head() == head and world.served() == ["2", "2"] and world.alias(CHAMPION) == "2"


def test_a_refused_rollback_leaves_no_mark_and_a_later_one_starts_afresh(registry, tmp_path):
    world = two_champions(registry, tmp_path)
    for target in world.targets:  # v1 is left nowhere to re-release it from
        target.remove(world.model, "1")
    world.releaser.archive.store.delete(f"bundles/{world.model}/1.tar")
    with pytest.raises(ReleaseRefused, match="no signed bundle of v1"):
        rollback(world.registry, world.releaser, world.audit, world.model, actor="t")
    assert pending_marks(world) == {} and (world.alias(CHAMPION), world.alias(PREVIOUS)) == ("2", "1")
    refused = records(world, "rollback", 0)
    assert len(refused) == 1 and refused[0].outcome.startswith("refused: ")


def test_a_stale_rollback_mark_is_dropped_once_the_champion_has_moved_on(registry, tmp_path):
    """A rollback interrupted before it moved anything, then a promotion: the next rollback is a new one."""
    world = two_champions(registry, tmp_path)
    world.registry.set_version_tags(world.model, "1", {
        ROLLBACK_PENDING_TAG: json.dumps({"from": "2", "started": "2026-12-02T00:00:00.000000Z"})})
    world.promote(world.register(0.90))
    assert (world.alias(CHAMPION), world.alias(PREVIOUS)) == ("3", "2")
    back = rollback(world.registry, world.releaser, world.audit, world.model, actor="t")
    assert (back.from_version, back.to_version, back.resumed) == ("3", "2", False)
    assert pending_marks(world) == {} and world.served() == ["2", "2"]


# -- a lifecycle's promotion -------------------------------------------------------------------------------------------

JOB = "churn"
CHECKPOINT = "c" * 64  # the final checkpoint of run key "nightly": the re-run resumes from it, so it trains the same model


def lifecycle_promote(world: World, auc: float, *, run_key: str = "nightly", checkpoint: str = CHECKPOINT,
                      actor: str = "flow-run/test") -> Any:
    """What the promote stage does with the registry, targets and audit log (hybridtrain.stages.promotion): settle
    this lifecycle's unfinished promotion, else register the version with its mark; then promote it."""
    intent = settle_pending(world.registry, world.releaser, world.audit, world.model, job=JOB, run_key=run_key,
                            checkpoint_sha256=checkpoint, actor=actor)
    resumed = intent is not None
    if intent is None:
        intent = PromotionIntent.new(job=JOB, run_key=run_key, checkpoint_sha256=checkpoint, run_id=world.run_id,
                                     champion=world.alias(CHAMPION))
        inputs = world.register(auc, creation_tags={**intent.tag(), "auc": str(auc)})
        intent = dataclasses.replace(intent, version=inputs.version)
    else:  # the re-run builds its bundle again: other model files, so another manifest
        inputs = world.inputs(str(intent.version), auc, rebuilt=True)
    return promote(world.registry, world.releaser, world.audit, bundle=inputs.bundle, report=evaluate_gates(inputs),
                   trusted_key=KEY.public, actor=actor, intent=intent, resumed=resumed)


def one_champion(registry: Registry, tmp) -> World:
    """v1 promoted (before promotion marks existed): champion v1 on both targets."""
    tmp.mkdir(parents=True, exist_ok=True)
    world = World(registry, tmp)
    world.promote(world.register(0.80))
    assert (world.alias(CHAMPION), world.served()) == ("1", ["1", "1"])
    return world


def promotion_marks(world: World) -> list[str]:
    return [p.version for p in pending_promotions(world.registry, world.model)]


def version_records(world: World, version: str, since: int) -> list[tuple[str, str]]:
    return [(r.action, r.outcome) for r in world.audit.records()
            if r.seq > since and r.subject == f"model {world.model} v{version}"]


def count_promote_steps(registry: Registry, tmp, auc: float) -> list[str]:
    world = one_champion(registry, tmp)
    seen: list[str] = []
    with interrupted_after(world, None, seen):
        try:
            lifecycle_promote(world, auc)
        except GateFailed:
            pass
    return seen


def test_a_promotion_interrupted_after_any_step_is_finished_by_the_rerun_as_the_same_version_audited_once(
        registry, tmp_path):
    """The re-run of the same lifecycle (same run key, so the same model) never registers a second version: it finishes
    the marked one — the bundle the first run staged is the one released — and each record is written once."""
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    for needed in ("Registry.register", "BundleArchive.put", "Registry.move_champion", "AuditLog.append"):
        assert needed in steps, steps
    for step in range(len(steps)):
        world = one_champion(registry, tmp_path / f"at-{step}")
        before = world.audit.head().seq
        seen: list[str] = []
        with pytest.raises(Interrupted), interrupted_after(world, step, seen):
            lifecycle_promote(world, 0.90)
        where = f"interrupted after {seen[-1]} (step {step})"
        if step < len(steps) - 1:
            assert promotion_marks(world) == ["2"], where  # the version is never without its mark
            again = lifecycle_promote(world, 0.90)
            assert (again.version, again.previous, again.resumed) == ("2", "1", True), where
        assert [v.version for v in world.registry.versions(world.model)] == ["1", "2"], where  # no duplicate
        assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.served()) == ("2", "1", ["2", "2"]), where
        tags = world.registry.version(world.model, "2").tags
        assert tags[PROMOTION_TAG] == "champion" and PROMOTE_PENDING_TAG not in tags, where
        held = {t.verify_held(world.model, "2").manifest_sha256 for t in world.targets}
        assert held == {tags[BUNDLE_SHA_TAG]}, where  # one bundle everywhere, and it is the one the tag names
        assert version_records(world, "2", before) == [
            ("gate", "passed"), ("promotion", "champion -> v2 (previous v1)"),
            ("release", "current on 2 target(s)")], where
        assert promotion_marks(world) == [] and world.audit.verify().ok, where


def test_a_refusal_at_a_gate_interrupted_after_any_step_is_recorded_once_and_registers_nothing_more(
        registry, tmp_path):
    steps = count_promote_steps(registry, tmp_path / "dry", 0.70)  # under the auc threshold of 0.75
    assert "Registry.register" in steps and "Registry.move_champion" not in steps, steps
    for step in range(len(steps)):
        world = one_champion(registry, tmp_path / f"at-{step}")
        before = world.audit.head().seq
        seen: list[str] = []
        with pytest.raises(Interrupted), interrupted_after(world, step, seen):
            lifecycle_promote(world, 0.70)
        where = f"interrupted after {seen[-1]} (step {step})"
        if step < len(steps) - 1:
            with pytest.raises(GateFailed, match="thresholds"):
                lifecycle_promote(world, 0.70)
        assert [v.version for v in world.registry.versions(world.model)] == ["1", "2"], where
        assert (world.alias(CHAMPION), world.served()) == ("1", ["1", "1"]), where
        tags = world.registry.version(world.model, "2").tags
        assert tags[PROMOTION_TAG] == "not-promoted" and "gate thresholds" in tags["hybridtrain.promotion.reasons"]
        assert version_records(world, "2", before) == [("gate", "failed: thresholds, not_worse")], where
        assert promotion_marks(world) == [] and world.audit.verify().ok, where


@pytest.mark.parametrize("after", ["Registry.register", "AuditLog.append", "BundleArchive.put",
                                   "ObjectStoreTarget.accept"])
def test_a_rerun_that_trains_a_different_model_leaves_the_orphan_abandoned_with_the_reason(registry, tmp_path, after):
    """Before the alias moved: the orphan is taken off the targets that had accepted it, tagged abandoned with why and
    recorded once; the re-run's model is promoted as a new version."""
    world = one_champion(registry, tmp_path)
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    before = world.audit.head().seq
    seen: list[str] = []
    with pytest.raises(Interrupted), interrupted_after(world, steps.index(after), seen):
        lifecycle_promote(world, 0.90)
    out = lifecycle_promote(world, 0.92, checkpoint="d" * 64)  # its checkpoints were gone: it trained afresh
    assert (out.version, out.previous, out.resumed) == ("3", "1", False)
    assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.served()) == ("3", "1", ["3", "3"])
    orphan = world.registry.version(world.model, "2").tags
    assert orphan[STATUS_TAG] == "abandoned" and PROMOTE_PENDING_TAG not in orphan
    assert "trained a different model (final checkpoint dddddddddddd, this version's cccccccccccc)" in \
        orphan["hybridtrain.status.reason"]
    assert [t.versions(world.model) for t in world.targets] == [["1", "3"], ["1", "3"]]
    abandoned = [o for a, o in version_records(world, "2", before) if a == "promotion"]
    assert len(abandoned) == 1 and abandoned[0].startswith("abandoned: the re-run of run key nightly trained a")
    assert promotion_marks(world) == [] and world.audit.verify().ok
    lifecycle_promote(world, 0.95, checkpoint="e" * 64)  # settled once: nothing of v2 is done or recorded again
    assert len([o for a, o in version_records(world, "2", before) if a == "promotion"]) == 1


def test_a_promotion_stopped_after_its_alias_moved_is_finished_even_when_the_rerun_trains_another_model(
        registry, tmp_path):
    world = one_champion(registry, tmp_path)
    before = world.audit.head().seq
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    with pytest.raises(Interrupted), interrupted_after(world, steps.index("Registry.move_champion"), []):
        lifecycle_promote(world, 0.90)
    assert world.alias(CHAMPION) == "2" and world.served() == ["1", "1"]  # the alias moved, no target did
    out = lifecycle_promote(world, 0.95, checkpoint="d" * 64)
    assert (out.version, out.previous) == ("3", "2")
    assert (world.alias(CHAMPION), world.alias(PREVIOUS), world.served()) == ("3", "2", ["3", "3"])
    assert world.registry.version(world.model, "2").tags[PROMOTION_TAG] == "champion"  # it was; rollback finds it
    assert version_records(world, "2", before) == [
        ("gate", "passed"), ("promotion", "champion -> v2 (previous v1)"), ("release", "current on 2 target(s)")]
    assert promotion_marks(world) == [] and world.audit.verify().ok
    back = rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
    assert (back.from_version, back.to_version) == ("3", "2")


def test_another_lifecycle_promoting_past_an_interrupted_champion_finishes_its_promotion_first(registry, tmp_path):
    world = one_champion(registry, tmp_path)
    before = world.audit.head().seq
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    with pytest.raises(Interrupted), interrupted_after(world, steps.index("Registry.move_champion"), []):
        lifecycle_promote(world, 0.90)
    out = lifecycle_promote(world, 0.95, run_key="weekly", checkpoint="d" * 64)
    assert (out.version, out.previous, world.alias(PREVIOUS), world.served()) == ("3", "2", "2", ["3", "3"])
    promoted = [r for r in world.audit.records() if r.seq > before and r.action == "promotion"]
    assert [(r.subject.rsplit(" ", 1)[1], r.inputs.get("resumed")) for r in promoted] == [("v2", True), ("v3", None)]
    assert promotion_marks(world) == [] and world.audit.verify().ok


def test_an_interrupted_promotion_whose_champion_moved_on_meanwhile_is_abandoned_not_resumed(registry, tmp_path):
    """Its gates compared against v1; v3 became champion since: finishing it would skip the comparison with v3."""
    world = one_champion(registry, tmp_path)
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    with pytest.raises(Interrupted), interrupted_after(world, steps.index("BundleArchive.put"), []):
        lifecycle_promote(world, 0.90)
    lifecycle_promote(world, 0.85, run_key="weekly", checkpoint="d" * 64)  # another lifecycle: v3
    out = lifecycle_promote(world, 0.90)
    assert (out.version, out.previous, out.resumed) == ("4", "3", False)
    orphan = world.registry.version(world.model, "2").tags
    assert orphan[STATUS_TAG] == "abandoned" and "the champion moved from v1 to v3" in orphan["hybridtrain.status.reason"]
    assert promotion_marks(world) == [] and world.served() == ["4", "4"]


def test_a_rollback_of_a_champion_whose_promotion_was_interrupted_ends_that_promotion(registry, tmp_path):
    world = one_champion(registry, tmp_path)
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    with pytest.raises(Interrupted), interrupted_after(world, steps.index("Registry.move_champion"), []):
        lifecycle_promote(world, 0.90)
    back = rollback(world.registry, world.releaser, world.audit, world.model, actor="cli:ana")
    assert (back.from_version, back.to_version, world.served()) == ("2", "1", ["1", "1"])
    assert promotion_marks(world) == []
    record = list(world.audit.records())[-1]
    assert record.action == "rollback" and record.inputs["interrupted_promotion"]["run_key"] == "nightly"
    assert settle_pending(world.registry, world.releaser, world.audit, world.model, job=JOB, run_key="nightly",
                          checkpoint_sha256=CHECKPOINT, actor="t") is None  # the re-run does not bring v2 back


def test_retiring_a_version_whose_promotion_was_interrupted_ends_that_promotion(registry, tmp_path):
    world = one_champion(registry, tmp_path)
    steps = count_promote_steps(registry, tmp_path / "dry", 0.90)
    with pytest.raises(Interrupted), interrupted_after(world, steps.index("ObjectStoreTarget.accept"), []):
        lifecycle_promote(world, 0.90)
    retire(world.registry, world.releaser, world.audit, world.model, "2", actor="cli:ana")
    assert promotion_marks(world) == [] and [t.versions(world.model) for t in world.targets] == [["1"], ["1"]]
    assert list(world.audit.records())[-1].inputs["interrupted_promotion"]["run_key"] == "nightly"
