"""Promotion: moving a model's ``champion`` alias — forward after its gates pass, back on rollback — with the release targets and the audit log kept in step.

Three operations, each taking the registry, the ``Releaser`` and the ``AuditLog`` as arguments:

- ``promote`` — record the gate report (audit ``gate`` record, ``hybridtrain.gate.*`` version
  tags); stop with ``GateFailed`` if any gate failed (the alias is untouched; the version is tagged
  ``hybridtrain.governance.promotion=not-promoted`` with the reasons); verify the
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

A lifecycle's promotion survives an interruption the same way. Its version is registered carrying the mark
``hybridtrain.governance.promotion.pending`` (``PromotionIntent``: job, run key, final checkpoint, MLflow run, the
champion its evaluation compared against, start time), so no version exists without it, and ``promote(intent=…)``
removes the mark only once the promotion is done (or refused at a gate, tagged ``not-promoted``). A re-run of the
same lifecycle (same job and run key) calls ``settle_pending`` first: the same model (same final checkpoint), with the
champion still the one it was compared against or already moved to it, is finished (``resumed=True``: the recorded
gate verdict stands, the bundle it staged is the one released, each record is written once and carries
``"resumed": true``) instead of registering another version. A different model, or a champion that moved on meanwhile,
leaves the orphan ``abandon``-ed: removed from the targets that had accepted it, tagged
``hybridtrain.status=abandoned`` with the reason (``hybridtrain.status.reason``), recorded once
(``promotion``, ``abandoned: …``). A version whose alias already moved is never abandoned: its promotion is finished
(``finish_promotion``) — by the re-run, or by the next promotion that moves the alias on from it. A rollback or retire
of a marked version ends its promotion (the record names it, ``interrupted_promotion``). ``pending_promotions`` lists
what is unfinished (``hybridtrain status`` shows it).

Refusals never name a temporary copy of a bundle (the flow's build directory, a copy fetched
for re-release): they name the model version instead.
"""

from __future__ import annotations

import dataclasses
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
from hybridtrain.governance.gates import GateReport, GateResult
from hybridtrain.governance.release import Releaser, ReleaseRecord, version_order
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, VersionInfo

PROMOTION_TAG = "hybridtrain.governance.promotion"
STATUS_TAG = "hybridtrain.status"
#: On the version a rollback moves ``champion`` to, while that rollback is unfinished: JSON ``{"from", "started"}``.
ROLLBACK_PENDING_TAG = "hybridtrain.governance.rollback.pending"
#: On the version being retired, while that retire is unfinished: the time it started.
RETIRE_PENDING_TAG = "hybridtrain.governance.retire.pending"
#: On a version a lifecycle registered, from its registration (it is created with the mark) until its promotion is
#: finished — champion, or refused at a gate — or abandoned: JSON, see ``PromotionIntent``.
PROMOTE_PENDING_TAG = "hybridtrain.governance.promotion.pending"
#: Why a version's promotion was abandoned (with ``hybridtrain.status=abandoned``).
ABANDONED_REASON_TAG = "hybridtrain.status.reason"
BUNDLE_SHA_TAG = "hybridtrain.governance.bundle.manifest_sha256"
BUNDLE_KEY_TAG = "hybridtrain.governance.bundle.key_id"


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
class PromotionIntent:
    """Which lifecycle is promoting a version: the ``PROMOTE_PENDING_TAG`` mark the version carries while its
    promotion is unfinished. A re-run of the same lifecycle (same job and run key) with the same model (same final
    checkpoint) finishes that promotion instead of registering another version."""

    job: str
    run_key: str
    checkpoint_sha256: str | None
    run_id: str | None  # the MLflow run that registered the version
    champion: str | None  # the champion its evaluation compared against
    started: str  # identifies its audit records (``inputs.started``)
    version: str | None = None  # the version carrying the mark (None until registered)

    @classmethod
    def new(cls, *, job: str, run_key: str, checkpoint_sha256: str | None, run_id: str | None,
            champion: str | None) -> PromotionIntent:
        return cls(job, run_key, checkpoint_sha256, run_id, champion, _started())

    def tag(self) -> dict[str, str]:
        """The version tag: register the version with it, so no version exists without its mark."""
        return {PROMOTE_PENDING_TAG: json.dumps({
            "job": self.job, "run_key": self.run_key, "checkpoint_sha256": self.checkpoint_sha256,
            "run_id": self.run_id, "champion": self.champion, "started": self.started})}

    @classmethod
    def of(cls, info: VersionInfo) -> PromotionIntent | None:
        """The mark on ``info``; None when it has none (or one that does not parse: edited by hand)."""
        raw = info.tags.get(PROMOTE_PENDING_TAG)
        if not raw:
            return None
        try:
            mark = json.loads(raw)
            return cls(str(mark["job"]), str(mark["run_key"]), mark.get("checkpoint_sha256"), mark.get("run_id"),
                       None if mark.get("champion") is None else str(mark["champion"]), str(mark["started"]),
                       info.version)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def inputs(self) -> dict[str, Any]:
        """What the audit records of this promotion carry to identify it."""
        return {"started": self.started, "job": self.job, "run_key": self.run_key, "mlflow_run_id": self.run_id}


