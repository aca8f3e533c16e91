"""rollback / retire stopped part-way (Ctrl-C, a killed process) and run again: the re-run finishes the operation that
was interrupted and the audit log ends up with exactly one true record of it — never ``v1 -> v1``, never twice."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hybridtrain.errors import ReleaseRefused
from hybridtrain.governance.promotion import (
    PROMOTION_TAG,
    RETIRE_PENDING_TAG,
    ROLLBACK_PENDING_TAG,
    STATUS_TAG,
    retire,
    rollback,
)
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, Registry
from tests.fixtures.promotion_world import World

#: What rollback and retire change, in the order they change it: each call is a point an interruption can follow.
REGISTRY_STEPS = ("set_version_tags", "set_alias", "delete_alias", "delete_version_tag", "move_champion")
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
