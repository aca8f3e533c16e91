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

Every operation appends to the audit log whether it succeeds or is refused at a gate. And no
operation changes anything it could not audit: each checks the log can take its record
(``AuditLog.check_appendable``) before it moves an alias, a tag or a target, and is refused
(``ReleaseRefused``, naming the log and what is wrong with it) when it cannot. The record is
written after the act, so it says what happened; if that append still fails (the disk filled
in between), the error says what was done and that it is unrecorded. A release target whose
path cannot be read or written (a file where its directory belongs) stops the operation with
``ReleaseRefused`` naming the path; what had already changed is audited and repeating the
command after the fix is safe.

Refusals never name a temporary copy of a bundle (the flow's build directory, a copy fetched
for re-release): they name the model version instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hybridtrain.errors import BundleRejected, HybridtrainError, ReleaseRefused
from hybridtrain.governance.audit_log import AuditLog, AuditLogUnwritable
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


T = TypeVar("T")


def _check_auditable(audit: AuditLog, model: str, what: str) -> None:
    """Refuse ``what`` before anything changes when its audit record could not be written."""
    try:
        audit.check_appendable()
    except AuditLogUnwritable as exc:
        raise ReleaseRefused(model, f"{what} refused, nothing was changed, because it could not be audited: {exc}; "
                                    "then run it again") from None


def _record_done(audit: AuditLog, model: str, done: str, **record: Any) -> None:
    """Append the record of an action already done; if that fails now, say plainly that it is done but unrecorded."""
    try:
        audit.append(**record)
    except (HybridtrainError, OSError) as exc:
        raise AuditLogUnwritable(str(audit.path), f"model {model}: {done}, but its audit record could not be "
                                                  f"written ({exc}); record it by hand, and run `hybridtrain audit "
                                                  "verify`") from None


def _is_temporary(name: str) -> bool:
    """A bundle copy in a temporary directory (a build directory, a copy fetched to verify or re-release)."""
    try:
        path = Path(name).resolve()
        return path.is_relative_to(Path(tempfile.gettempdir()).resolve()) and any(
            part.startswith(("hybridtrain-", ".tmp-")) for part in path.parts)
    except (OSError, ValueError):
        return False


def _named(exc: HybridtrainError, what: str) -> HybridtrainError:
    """``exc`` with a temporary bundle path replaced by ``what`` (the model version it is a copy of)."""
    if isinstance(exc, BundleRejected) and _is_temporary(exc.bundle):
        return BundleRejected(what, exc.problems, advice=exc.advice)
    return exc


def _target_io(model: str, doing: str, act: Callable[[], T]) -> T:
    """Run a release step; a target path that cannot be read or written becomes one line naming it."""
    try:
        return act()
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        kind = ("is a file where a directory belongs" if isinstance(exc, NotADirectoryError)
                else "is a directory where a file belongs" if isinstance(exc, IsADirectoryError)
                else f"cannot be used ({exc.strerror or exc})")
        raise ReleaseRefused(model, f"{doing} stopped: the release target path{where} {kind}; fix the target (its "
                                    "path in the spec's promotion.release_targets) and run it again") from None


