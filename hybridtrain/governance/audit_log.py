"""AuditLog: an append-only, hash-chained record of every placement, sync, tier promotion, gate decision, release, rollback and retirement.

Each record is one line of canonical JSON (sorted keys, no spaces, ASCII) in a JSON-lines file
(default ``.hybridtrain/audit/audit.jsonl`` in the workspace)::

    {"action":"gate","actor":"flow-run/7f3c","at":"2026-05-01T12:00:03.120000Z",
     "hash":"<sha256>","inputs":{...},"outcome":"failed: cost","prev_hash":"<sha256 of seq 41>",
     "seq":42,"subject":"model churn-classifier v7"}

``hash`` is the SHA-256 of the canonical JSON of the record without ``hash``; ``prev_hash`` is
the previous record's ``hash`` (64 zeros for seq 1); ``seq`` counts from 1 without gaps. So
``verify()`` finds, and reports every one of:

- an **edited** record — its content no longer hashes to its ``hash`` (or, if the editor
  recomputed that, the next record's ``prev_hash`` no longer matches);
- a **removed** record in the middle or at the start — a gap in ``seq`` and a broken chain;
- **reordered** records — ``seq`` out of order and broken chain links;
- a **truncated** tail — invisible to the chain itself (a shorter chain is still a valid
  chain), so it is checked against an anchor, below.

**The anchor.** After every append the log's head — ``seq`` and ``hash`` of the last record —
is written to a second file, ``<log>.head`` (atomically: temp file, fsync, rename). A log that
ends before the head's ``seq``, or whose record at that ``seq`` has another hash, was cut or
rewritten. Given a ``SigningKey`` the head is also signed (Ed25519), and ``verify(public_key=)``
checks that signature. ``head()`` returns the anchor so a flow can publish it somewhere the
log's writers cannot rewrite — a tag on the MLflow model version at each promotion, an object in
a write-once bucket — and ``verify(anchors=[...])`` checks the log against each published one.

**Limits, plainly.** The chain proves the records are the ones appended, in order, only
relative to an anchor the attacker could not also rewrite:

- Whoever can write the log *and* the head file can truncate both consistently, or recompute
  the whole chain. A signed head stops a rewrite by someone without the key, but not the
  replay of an *older* signed head together with a log cut back to it; only externally
  published anchors catch that, up to the newest one published.
- Records appended by other means with correct hashes are not distinguishable from ours:
  the chain has no per-record signature. ``verify`` reports records past the head as a
  *warning* (that is also what a crash between a record's fsync and the head update leaves),
  and the next ``append`` re-anchors the head over them.
- Deleting both files leaves nothing to verify, except against external anchors.

Appends are serialized across processes with a lock file (``<log>.lock``) and each record is
fsynced before the head moves; the file is only ever opened for appending, never rewritten.
``append`` refuses to extend a log whose tail does not match its head (cut or edited) and
raises ``AuditLogInvalid``: run ``hybridtrain audit verify`` and investigate first. A log that
cannot be written at all (its directory is a file, no permission) raises ``AuditLogUnwritable``.

**Audit before acting.** A governance action (promotion, rollback, retirement) calls
``check_appendable()`` before it changes anything: it raises exactly what ``append`` would — the
log cannot be written, or does not match its head, or the signing key is unusable — while
reading only and creating nothing (no directory, no key). So an action that could not be
audited is refused instead of done and left unrecorded.

**What verification expects.** ``verify(require_records=True)`` (the workspace's log once its
signing key exists, since the key is made by the first append) treats an empty or missing log
and head as wiped; ``verify(public_key=...)`` treats a missing head as a signature that cannot
be checked. Neither case passes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

from hybridtrain.errors import AuditLogInvalid, AuditLogUnwritable, Problem, TransientError
from hybridtrain.governance.signing_key import SigningKey, VerifyKey

#: What records may say happened. New kinds are added here, so a typo cannot invent one.
ACTIONS = ("placement", "sync", "tier_promotion", "gate", "promotion", "release", "rollback", "retire", "bundle",
           "training_attempt", "recovery", "serve", "canary", "cloud_instances")
GENESIS_HASH = "0" * 64
DEFAULT_RELATIVE_PATH = Path(".hybridtrain") / "audit" / "audit.jsonl"
LOCK_TIMEOUT_S = 60.0
_HEAD_PURPOSE = "hybridtrain-audit-head"
_TAIL_CHUNK = 64 * 1024


class SigningKeySource(Protocol):
    """A signing key made on first use (``audit_key.WorkspaceAuditKey``): a writer signs with it, but a writer
    that appends nothing (a refused action) must not create it."""

    def get(self, *, create: bool) -> SigningKey | None:
        """The key; None when it does not exist yet and ``create`` is false."""
        ...

    def describe(self) -> str:
        """Where the key lives, for messages."""
        ...

    def creation_problem(self) -> str | None:
        """Why the key could not be created now (None: it exists, or it can be)."""
        ...


class _FixedKey:
    def __init__(self, key: SigningKey):
        self._key = key

    def get(self, *, create: bool) -> SigningKey:
        return self._key

    def describe(self) -> str:
        return f"signing key {self._key.key_id}"

    def creation_problem(self) -> None:
        return None


def path_problem(path: Path, *, directory: bool, written: bool = True) -> str | None:
    """Why ``path`` (a file, or a ``directory``) could not be written (``written``) or created now; None when it
    could. Reads only: a missing path is judged by its nearest existing ancestor (a file there, or no write
    permission, means it cannot be created); ``written=False``: it is replaced by a rename, so only its kind
    matters.
    """
    if path.exists() or path.is_symlink():
        if directory and not path.is_dir():
            return f"{path} is not a directory (it is a file or a broken link); move it aside"
        if not directory and path.is_dir():
            return f"{path} is a directory, not a file; move it aside"
        if written and not os.access(path, os.W_OK | (os.X_OK if directory else 0)):
            return f"{path} is not writable by this user; give it write permission"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory, so {path} cannot be created; move it aside"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable by this user, so {path} cannot be created; give it write permission"
    return None


def canonical_json(obj: Any) -> bytes:
    """The one byte form that is hashed: sorted keys, no whitespace, ASCII only, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def record_hash(body: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a record without its ``hash`` field."""
    return hashlib.sha256(canonical_json({k: v for k, v in body.items() if k != "hash"})).hexdigest()


def _utc_text(at: datetime) -> str:
    if at.tzinfo is None:
        raise ValueError("give the record time with a timezone (UTC)")
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AuditRecord(BaseModel):
    """One line of the log: who or what did which action to which subject, with what inputs and outcome."""

    # strict: a record edited from 5 to "5" must not be coerced back into the original.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    seq: int = Field(ge=1, description="Position in the log, from 1, without gaps.")
    at: str = Field(description="UTC time of the append, ISO 8601 with microseconds and Z.")
    actor: str = Field(min_length=1, description="Who or what acted: a user, a flow run, a CLI command.")
    action: str = Field(description=f"One of: {', '.join(ACTIONS)}.")
    subject: str = Field(min_length=1, description="What was acted on, e.g. 'model churn-classifier v7'.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The evidence the action used (JSON).")
    outcome: str = Field(description="What happened, in a line: 'passed', 'failed: cost', 'released to 2 targets'.")
    prev_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")

    def line(self) -> bytes:
        return canonical_json(self.model_dump(mode="json")) + b"\n"


class AuditHead(BaseModel):
    """The anchor: ``seq`` and ``hash`` of the newest record, optionally signed (``key_id``, ``signature``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=0, description="0 for an empty log.")
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    key_id: str | None = None
    signature: str | None = Field(None, description="Base64 Ed25519 signature of signed_message().")

    def signed_message(self) -> bytes:
        return canonical_json({"purpose": _HEAD_PURPOSE, "seq": self.seq, "hash": self.hash})

    def signed_by(self, key: SigningKey) -> AuditHead:
        sig = base64.b64encode(key.sign(self.signed_message())).decode()
        return self.model_copy(update={"key_id": key.key_id, "signature": sig})

    def __str__(self) -> str:
        return f"seq {self.seq} hash {self.hash[:16]}"


@dataclass
class AuditReport:
    """The outcome of ``AuditLog.verify``: ``problems`` are evidence of tampering; ``warnings`` are not."""

    log: str
    records: int
    head: AuditHead | None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_invalid(self) -> None:
        if self.problems:
            raise AuditLogInvalid(self.log, self.problems)


class AuditLog:
    """The audit log at ``path`` (a JSON-lines file) with its head anchor at ``<path>.head``.

    Nothing is created until the first ``append``. ``signing_key`` (optional) signs the head: a key, or a
    ``SigningKeySource`` that makes the key on the first append (so a writer that appends nothing makes none).
    """

    def __init__(self, path: Path | str, *, signing_key: SigningKey | SigningKeySource | None = None,
                 lock_timeout_s: float = LOCK_TIMEOUT_S):
        self.path = Path(path)
        self.head_path = self.path.with_name(self.path.name + ".head")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._key_source: SigningKeySource | None = (
            _FixedKey(signing_key) if isinstance(signing_key, SigningKey) else signing_key)
        self._lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"AuditLog({str(self.path)!r})"

    @classmethod
    def in_workspace(cls, root: Path | str, *, signing_key: SigningKey | SigningKeySource | None = None) -> AuditLog:
        """The workspace's log, ``<root>/.hybridtrain/audit/audit.jsonl``."""
        return cls(Path(root) / DEFAULT_RELATIVE_PATH, signing_key=signing_key)

    # -- writing -----------------------------------------------------------------------------

    def append(self, *, actor: str, action: str, subject: str, inputs: Mapping[str, Any] | None = None,
               outcome: str, at: datetime | None = None) -> AuditRecord:
        """Append one record (and move the head) under the cross-process lock; returns it.

        ``inputs`` must be JSON-compatible (pydantic models, datetimes and paths are converted;
        NaN is refused). Raises ``AuditLogInvalid`` when the log's tail does not match its head.
        """
        if action not in ACTIONS:
            raise ValueError(f"unknown audit action {action!r}; use one of: {', '.join(ACTIONS)}")
        body_inputs = to_jsonable_python(dict(inputs or {}))
        when = _utc_text(at or datetime.now(UTC))
        unwritable = path_problem(self.path.parent, directory=True)
        if unwritable:
            raise AuditLogUnwritable(str(self.path), unwritable)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.lock_path), timeout=self._lock_timeout_s):
                prev = self._checked_tail(self._existing_key())
                body = {"seq": prev.seq + 1, "at": when, "actor": actor, "action": action, "subject": subject,
                        "inputs": body_inputs, "outcome": outcome, "prev_hash": prev.hash}
                try:
                    record = AuditRecord(**body, hash=record_hash(body))
                except ValidationError as exc:
                    raise ValueError(f"audit record is invalid: {exc}") from None
                key = self._key_source.get(create=True) if self._key_source is not None else None
                self._append_line(record.line())
                self._write_head(AuditHead(seq=record.seq, hash=record.hash), key)
        except Timeout:
            raise TransientError(
                f"audit log {self.path} stayed locked for {self._lock_timeout_s:g} s by another process "
                f"(lock file {self.lock_path}); retry"
            ) from None
        except OSError as exc:
            raise AuditLogUnwritable(str(self.path), _os_reason(exc)) from None
        return record

    def check_appendable(self) -> None:
        """Raise now what ``append`` would raise — ``AuditLogUnwritable``, ``AuditLogInvalid`` (the tail does not
        match the head, or the head's signer is not this writer's key), or the key source's error — reading only:
        nothing is created. Call it before an action whose record must not go missing."""
        for path, directory, written in ((self.path.parent, True, True), (self.path, False, True),
                                         (self.head_path, False, False), (self.lock_path, False, True)):
            problem = path_problem(path, directory=directory, written=written)
            if problem:
                raise AuditLogUnwritable(str(self.path), problem)
        if self._key_source is not None and self._key_source.get(create=False) is None:
            problem = self._key_source.creation_problem()
            if problem:
                raise AuditLogUnwritable(str(self.path), f"its head signing key cannot be created: {problem}")
        try:
            self._checked_tail(self._existing_key())
        except OSError as exc:
            raise AuditLogUnwritable(str(self.path), _os_reason(exc)) from None

    def _existing_key(self) -> SigningKey | None:
        return self._key_source.get(create=False) if self._key_source is not None else None

    def _append_line(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_head(self, head: AuditHead, key: SigningKey | None) -> None:
        if key is not None:
            head = head.signed_by(key)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-head-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o640)  # readable like the log itself (mkstemp makes it 0600)
                fh.write(canonical_json(head.model_dump(mode="json")) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.head_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)

    def _checked_tail(self, key: SigningKey | None) -> AuditHead:
        """seq and hash of the last record, after checking it against the head (under the lock); ``key``: the
        writer's existing signing key (None: it signs with none, or with one it has yet to create)."""
        problems: list[Problem] = []
        last = self._last_line()
        head = self._read_head(problems)
        if last is None:
            tail = AuditHead(seq=0, hash=GENESIS_HASH)
        else:
            record, actual = _parse(last, None, problems)
            if record is not None and actual != record.hash:
                problems.append(Problem(f"seq {record.seq}", "the last record was edited: its content does not "
                                                             "hash to its recorded hash"))
            tail = AuditHead(seq=record.seq, hash=record.hash) if record is not None else None
        if tail is not None and head is not None:
            if head.seq > tail.seq:
                problems.append(Problem("head", f"the head anchor says seq {head.seq} but the log ends at seq "
                                                f"{tail.seq}: records were cut off the end"))
            elif head.seq == tail.seq and head.hash != tail.hash:
                problems.append(Problem("head", f"the last record (seq {tail.seq}) does not have the anchored hash: "
                                                "the log was rewritten"))
        if tail is not None and tail.seq > 0 and head is None and not problems:
            problems.append(Problem("head", f"the head anchor {self.head_path.name} is missing, so a cut tail "
                                            "cannot be ruled out"))
        if head is not None and head.seq > 0 and not problems:
            problems += self._signer_problems(head, key)
        if problems or tail is None:
            raise AuditLogInvalid(str(self.path), problems + [Problem(
                "append", "refused; run `hybridtrain audit verify` and investigate before appending")])
        return tail

    def _signer_problems(self, head: AuditHead, key: SigningKey | None) -> list[Problem]:
        """A signed log stays signed by its key: a writer without it, or with another one, must not re-anchor it
        (that would launder a rewritten chain); and a writer with a key does not adopt an unsigned head."""
        if key is None and self._key_source is not None:  # it signs with a key it has not made yet
            if head.signature is not None:
                return [Problem("head", f"the head is signed by {head.key_id}, but this writer's "
                                        f"{self._key_source.describe()} does not exist (deleted?): restore that key; "
                                        "a new one would not match")]
            return [Problem("head", "the head is not signed, but this writer signs: a rewritten log with a fresh "
                                    "unsigned head looks exactly like this")]
        if key is None:
            if head.signature is not None:
                return [Problem("head", f"the head is signed by {head.key_id}; append with that signing key "
                                        "(hybridtrain.governance.audit_key), not without one")]
            return []
        if head.signature is None:
            return [Problem("head", "the head is not signed, but this writer signs: a rewritten log with a fresh "
                                    "unsigned head looks exactly like this")]
        return _signature_problems(head, key.public)

    def _last_line(self) -> bytes | None:
        """The last line (with its newline, if any) without reading the whole file; None when empty."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(self.path, "rb") as fh:
            buf = b""
            pos = size
            while pos > 0:
                step = min(_TAIL_CHUNK, pos)
                pos -= step
                fh.seek(pos)
                buf = fh.read(step) + buf
                cut = buf.rfind(b"\n", 0, len(buf) - 1)
                if cut >= 0:
                    buf = buf[cut + 1:]
                    break
        return buf

    # -- reading -----------------------------------------------------------------------------

    def head(self) -> AuditHead | None:
        """The current anchor (publish it to make truncation detectable beyond the head file)."""
        return self._read_head([])

    def _read_head(self, problems: list[Problem]) -> AuditHead | None:
        try:
            raw = self.head_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            problems.append(Problem("head", f"{self.head_path} cannot be read as the head anchor "
                                            f"({_os_reason(exc)}): it was replaced or damaged"))
            return None
        try:
            return AuditHead.model_validate_json(raw)
        except ValidationError as exc:
            problems.append(Problem("head", f"{self.head_path.name} is not a valid head anchor "
                                            f"({exc.error_count()} error(s)): it was edited or damaged"))
            return None

    def records(self) -> Iterator[AuditRecord]:
        """Every record in file order; raises ``AuditLogInvalid`` on a line that does not parse."""
        if not self.path.exists():
            return
        if not self.path.is_file():
            raise AuditLogInvalid(str(self.path), [Problem("log", "not a file (a directory?): it should be the "
                                                                  "JSON-lines audit log")])
        with open(self.path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                problems: list[Problem] = []
                record, _ = _parse(raw, lineno, problems)
                if record is None:
                    raise AuditLogInvalid(str(self.path), problems)
                yield record

    def verify(self, *, public_key: VerifyKey | None = None, anchors: Iterable[AuditHead] = (),
               require_records: bool = False) -> AuditReport:
        """Check the whole log; return every problem found (see the module docstring for what each means).

        ``public_key``: the head must exist and be signed by it. ``anchors``: published heads the log
        must still contain (same seq, same hash). ``require_records``: records were written here (say,
        the workspace's audit signing key exists), so an empty or missing log and head are a problem.
        """
        problems: list[Problem] = []
        warnings: list[str] = []
        by_seq: dict[int, str] = {}
        expected_seq: int | None = 1
        prev_hash: str | None = GENESIS_HASH
        prev_where = "the start of the log"
        last_seq = 0
        count = 0
        if self.path.exists() and not self.path.is_file():
            problems.append(Problem("log", f"{self.path} is not a file (a directory?): it should be the JSON-lines "
                                           "audit log"))
        elif self.path.exists():
            with open(self.path, "rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    count += 1
                    record, actual = _parse(raw, lineno, problems)
                    if record is None:
                        expected_seq, prev_hash = None, None  # re-synchronize on the next good record
                        continue
                    where = f"seq {record.seq}"
                    if actual != record.hash:
                        problems.append(Problem(where, f"edited: its content hashes to {actual[:16]}… but the "
                                                       f"record says {record.hash[:16]}…", lineno))
                    if expected_seq is not None and record.seq != expected_seq:
                        if record.seq > expected_seq:
                            missing = (f"seq {expected_seq}" if record.seq == expected_seq + 1
                                       else f"seq {expected_seq}..{record.seq - 1}")
                            what = f"{missing} missing: records were removed (or reordered)"
                        else:
                            what = "out of order: records were reordered or duplicated"
                        problems.append(Problem(where, f"expected seq {expected_seq} here; {what}", lineno))
                    if prev_hash is not None and record.prev_hash != prev_hash:
                        problems.append(Problem(where, f"chain broken: prev_hash does not match the hash of "
                                                       f"{prev_where}; a record before it was removed, inserted, "
                                                       "reordered or rewritten", lineno))
                    if record.seq in by_seq:
                        problems.append(Problem(where, "this seq appears twice", lineno))
                    by_seq.setdefault(record.seq, record.hash)
                    expected_seq, prev_hash = record.seq + 1, record.hash
                    prev_where = f"the record before it (seq {record.seq}, line {lineno})"
                    last_seq = record.seq
        head = self._read_head(problems)
        head_damaged = any(p.path in ("head", "log") for p in problems)
        nothing_anchored = head is None or head.seq == 0  # an append never writes a seq-0 head
        if head is None and count and not head_damaged:
            problems.append(Problem("head", f"the head anchor {self.head_path.name} is missing, so a cut tail "
                                            "cannot be ruled out"))
        elif (count == 0 and nothing_anchored and not head_damaged
              and (require_records or (public_key is not None and head is None))):
            state = "empty" if self.path.is_file() else "missing"
            why = ("records were written here (its audit signing key exists)" if require_records
                   else f"a head signed by {public_key.key_id} is required")
            anchored = "is missing" if head is None else "anchors no record (seq 0)"
            problems.append(Problem("log", f"the log is {state} and its head anchor {self.head_path.name} {anchored}, "
                                           f"but {why}: the log and its head were wiped or deleted; restore both from "
                                           "a backup"))
        if head is not None:
            problems += _anchor_problems(head, "head", by_seq, last_seq)
            if head.seq < last_seq:
                warnings.append(
                    f"records after seq {head.seq} (up to {last_seq}) are not covered by the head anchor: a crash "
                    "between an append and the head update, or records appended by something other than AuditLog"
                )
            if public_key is not None:
                problems += _signature_problems(head, public_key)
        for i, anchor in enumerate(anchors):
            problems += _anchor_problems(anchor, f"anchors[{i}]", by_seq, last_seq)
        return AuditReport(log=str(self.path), records=count, head=head, problems=problems, warnings=warnings)


def _os_reason(exc: OSError) -> str:
    """One line for an OSError: what failed, on which path."""
    where = f" ({exc.filename})" if exc.filename else ""
    if isinstance(exc, IsADirectoryError):
        return f"a directory is where a file belongs{where}; move it aside"
    if isinstance(exc, NotADirectoryError):
        return f"a file is where a directory belongs{where}; move it aside"
    return f"{exc.strerror or exc}{where}"


def _parse(raw: bytes, lineno: int | None, problems: list[Problem]) -> tuple[AuditRecord | None, str]:
    """The record on one line and the hash of its content as read (not as re-serialized); problems appended."""
    where = "record" if lineno is not None else "last record"
    if not raw.endswith(b"\n"):
        problems.append(Problem(where, "incomplete (no newline at the end): a write was cut off or the "
                                                  "file was truncated in the middle of a record", lineno))
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        problems.append(Problem(where, "not a JSON record: edited or damaged", lineno))
        return None, ""
    try:
        record = AuditRecord.model_validate(data)
    except ValidationError as exc:
        fields = ", ".join(sorted({".".join(str(x) for x in e["loc"]) or "(record)" for e in exc.errors()}))
        problems.append(Problem(where, f"not a valid audit record (fields: {fields}): edited", lineno))
        return None, ""
    if raw.endswith(b"\n") and raw != record.line():
        problems.append(Problem(f"seq {record.seq}", "the line is not in canonical form: it was rewritten by "
                                                     "something other than AuditLog", lineno))
    try:
        actual = record_hash(data)
    except ValueError:  # NaN or Infinity written into the file by hand
        actual = ""
    return record, actual


def _anchor_problems(anchor: AuditHead, name: str, by_seq: Mapping[int, str], last_seq: int) -> list[Problem]:
    if anchor.seq == 0:
        return []
    if anchor.seq > last_seq:
        lost = f"record {anchor.seq}" if anchor.seq == last_seq + 1 else f"records {last_seq + 1}..{anchor.seq}"
        return [Problem(name, f"anchored at seq {anchor.seq}, but the log ends at seq {last_seq}: {lost} "
                              f"{'was' if anchor.seq == last_seq + 1 else 'were'} cut off the end (truncated)")]
    have = by_seq.get(anchor.seq)
    if have is None:
        return [Problem(name, f"anchored at seq {anchor.seq}, which is not in the log: it was removed")]
    if have != anchor.hash:
        return [Problem(name, f"the record at seq {anchor.seq} has hash {have[:16]}…, but {anchor.hash[:16]}… was "
                              "anchored: the log was rewritten from there")]
    return []


def _signature_problems(head: AuditHead, key: VerifyKey) -> list[Problem]:
    if head.signature is None:
        return [Problem("head", f"the head is not signed, but a signature by {key.key_id} is required")]
    if head.key_id != key.key_id:
        return [Problem("head", f"the head is signed by {head.key_id}, not by the trusted key {key.key_id}")]
    try:
        signature = base64.b64decode(head.signature, validate=True)
    except ValueError:
        return [Problem("head", "the head's signature is not base64: it was edited")]
    if not key.verify(signature, head.signed_message()):
        return [Problem("head", "the head's signature does not match its seq and hash: the head was edited")]
    return []
