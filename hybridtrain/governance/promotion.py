"""Promotion: moving a model's ``champion`` alias — forward after its gates pass, back on rollback — with the release targets and the audit log kept in step.

Three operations, each taking the registry, the ``Releaser`` and the ``AuditLog`` as arguments:

- ``promote`` — record the gate report (audit ``gate`` record, ``hybridtrain.gate.*`` version
  tags); stop with ``GateFailed`` if any gate failed (the alias is untouched); verify the
  bundle; every target accepts it (each verifies it again); move ``champion`` (the old one
  becomes ``previous``); point every target at it; audit ``promotion`` and ``release``.
- ``rollback`` — ``champion`` goes back to ``previous``: the previous version is re-released
  to every target that lacks it (from the bundle archive) and made current everywhere, the
  alias moves, the rolled-back version is tagged ``hybridtrain.governance.promotion=rolled-back``, and
  ``previous`` moves to the newest earlier version that was champion and is not retired (or
  is removed when there is none, so a second rollback cannot bring the bad version back).
- ``retire`` — a version that is not the champion is removed from every target and tagged
  ``hybridtrain.status=retired``; its bundle stays in the archive as evidence. If it was
  ``previous``, ``previous`` moves as above.

Every operation appends to the audit log whether it succeeds or is refused at a gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from hybridtrain.errors import HybridtrainError, ReleaseRefused
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.bundle import ModelBundle
from hybridtrain.governance.gates import GateReport
from hybridtrain.governance.release import Releaser, ReleaseRecord, version_order
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, VersionInfo

PROMOTION_TAG = "hybridtrain.governance.promotion"
STATUS_TAG = "hybridtrain.status"


class ModelRegistry(Protocol):
    """The part of ``hybridtrain.tracking.model_registry.Registry`` these operations use."""

    def version(self, name: str, version: str) -> VersionInfo: ...

    def versions(self, name: str) -> list[VersionInfo]: ...

    def by_alias(self, name: str, alias: str) -> VersionInfo | None: ...

    def move_champion(self, name: str, version: str) -> str | None: ...

    def set_alias(self, name: str, alias: str, version: str) -> None: ...

    def delete_alias(self, name: str, alias: str) -> None: ...

    def set_version_tags(self, name: str, version: str, tags: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class PromotionOutcome:
    model: str
    version: str
    previous: str | None
    release: ReleaseRecord
    report: GateReport


@dataclass(frozen=True)
class RollbackOutcome:
    model: str
    from_version: str
    to_version: str
    previous: str | None
    release: ReleaseRecord


@dataclass(frozen=True)
class RetireOutcome:
    model: str
    version: str
    previous: str | None
    release: ReleaseRecord


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def promote(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, *, bundle: ModelBundle,
            report: GateReport, trusted_key: VerifyKey, actor: str) -> PromotionOutcome:
    """Move ``champion`` to the bundle's version if every gate passed, and release it (see the module docstring)."""
    model, version = report.model, report.version
    subject = f"model {model} v{version}"
    failing = [r.name for r in report.failures]
    audit.append(actor=actor, action="gate", subject=subject, inputs=report.as_dict(),
                 outcome="passed" if report.passed else f"failed: {', '.join(failing)}")
    registry.set_version_tags(model, version, report.tags())
    report.raise_if_failed()
    if (bundle.model, bundle.version) != (model, version):
        raise ReleaseRefused(model, f"the bundle is for {bundle.model} v{bundle.version}, the gate report for "
                                    f"v{version}; build the bundle of the version being promoted")
    try:
        bundle.verify(trusted_key)
        releaser.stage(bundle)
    except HybridtrainError as exc:
        audit.append(actor=actor, action="release", subject=subject, inputs={"bundle": str(bundle.root)},
                     outcome=f"refused: {exc}")
        raise
    previous = registry.move_champion(model, version)
    record = releaser.activate(model, version).model_copy(update={"manifest_sha256": bundle.manifest_sha256})
    registry.set_version_tags(model, version, {
        **record.tags(), PROMOTION_TAG: "champion", "hybridtrain.governance.bundle.manifest_sha256": bundle.manifest_sha256,
        "hybridtrain.governance.bundle.key_id": bundle.key_id, "hybridtrain.promoted_at": _now()})
    audit.append(actor=actor, action="promotion", subject=subject, inputs={"previous": previous},
                 outcome=f"champion -> v{version}" + (f" (previous v{previous})" if previous else " (first champion)"))
    audit.append(actor=actor, action="release", subject=subject, inputs=record.model_dump(mode="json"),
                 outcome=f"current on {len(record.targets)} target(s)")
    return PromotionOutcome(model, version, previous, record, report)