@dataclass(frozen=True)
class PromotionOutcome:
    model: str
    version: str
    previous: str | None
    release: ReleaseRecord
    report: GateReport
    resumed: bool = False  # it finished a promotion an interruption had left half-done


@dataclass(frozen=True)
class AbandonOutcome:
    model: str
    version: str
    reason: str
    removed_from: list[str]


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


def _record_of(audit: AuditLog, action: str, subject: str, started: str, *, outcome: str | None = None) -> Any:
    """The log's record of what the operation that started at ``started`` did (an interruption between its append
    and the removal of its mark), or None. A record of a refusal or a stop part-way (``refused: …``, ``failed …``)
    says it was not done, so it does not count; ``outcome``: only a record whose outcome starts so."""
    try:
        for r in audit.records():
            if r.action == action and r.subject == subject and r.inputs.get("started") == started:
                if outcome is not None and r.outcome.startswith(outcome):
                    return r
                if outcome is None and not r.outcome.startswith(("refused", "failed")):
                    return r
    except AuditLogInvalid:
        pass  # check_appendable passed, so the append can go on; a damaged line is for `audit verify`
    return None


def _recorded(audit: AuditLog, action: str, subject: str, started: str) -> bool:
    return _record_of(audit, action, subject, started) is not None


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
            report: GateReport, trusted_key: VerifyKey, actor: str, intent: PromotionIntent | None = None,
            resumed: bool = False) -> PromotionOutcome:
    """Move ``champion`` to the bundle's version if every gate passed, and release it (see the module docstring).

    ``intent``: the mark the version carries (``PromotionIntent``); its records carry ``inputs.started`` and the mark
    is removed once the promotion is done (or refused at a gate). ``resumed``: the mark was left by an interrupted
    run — what that run already did is not done or recorded again: its gate verdict stands (``report`` is used only
    when none was recorded), the bundle it staged is the one released, and a champion alias it already moved stays.
    """
    model, version = report.model, report.version
    subject = f"model {model} v{version}"
    if intent is not None and intent.version not in (None, version):
        raise ValueError(f"the promotion mark is on v{intent.version}, the gate report for v{version}")
    _check_auditable(audit, model, f"promotion of v{version}")
    champion = registry.by_alias(model, CHAMPION)
    if intent is not None and resumed and champion is not None and champion.version == version:
        # the interrupted run had passed the gates, staged the bundle and moved the alias: finish from there
        return finish_promotion(registry, releaser, audit, model, dataclasses.replace(intent, version=version),
                                actor=actor)
    marked = {**intent.inputs(), **({"resumed": True} if resumed else {})} if intent is not None else {}
    recorded = (_record_of(audit, "gate", subject, intent.started, outcome="")
                if intent is not None and resumed else None)
    if recorded is not None:
        report = GateReport.from_dict(recorded.inputs)  # what was decided (and audited) stands
    else:
        audit.append(actor=actor, action="gate", subject=subject, inputs={**report.as_dict(), **marked},
                     outcome="passed" if report.passed else f"failed: {', '.join(r.name for r in report.failures)}")
    registry.set_version_tags(model, version, report.tags())
    if not report.passed:
        reasons = "; ".join(f"gate {r.name}: {r.reason}" for r in report.failures)
        registry.set_version_tags(model, version, {PROMOTION_TAG: "not-promoted",
                                                   "hybridtrain.promotion.reasons": reasons[:5000]})
        if intent is not None:
            registry.delete_version_tag(model, version, PROMOTE_PENDING_TAG)
        report.raise_if_failed()
    if (bundle.model, bundle.version) != (model, version):
        raise ReleaseRefused(model, f"the bundle is for {bundle.model} v{bundle.version}, the gate report for "
                                    f"v{version}; build the bundle of the version being promoted")
    with tempfile.TemporaryDirectory(prefix="hybridtrain-staged-") as tmp:
        held = releaser.held_copy(model, version, Path(tmp) / "bundle") if intent is not None and resumed else None
        if held is not None:  # release what the interrupted run staged, not a second build of the same version
            bundle = held
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
            audit.append(actor=actor, action="release", subject=subject, inputs={"bundle": bundle_name, **marked},
                         outcome=f"refused: {exc}")
            raise exc from None
        sha, key_id = bundle.manifest_sha256, bundle.key_id
    registry.set_version_tags(model, version, {BUNDLE_SHA_TAG: sha, BUNDLE_KEY_TAG: key_id})
    if champion is not None and champion.version != version:
        other = PromotionIntent.of(champion)
        if other is not None:  # the champion's own promotion was interrupted after its alias moved: finish it first
            finish_promotion(registry, releaser, audit, model, other, actor=actor)
    previous = registry.move_champion(model, version)
    return _complete(registry, releaser, audit, model, version, report, previous, sha, key_id, intent, resumed,
                     actor)