def promote(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, *, bundle: ModelBundle,
            report: GateReport, trusted_key: VerifyKey, actor: str) -> PromotionOutcome:
    """Move ``champion`` to the bundle's version if every gate passed, and release it (see the module docstring)."""
    model, version = report.model, report.version
    subject = f"model {model} v{version}"
    failing = [r.name for r in report.failures]
    _check_auditable(audit, model, f"promotion of v{version}")
    audit.append(actor=actor, action="gate", subject=subject, inputs=report.as_dict(),
                 outcome="passed" if report.passed else f"failed: {', '.join(failing)}")
    registry.set_version_tags(model, version, report.tags())
    report.raise_if_failed()
    if (bundle.model, bundle.version) != (model, version):
        raise ReleaseRefused(model, f"the bundle is for {bundle.model} v{bundle.version}, the gate report for "
                                    f"v{version}; build the bundle of the version being promoted")
    bundle_name = (bundle.name if not _is_temporary(bundle.name)
                   else f"{model} v{version} (built for this promotion)")
    try:
        bundle.verify(trusted_key)
        _target_io(model, f"releasing v{version}", lambda: releaser.stage(bundle))
    except HybridtrainError as exc:
        exc = _named(exc, bundle_name)
        if isinstance(exc, BundleRejected):
            exc = BundleRejected(exc.bundle, exc.problems,
                                 advice=f"v{version} was not promoted or released. {exc.advice}")
        audit.append(actor=actor, action="release", subject=subject, inputs={"bundle": bundle_name},
                     outcome=f"refused: {exc}")
        raise exc from None
    previous = registry.move_champion(model, version)
    try:
        record = _target_io(model, f"releasing v{version} (the champion alias already moved to it)",
                            lambda: releaser.activate(model, version))
    except HybridtrainError as exc:  # part-way: the alias moved, some targets may not have; on the record
        audit.append(actor=actor, action="promotion", subject=subject,
                     inputs={"previous": previous, "targets": _holdings(releaser, model)},
                     outcome=f"failed part-way: champion -> v{version}, but making it current stopped: {exc}")
        raise
    record = record.model_copy(update={"manifest_sha256": bundle.manifest_sha256})
    registry.set_version_tags(model, version, {
        **record.tags(), PROMOTION_TAG: "champion", "hybridtrain.governance.bundle.manifest_sha256": bundle.manifest_sha256,
        "hybridtrain.governance.bundle.key_id": bundle.key_id, "hybridtrain.promoted_at": _now()})
    done = f"champion moved to v{version}, current on every target"
    _record_done(audit, model, done, actor=actor, action="promotion", subject=subject, inputs={"previous": previous},
                 outcome=f"champion -> v{version}" + (f" (previous v{previous})" if previous else " (first champion)"))
    _record_done(audit, model, done, actor=actor, action="release", subject=subject,
                 inputs=record.model_dump(mode="json"), outcome=f"current on {len(record.targets)} target(s)")
    return PromotionOutcome(model, version, previous, record, report)


def _holdings(releaser: Releaser, model: str) -> list[dict[str, Any]] | str:
    """What each target holds now (the evidence a refusal records); a target that cannot be read says so."""
    try:
        return [h.model_dump(mode="json") for h in releaser.holdings(model)]
    except (HybridtrainError, OSError) as exc:
        return f"unreadable: {exc}"


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
    move = f"rollback v{champion.version} -> v{target.version}"
    _check_auditable(audit, model, move)
    try:
        record = _target_io(model, move, lambda: releaser.restore(model, target.version))
    except HybridtrainError as exc:
        exc = _named(exc, f"{model} v{target.version} (the copy being re-released)")
        if isinstance(exc, BundleRejected):
            exc = BundleRejected(exc.bundle, exc.problems,
                                 advice=f"Nothing was rolled back: the champion is still v{champion.version}. "
                                        f"{exc.advice}")
        audit.append(actor=actor, action="rollback", subject=f"model {model}",
                     inputs={"from": champion.version, "to": target.version,
                             "targets": _holdings(releaser, model)}, outcome=f"refused: {exc}")
        raise exc from None
    registry.set_alias(model, CHAMPION, target.version)
    registry.set_version_tags(model, champion.version, {PROMOTION_TAG: "rolled-back",
                                                        "hybridtrain.rolled_back_at": _now()})
    registry.set_version_tags(model, target.version, record.tags())
    previous = _move_previous(registry, model, target.version)
    _record_done(audit, model, f"champion rolled back v{champion.version} -> v{target.version}, current on every "
                               "target", actor=actor, action="rollback", subject=f"model {model}",
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
    _check_auditable(audit, model, f"retiring v{version}")
    try:
        record = _target_io(model, f"retiring v{version}", lambda: releaser.retire(model, version))
    except ReleaseRefused as exc:
        audit.append(actor=actor, action="retire", subject=f"model {model} v{version}",
                     inputs={"targets": _holdings(releaser, model)}, outcome=f"refused: {exc}")
        raise
    registry.set_version_tags(model, version, {STATUS_TAG: "retired", "hybridtrain.retired_at": _now(),
                                               **record.tags()})
    previous_info = registry.by_alias(model, PREVIOUS)
    previous = previous_info.version if previous_info else None
    if previous == version:
        previous = _move_previous(registry, model, champion.version if champion else version)
    archived = releaser.archive is not None and releaser.archive.has(model, version)
    _record_done(audit, model, f"v{version} retired from every target", actor=actor, action="retire",
                 subject=f"model {model} v{version}",
                 inputs={"release": record.model_dump(mode="json"), "bundle_archived": archived},
                 outcome=f"removed from {len(record.targets)} target(s)"
                         + ("; bundle kept in the archive" if archived else "; no archived bundle"))
    return RetireOutcome(model, version, previous, record)