def _earlier_champion(registry: ModelRegistry, model: str, before: str) -> str | None:
    """The newest version older than ``before`` that was champion and is neither retired nor rolled back."""
    candidates = [v for v in registry.versions(model)
                  if version_order(v.version) < version_order(before)
                  and v.tags.get(PROMOTION_TAG) == "champion" and v.tags.get(STATUS_TAG) != "retired"]
    return max(candidates, key=lambda v: version_order(v.version)).version if candidates else None


def _move_previous(registry: ModelRegistry, model: str, champion: str) -> str | None:
    previous = _earlier_champion(registry, model, champion)
    if previous is None:
        registry.delete_alias(model, PREVIOUS)
    else:
        registry.set_alias(model, PREVIOUS, previous)
    return previous


def rollback(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, *,
             actor: str) -> RollbackOutcome:
    """Move ``champion`` back to ``previous`` and re-release that version everywhere."""
    champion = registry.by_alias(model, CHAMPION)
    if champion is None:
        raise ReleaseRefused(model, "has no champion, so there is nothing to roll back")
    target = registry.by_alias(model, PREVIOUS)
    if target is None:
        raise ReleaseRefused(model, f"has no previous version to roll back to (v{champion.version} is the only "
                                    "champion it has had, or earlier ones were retired); promote another version "
                                    "instead")
    if target.tags.get(STATUS_TAG) == "retired":
        raise ReleaseRefused(model, f"previous version v{target.version} was retired; promote another version instead")
    try:
        record = releaser.restore(model, target.version)
    except HybridtrainError as exc:
        audit.append(actor=actor, action="rollback", subject=f"model {model}",
                     inputs={"from": champion.version, "to": target.version}, outcome=f"refused: {exc}")
        raise
    registry.set_alias(model, CHAMPION, target.version)
    registry.set_version_tags(model, champion.version, {PROMOTION_TAG: "rolled-back",
                                                        "hybridtrain.rolled_back_at": _now()})
    registry.set_version_tags(model, target.version, record.tags())
    previous = _move_previous(registry, model, target.version)
    audit.append(actor=actor, action="rollback", subject=f"model {model}",
                 inputs={"from": champion.version, "to": target.version, "previous": previous,
                         "release": record.model_dump(mode="json")},
                 outcome=f"champion v{champion.version} -> v{target.version}; current on {len(record.targets)} "
                         "target(s)")
    return RollbackOutcome(model, champion.version, target.version, previous, record)


def retire(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, version: str, *,
           actor: str) -> RetireOutcome:
    """Remove ``version`` from every release target and mark it retired (its bundle stays archived)."""
    version = str(version)
    known = [v.version for v in registry.versions(model)]
    if version not in known:
        raise ReleaseRefused(model, f"has no version {version}; versions: {', '.join(known) or 'none'}")
    champion = registry.by_alias(model, CHAMPION)
    if champion is not None and champion.version == version:
        raise ReleaseRefused(model, f"v{version} is the champion (it is being served); roll back or promote another "
                                    "version before retiring it")
    record = releaser.retire(model, version)
    registry.set_version_tags(model, version, {STATUS_TAG: "retired", "hybridtrain.retired_at": _now(),
                                               **record.tags()})
    previous_info = registry.by_alias(model, PREVIOUS)
    previous = previous_info.version if previous_info else None
    if previous == version:
        previous = _move_previous(registry, model, champion.version if champion else version)
    archived = releaser.archive is not None and releaser.archive.has(model, version)
    audit.append(actor=actor, action="retire", subject=f"model {model} v{version}",
                 inputs={"release": record.model_dump(mode="json"), "bundle_archived": archived},
                 outcome=f"removed from {len(record.targets)} target(s)"
                         + ("; bundle kept in the archive" if archived else "; no archived bundle"))
    return RetireOutcome(model, version, previous, record)
