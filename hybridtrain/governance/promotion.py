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

An interrupted ``rollback`` or ``retire`` (Ctrl-C, a killed process) is finished by running it again,
and audited once, as what was asked. Before either moves a target or an alias it marks its intent on
the registry version it acts on — ``hybridtrain.governance.rollback.pending`` on the version rolled back
to (naming the one rolled back from), ``hybridtrain.governance.retire.pending`` on the version being
retired — and it removes the mark only after its audit record is written. Run again while a mark is
there, the command completes *that* operation (every step is idempotent), records it with
``"resumed": true`` unless its record (found by the mark's start time, ``inputs.started``) is already
in the log, and clears the mark. So a rollback of v2 stopped after ``champion`` moved to v1 is
recorded, on the re-run, as ``champion v2 -> v1``, never as ``v1 -> v1``; a rollback whose
``champion`` and ``previous`` are the same version, with no mark, is refused; retiring a version
already retired is refused and records nothing.

Refusals never name a temporary copy of a bundle (the flow's build directory, a copy fetched
for re-release): they name the model version instead.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hybridtrain.errors import BundleRejected, HybridtrainError, ReleaseRefused
from hybridtrain.governance.audit_log import AuditLog, AuditLogInvalid, AuditLogUnwritable
from hybridtrain.governance.bundle import ModelBundle
from hybridtrain.governance.gates import GateReport
from hybridtrain.governance.release import Releaser, ReleaseRecord, version_order
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, VersionInfo

PROMOTION_TAG = "hybridtrain.governance.promotion"
STATUS_TAG = "hybridtrain.status"
#: On the version a rollback moves ``champion`` to, while that rollback is unfinished: JSON ``{"from", "started"}``.
ROLLBACK_PENDING_TAG = "hybridtrain.governance.rollback.pending"
#: On the version being retired, while that retire is unfinished: the time it started.
RETIRE_PENDING_TAG = "hybridtrain.governance.retire.pending"


class ModelRegistry(Protocol):
    """The part of ``hybridtrain.tracking.model_registry.Registry`` these operations use."""

    def version(self, name: str, version: str) -> VersionInfo: ...

    def versions(self, name: str) -> list[VersionInfo]: ...

    def by_alias(self, name: str, alias: str) -> VersionInfo | None: ...

    def move_champion(self, name: str, version: str) -> str | None: ...

    def set_alias(self, name: str, alias: str, version: str) -> None: ...

    def delete_alias(self, name: str, alias: str) -> None: ...

    def set_version_tags(self, name: str, version: str, tags: Mapping[str, Any]) -> None: ...

    def delete_version_tag(self, name: str, version: str, key: str) -> None: ...


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
    resumed: bool = False  # it finished a rollback an interruption had left half-done


@dataclass(frozen=True)
class RetireOutcome:
    model: str
    version: str
    previous: str | None
    release: ReleaseRecord
    resumed: bool = False  # it finished a retire an interruption had left half-done


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _started() -> str:
    """The start time an intent mark carries (microseconds: it identifies the operation's audit record)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _recorded(audit: AuditLog, action: str, subject: str, started: str) -> bool:
    """Whether the log already holds the record of the operation that started at ``started`` (an interruption
    between its append and the removal of its mark)."""
    try:
        return any(r.action == action and r.subject == subject and r.inputs.get("started") == started
                   for r in audit.records())
    except AuditLogInvalid:
        return False  # check_appendable passed, so the append can go on; a damaged line is for `audit verify`


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
    """The newest version older than ``before`` that was champion and is neither retired (nor being retired) nor
    rolled back."""
    candidates = [v for v in registry.versions(model)
                  if version_order(v.version) < version_order(before)
                  and v.tags.get(PROMOTION_TAG) == "champion" and v.tags.get(STATUS_TAG) != "retired"
                  and not v.tags.get(RETIRE_PENDING_TAG)]
    return max(candidates, key=lambda v: version_order(v.version)).version if candidates else None


def _move_previous(registry: ModelRegistry, model: str, champion: str) -> str | None:
    previous = _earlier_champion(registry, model, champion)
    if previous is None:
        registry.delete_alias(model, PREVIOUS)
    else:
        registry.set_alias(model, PREVIOUS, previous)
    return previous



def _being_retired(info: VersionInfo) -> bool:
    return info.tags.get(STATUS_TAG) == "retired" or bool(info.tags.get(RETIRE_PENDING_TAG))


def _rollback_marks(registry: ModelRegistry, model: str,
                    champion: str) -> tuple[tuple[VersionInfo, str, str] | None, list[str]]:
    """The unfinished rollback a re-run completes — (version rolled back to, version rolled back from, start) —
    and the versions whose marks are stale: ``champion`` has since moved off both versions (a promotion), the
    mark does not parse, or the version rolled back to has been retired."""
    live: list[tuple[VersionInfo, str, str]] = []
    stale: list[str] = []
    for info in registry.versions(model):
        raw = info.tags.get(ROLLBACK_PENDING_TAG)
        if not raw:
            continue
        try:
            mark = json.loads(raw)
            frm, started = str(mark["from"]), str(mark["started"])
        except (ValueError, KeyError, TypeError):
            stale.append(info.version)
            continue
        if champion in (frm, info.version) and not (champion == frm and _being_retired(info)):
            live.append((info, frm, started))
        else:
            stale.append(info.version)
    live.sort(key=lambda m: m[2])
    stale += [m[0].version for m in live[:-1]]  # at most one rollback is unfinished; the newest wins
    return (live[-1] if live else None), stale


def rollback(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, *,
             actor: str) -> RollbackOutcome:
    """Move ``champion`` back to ``previous`` and re-release that version everywhere; run again after an
    interruption, finish the rollback that was interrupted (see the module docstring)."""
    champion = registry.by_alias(model, CHAMPION)
    if champion is None:
        raise ReleaseRefused(model, "has no champion, so there is nothing to roll back")
    pending, stale = _rollback_marks(registry, model, champion.version)
    if pending is not None:
        target, from_version, started = pending
    else:
        found = registry.by_alias(model, PREVIOUS)
        if found is None:
            raise ReleaseRefused(model, f"has no previous version to roll back to (v{champion.version} is the only "
                                        "champion it has had, or earlier ones were retired); promote another version "
                                        "instead")
        target = found
        if target.version == champion.version:
            raise ReleaseRefused(model, f"champion and previous both point at v{champion.version}, so there is "
                                        f"nothing to roll back to (v{champion.version} is already the champion); "
                                        "promote another version, or point the previous alias at the one to go "
                                        "back to")
        if target.tags.get(STATUS_TAG) == "retired":
            raise ReleaseRefused(model, f"previous version v{target.version} was retired; promote another version "
                                        "instead")
        if target.tags.get(RETIRE_PENDING_TAG):
            raise ReleaseRefused(model, f"previous version v{target.version} is being retired (a retire was "
                                        f"interrupted); finish it with `hybridtrain retire {model} {target.version}`, "
                                        "or promote another version instead")
        from_version, started = champion.version, _started()
    to_version = target.version
    move = f"rollback v{from_version} -> v{to_version}"
    _check_auditable(audit, model, move)
    for version in stale:
        registry.delete_version_tag(model, version, ROLLBACK_PENDING_TAG)
    if pending is None:  # the intent, before anything it names moves
        registry.set_version_tags(model, to_version, {
            ROLLBACK_PENDING_TAG: json.dumps({"from": from_version, "started": started})})
    alias_moved = champion.version == to_version
    try:
        record = _target_io(model, move, lambda: releaser.restore(model, to_version))
    except HybridtrainError as exc:
        exc = _named(exc, f"{model} v{to_version} (the copy being re-released)")
        if isinstance(exc, BundleRejected):
            state = (f"The champion already points at v{to_version} (an interrupted rollback); run it again after "
                     "the fix to finish it." if alias_moved
                     else f"Nothing was rolled back: the champion is still v{from_version}.")
            exc = BundleRejected(exc.bundle, exc.problems, advice=f"{state} {exc.advice}")
        audit.append(actor=actor, action="rollback", subject=f"model {model}",
                     inputs={"from": from_version, "to": to_version, "started": started,
                             "targets": _holdings(releaser, model)}, outcome=f"refused: {exc}")
        if not alias_moved:  # the registry is as it was: a later rollback starts afresh
            registry.delete_version_tag(model, to_version, ROLLBACK_PENDING_TAG)
        raise exc from None
    registry.set_alias(model, CHAMPION, to_version)
    rolled_back = {PROMOTION_TAG: "rolled-back"}
    if registry.version(model, from_version).tags.get(PROMOTION_TAG) != "rolled-back":
        rolled_back["hybridtrain.rolled_back_at"] = _now()
    registry.set_version_tags(model, from_version, rolled_back)
    registry.set_version_tags(model, to_version, record.tags())
    previous = _move_previous(registry, model, to_version)
    subject = f"model {model}"
    if pending is None or not _recorded(audit, "rollback", subject, started):
        _record_done(audit, model, f"champion rolled back v{from_version} -> v{to_version}, current on every "
                                   "target", actor=actor, action="rollback", subject=subject,
                     inputs={"from": from_version, "to": to_version, "previous": previous, "started": started,
                             **({"resumed": True} if pending is not None else {}),
                             "release": record.model_dump(mode="json")},
                     outcome=f"champion v{from_version} -> v{to_version}; current on {len(record.targets)} "
                             "target(s)")
    registry.delete_version_tag(model, to_version, ROLLBACK_PENDING_TAG)
    return RollbackOutcome(model, from_version, to_version, previous, record, resumed=pending is not None)


def retire(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, version: str, *,
           actor: str) -> RetireOutcome:
    """Remove ``version`` from every release target and mark it retired (its bundle stays archived); run again
    after an interruption, finish that retire (see the module docstring)."""
    version = str(version)
    versions = registry.versions(model)
    info = next((v for v in versions if v.version == version), None)
    if info is None:
        raise ReleaseRefused(model, f"has no version {version}; versions: "
                                    f"{', '.join(v.version for v in versions) or 'none'}")
    started = info.tags.get(RETIRE_PENDING_TAG) or None
    resumed = started is not None
    if not resumed and info.tags.get(STATUS_TAG) == "retired":
        since = info.tags.get("hybridtrain.retired_at")
        raise ReleaseRefused(model, f"v{version} is already retired" + (f" (since {since})" if since else "")
                             + "; nothing was changed")
    champion = registry.by_alias(model, CHAMPION)
    if champion is not None and champion.version == version:
        raise ReleaseRefused(model, f"v{version} is the champion (it is being served); roll back or promote another "
                                    "version before retiring it")
    _check_auditable(audit, model, f"retiring v{version}")
    subject = f"model {model} v{version}"
    if started is None:  # the intent, before any target changes
        started = _started()
        registry.set_version_tags(model, version, {RETIRE_PENDING_TAG: started})
    try:
        record = _target_io(model, f"retiring v{version}", lambda: releaser.retire(model, version))
    except ReleaseRefused as exc:
        audit.append(actor=actor, action="retire", subject=subject,
                     inputs={"targets": _holdings(releaser, model), "started": started}, outcome=f"refused: {exc}")
        if not resumed:  # nothing is tagged yet: a later retire starts afresh
            registry.delete_version_tag(model, version, RETIRE_PENDING_TAG)
        raise
    tags = {STATUS_TAG: "retired", **record.tags()}
    if info.tags.get(STATUS_TAG) != "retired":
        tags["hybridtrain.retired_at"] = _now()
    registry.set_version_tags(model, version, tags)
    previous_info = registry.by_alias(model, PREVIOUS)
    previous = previous_info.version if previous_info else None
    if previous == version:
        previous = _move_previous(registry, model, champion.version if champion else version)
    archived = releaser.archive is not None and releaser.archive.has(model, version)
    if not resumed or not _recorded(audit, "retire", subject, started):
        _record_done(audit, model, f"v{version} retired from every target", actor=actor, action="retire",
                     subject=subject,
                     inputs={"release": record.model_dump(mode="json"), "bundle_archived": archived,
                             "started": started, **({"resumed": True} if resumed else {})},
                     outcome=f"removed from {len(record.targets)} target(s)"
                             + ("; bundle kept in the archive" if archived else "; no archived bundle"))
    registry.delete_version_tag(model, version, RETIRE_PENDING_TAG)
    return RetireOutcome(model, version, previous, record, resumed=resumed)