def _complete(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, version: str,
              report: GateReport, previous: str | None, sha: str, key_id: str, intent: PromotionIntent | None,
              resumed: bool, actor: str) -> PromotionOutcome:
    """The rest of a promotion once ``champion`` points at ``version``: every target serves it, the version is tagged
    champion, the promotion and the release are recorded (once) and the mark, if any, is removed."""
    subject = f"model {model} v{version}"
    marked = {**intent.inputs(), **({"resumed": True} if resumed else {})} if intent is not None else {}
    try:
        record = _target_io(model, f"releasing v{version} (the champion alias already moved to it)",
                            lambda: releaser.activate(model, version))
    except HybridtrainError as exc:  # part-way: the alias moved, some targets may not have; on the record
        audit.append(actor=actor, action="promotion", subject=subject,
                     inputs={"previous": previous, "targets": _holdings(releaser, model), **marked},
                     outcome=f"failed part-way: champion -> v{version}, but making it current stopped: {exc}")
        raise
    record = record.model_copy(update={"manifest_sha256": sha or None})
    tags = {**record.tags(), PROMOTION_TAG: "champion", BUNDLE_SHA_TAG: sha, BUNDLE_KEY_TAG: key_id}
    if not (resumed and registry.version(model, version).tags.get("hybridtrain.promoted_at")):
        tags["hybridtrain.promoted_at"] = _now()
    registry.set_version_tags(model, version, {k: v for k, v in tags.items() if v})
    done = f"champion moved to v{version}, current on every target"
    again = intent is not None and resumed
    if not (again and _recorded(audit, "promotion", subject, intent.started)):
        _record_done(audit, model, done, actor=actor, action="promotion", subject=subject,
                     inputs={"previous": previous, **marked},
                     outcome=f"champion -> v{version}" + (f" (previous v{previous})" if previous else " (first champion)"))
    if not (again and _recorded(audit, "release", subject, intent.started)):
        _record_done(audit, model, done, actor=actor, action="release", subject=subject,
                     inputs={**record.model_dump(mode="json"), **marked},
                     outcome=f"current on {len(record.targets)} target(s)")
    if intent is not None:
        registry.delete_version_tag(model, version, PROMOTE_PENDING_TAG)
    return PromotionOutcome(model, version, previous, record, report, resumed=resumed)


def finish_promotion(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str,
                     intent: PromotionIntent, *, actor: str) -> PromotionOutcome:
    """Finish the interrupted promotion ``intent`` marks whose ``champion`` alias already moved to its version (its
    gates passed, its bundle is staged): every target serves it, it is tagged and recorded (``resumed``) once."""
    version = str(intent.version)
    subject = f"model {model} v{version}"
    _check_auditable(audit, model, f"finishing the promotion of v{version}")
    recorded = _record_of(audit, "gate", subject, intent.started, outcome="")
    info = registry.version(model, version)
    report = (GateReport.from_dict(recorded.inputs) if recorded is not None
              else GateReport(model, version, tuple(
                  GateResult(k.removeprefix("hybridtrain.gate."), v.startswith("passed"), v.partition(": ")[2])
                  for k, v in info.tags.items() if k.startswith("hybridtrain.gate."))))
    return _complete(registry, releaser, audit, model, version, report, intent.champion,
                     info.tags.get(BUNDLE_SHA_TAG) or "", info.tags.get(BUNDLE_KEY_TAG) or "", intent, True, actor)


def pending_promotions(registry: ModelRegistry, model: str) -> list[PromotionIntent]:
    """Every unfinished promotion of ``model`` (the versions carrying a readable mark), oldest first."""
    found = [intent for info in registry.versions(model) if (intent := PromotionIntent.of(info)) is not None]
    return sorted(found, key=lambda i: i.started)


def _moved_off(registry: ModelRegistry, model: str, version: str) -> bool:
    """Whether a rollback has taken (or is taking) ``champion`` off ``version``, or a retire is removing it: the
    operation that does clears the version's promotion mark, so a lifecycle re-run leaves it alone."""
    for info in registry.versions(model):
        if info.version == version and (info.tags.get(PROMOTION_TAG) == "rolled-back" or _being_retired(info)):
            return True
        raw = info.tags.get(ROLLBACK_PENDING_TAG)
        if raw:
            try:
                if str(json.loads(raw)["from"]) == version:
                    return True
            except (ValueError, KeyError, TypeError):
                pass
    return False


def settle_pending(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, *, job: str,
                   run_key: str, checkpoint_sha256: str | None, actor: str) -> PromotionIntent | None:
    """Before a lifecycle run promotes: settle the promotions an interrupted run of the same lifecycle (``job`` and
    ``run_key``) left unfinished, and return the one this run finishes with ``promote(intent=…, resumed=True)``.

    That is a version of the same model (its final checkpoint is ``checkpoint_sha256``) whose evaluation compared
    against the champion there is now, or whose alias already moved. A version whose alias moved but whose model is
    not this run's has its promotion finished here (it is being served). Any other is abandoned (``abandon``): the
    re-run trained a different model, or the champion moved on since its gates compared against it.
    """
    mine = [p for p in pending_promotions(registry, model) if (p.job, p.run_key) == (job, run_key)]
    if not mine:
        return None
    champion = registry.by_alias(model, CHAMPION)
    now = champion.version if champion else None
    resume = None
    for intent in reversed(mine):  # the newest first: it is the one to resume
        version = str(intent.version)
        if _moved_off(registry, model, version):
            continue  # the rollback or retire under way removes the mark when it finishes
        same = checkpoint_sha256 is not None and intent.checkpoint_sha256 == checkpoint_sha256
        if now == version:
            if same:
                resume = intent
            else:
                finish_promotion(registry, releaser, audit, model, intent, actor=actor)
        elif same and now == intent.champion and resume is None:
            resume = intent
        elif not same:
            abandon(registry, releaser, audit, model, intent, actor=actor, reason=(
                f"the re-run of run key {run_key} trained a different model (final checkpoint "
                f"{(checkpoint_sha256 or 'unknown')[:12]}, this version's {(intent.checkpoint_sha256 or 'unknown')[:12]})"
                "; it is registered as a new version"))
        elif now != intent.champion:
            was = f"v{intent.champion}" if intent.champion else "no champion"
            abandon(registry, releaser, audit, model, intent, actor=actor, reason=(
                f"the champion moved from {was} to v{now} while its promotion was interrupted, so its gates (which "
                f"compared against {was}) no longer hold; the re-run of run key {run_key} registers its model as a "
                "new version"))
        else:
            abandon(registry, releaser, audit, model, intent, actor=actor,
                    reason=f"a later interrupted promotion of run key {run_key} (v{resume.version if resume else '?'})"
                           " is the one the re-run finishes")
    return resume


def abandon(registry: ModelRegistry, releaser: Releaser, audit: AuditLog, model: str, intent: PromotionIntent, *,
            actor: str, reason: str) -> AbandonOutcome:
    """Close the unfinished promotion ``intent`` marks without promoting: its version is removed from the targets
    that had accepted it (its bundle stays in the archive), tagged ``hybridtrain.status=abandoned`` with ``reason``,
    recorded once (``promotion``, ``abandoned: …``) and unmarked. Its champion alias must not have moved."""
    version = str(intent.version)
    subject = f"model {model} v{version}"
    _check_auditable(audit, model, f"abandoning the promotion of v{version}")
    serving = [t.name for t in releaser.targets if t.current(model) == version]
    champion = registry.by_alias(model, CHAMPION)
    if serving or (champion is not None and champion.version == version):
        raise ReleaseRefused(model, f"v{version} is being served ({', '.join(serving) or 'champion alias'}), so its "
                                    "promotion cannot be abandoned; roll back or promote another version first")
    removed = [t.name for t in releaser.targets
               if _target_io(model, f"removing v{version}", lambda t=t: t.remove(model, version))]
    tags = {STATUS_TAG: "abandoned", ABANDONED_REASON_TAG: reason[:5000], PROMOTION_TAG: "not-promoted",
            "hybridtrain.promotion.reasons": f"abandoned: {reason}"[:5000]}
    if registry.version(model, version).tags.get(STATUS_TAG) != "abandoned":
        tags["hybridtrain.abandoned_at"] = _now()
    registry.set_version_tags(model, version, tags)
    if _record_of(audit, "promotion", subject, intent.started, outcome="abandoned") is None:
        _record_done(audit, model, f"the promotion of v{version} abandoned", actor=actor, action="promotion",
                     subject=subject, inputs={**intent.inputs(), "checkpoint_sha256": intent.checkpoint_sha256,
                                              "removed_from": removed, "holdings": _holdings(releaser, model)},
                     outcome=f"abandoned: {reason}")
    registry.delete_version_tag(model, version, PROMOTE_PENDING_TAG)
    return AbandonOutcome(model, version, reason, removed)


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
    from_info = registry.version(model, from_version)
    interrupted = PromotionIntent.of(from_info)  # its promotion stopped after the alias moved; this ends it
    if from_info.tags.get(PROMOTION_TAG) != "rolled-back":
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
                             **({"interrupted_promotion": interrupted.inputs()} if interrupted else {}),
                             "release": record.model_dump(mode="json")},
                     outcome=f"champion v{from_version} -> v{to_version}; current on {len(record.targets)} "
                             "target(s)")
    if PROMOTE_PENDING_TAG in from_info.tags:
        registry.delete_version_tag(model, from_version, PROMOTE_PENDING_TAG)
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
    interrupted = PromotionIntent.of(info)
    if not resumed or not _recorded(audit, "retire", subject, started):
        _record_done(audit, model, f"v{version} retired from every target", actor=actor, action="retire",
                     subject=subject,
                     inputs={"release": record.model_dump(mode="json"), "bundle_archived": archived,
                             "started": started, **({"resumed": True} if resumed else {}),
                             **({"interrupted_promotion": interrupted.inputs()} if interrupted else {})},
                     outcome=f"removed from {len(record.targets)} target(s)"
                             + ("; bundle kept in the archive" if archived else "; no archived bundle"))
    if PROMOTE_PENDING_TAG in info.tags:  # an unfinished promotion of it ends here
        registry.delete_version_tag(model, version, PROMOTE_PENDING_TAG)
    registry.delete_version_tag(model, version, RETIRE_PENDING_TAG)
    return RetireOutcome(model, version, previous, record, resumed=resumed)
