"""Errors: what went wrong and what the caller should do about it.

Each class tells the orchestrator how to react:

- ``SpecError`` / ``DataError`` — the user must fix the spec or the data; never retried.
- ``DatasetMissing`` — the pinned dataset is nowhere a run could read it; one line naming the command
  that makes or fetches it (``hybridtrain run`` checks before it starts anything).
- ``LeakDetected`` — a raw sensitive value survived anonymization; the sync is refused.
- ``NoFeasiblePlacement`` — every candidate site was rejected; carries each site and the rule.
- ``SiteUnavailable`` — a site cannot be reached now; try the next allowed site.
- ``TransientError`` — retry with backoff.
- ``ChecksumMismatch`` — a stored object's bytes do not match their recorded SHA-256; re-write it.
- ``Preempted`` — the capacity went away; resume from the newest checkpoint (same site or another).
  A training process that stops for it exits with ``EXIT_PREEMPTED`` (75).
- ``HostKeyRejected`` / ``AuthRefused`` — an SSH host's key is not the pinned one, or it refused
  the site's key; a person must fix the site block; never retried.
- ``RemoteJobFailed`` — a job on a remote host exited non-zero; carries the status and log tail.
- ``GateFailed`` — a promotion gate said no; the alias stays where it is.
- ``BundleRejected`` — a model bundle does not verify (a file changed, added or missing, or a bad
  signature); it is neither promoted nor released; never retried.
- ``AuditLogInvalid`` — the audit log's hash chain or head anchor does not verify; a person
  investigates before anything more is appended.
- ``ReleaseRefused`` — a rollback, retirement or release cannot be done as asked; nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial


class HybridtrainError(Exception):
    """Base class: a failure the user or the orchestrator can act on (no traceback needed)."""

    #: Process exit status used by the CLI for this class of error.
    exit_code: int = 1

    retryable: bool = False


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located by a dotted field path (or a column/file name)."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "(top level)"
        if self.line is not None:
            where = f"{where} (line {self.line})"
        return f"{where}: {self.message}"


def given_as(name: str, value: str) -> str:
    """How a user gives ``value`` to the input ``name`` in a fix: ``--poll 2`` on the command line (a name starting
    with ``-``), ``poll_s=2`` in a Prefect form."""
    return f"{name} {value}" if name.startswith("-") else f"{name}={value}"


class SpecError(HybridtrainError):
    """The job spec (or another config file) is invalid. Fix the file; never retried."""

    exit_code = 2

    def __init__(self, source: str, problems: Sequence[Problem] | Iterable[Problem]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = len(self.problems)
        super().__init__(
            f"{source}: {count} problem{'s' if count != 1 else ''} found; fix and re-run:\n{lines}"
        )


class DataError(HybridtrainError):
    """The dataset does not match its declared schema or is unusable. Fix the data or the schema."""

    exit_code = 3

    def __init__(self, dataset: str, problems: Sequence[Problem]):
        self.dataset = dataset
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"dataset {dataset} failed validation:\n{lines}")


class DatasetMissing(HybridtrainError):
    """The job's dataset is not in the checkout, its DVC cache or its site's store. Make or fetch it."""

    exit_code = 3

    def __init__(self, dataset: str, message: str):
        self.dataset = dataset
        super().__init__(message)


class LeakDetected(HybridtrainError):
    """Raw sensitive values were found in data about to leave its site. Sync refused."""

    exit_code = 4

    def __init__(self, dataset: str, hits: dict[str, int], examples: dict[str, str]):
        self.dataset = dataset
        self.hits = hits
        self.examples = examples
        detail = ", ".join(
            f"{n} raw value(s) of sensitive column {col} (found in {examples.get(col, '?')})"
            for col, n in sorted(hits.items())
        )
        super().__init__(
            f"leak scan of {dataset} found {detail}, so nothing was synced. If a value sits in another "
            "column, that column carries personal data: declare it in sensitive.columns with a treatment "
            "(drop, pseudonym or generalize), or fix the export that copied it there."
        )


class NoFeasiblePlacement(HybridtrainError):
    """No site may run the job; ``rejected`` maps each site to the rule that rejected it.

    ``rejected`` may be given as a function that builds it: it is called once, when first read.
    The simulator and the burst controller catch thousands of these and read few, so neither the
    per-candidate verdicts nor the message are built unless someone looks. Pickles as its values.
    """

    exit_code = 5

    def __init__(self, job: str, rejected: Mapping[str, str] | Callable[[], Mapping[str, str]], hint: str = ""):
        self.job = job
        self.hint = hint
        self._rejected = rejected if callable(rejected) else dict(rejected)
        super().__init__(job, hint)

    @property
    def rejected(self) -> dict[str, str]:
        if callable(self._rejected):
            self._rejected = dict(self._rejected())
        return self._rejected

    def __reduce__(self):
        return (type(self), (self.job, self.rejected, self.hint))

    def __str__(self) -> str:
        lines = "\n".join(f"  - {site}: {why}" for site, why in sorted(self.rejected.items()))
        return f"no site may run job {self.job!r}{'; ' + self.hint if self.hint else ''}:\n{lines}"


class SiteUnavailable(HybridtrainError):
    """A site (host, store or pool) is unreachable now; the job may go to the next allowed site."""

    retryable = True

    def __init__(self, site: str, reason: str):
        self.site = site
        self.reason = reason
        super().__init__(f"site {site!r} is unavailable: {reason}")


class TransientError(HybridtrainError):
    """A temporary failure (network, lock, throttling); retry with backoff."""

    retryable = True


class ChecksumMismatch(HybridtrainError):
    """Stored bytes do not hash to the SHA-256 recorded when they were written: the object is corrupt.

    Reading again does not help (the store already did); re-write the object from its source.
    """

    def __init__(self, url: str, expected: str, actual: str):
        self.url = url
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"object {url} is corrupt: its bytes hash to SHA-256 {actual or '(unknown)'}, but {expected} was "
            "recorded when it was written; re-write it from its source (re-run the stage that produced it) "
            "or delete it"
        )


#: Exit status of a training process that stopped for a preemption notice after writing its checkpoint.
#: 75 is EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): outside the
#: CLI's own codes (1-9), the shell's 126-128 and the 128+N of a death by signal N.
EXIT_PREEMPTED = 75


class Preempted(HybridtrainError):
    """Training was stopped by its capacity going away; a checkpoint was written. Resume it.

    ``checkpoint`` is the key of the checkpoint written at ``step`` (None when nothing could be
    saved, e.g. on a rank that does not write); ``site`` the site it ran at, when known.
    """

    exit_code = EXIT_PREEMPTED
    retryable = True

    def __init__(self, job: str, step: int, checkpoint: str | None, *, site: str | None = None):
        self.job = job
        self.step = step
        self.checkpoint = checkpoint
        self.site = site
        where = f" at site {site}" if site else ""
        super().__init__(
            f"job {job!r} was preempted{where} at step {step}; resume from {checkpoint or 'the start'}"
        )

    def __reduce__(self) -> tuple:
        # Rebuilt from its fields, so it survives pickling (result persistence, process pools).
        return (partial(type(self), site=self.site), (self.job, self.step, self.checkpoint))


class StageFailed(HybridtrainError):
    """A stage dispatched to a site's work pool did not complete; carries its flow run and state.

    ``message`` is the stage run's state message; the prefix Prefect puts before an exception's
    ("Flow run encountered an exception: ") is dropped, so the reason reads ``... (flow run ID):
    DataError: dataset ... failed validation: ...`` instead of after a second prefix.
    """

    #: What Prefect's engine writes before the exception in a failed run's state message.
    PREFECT_PREFIX = "Flow run encountered an exception: "

    def __init__(self, stage: str, site: str, flow_run: str, state: str, message: str):
        self.stage = stage
        self.site = site
        self.flow_run = flow_run
        self.state = state
        self.reason = (message or "").removeprefix(self.PREFECT_PREFIX).strip()
        super().__init__(
            f"stage {stage} at site {site} ended {state} (flow run {flow_run}): {self.reason or 'no message'}"
        )


class HostKeyRejected(HybridtrainError):
    """An SSH host offered a key that known_hosts does not pin (``changed=False``) or that differs from
    the pinned one (``changed=True``). Never retried: a person verifies the key out of band first."""

    def __init__(self, host: str, message: str, *, changed: bool):
        self.host = host
        self.changed = changed
        super().__init__(message)


class AuthRefused(HybridtrainError):
    """An SSH host refused key authentication for the configured user. Never retried: fix the key or
    the host's authorized_keys."""

    def __init__(self, target: str, message: str):
        self.target = target
        super().__init__(message)


class RemoteJobFailed(HybridtrainError):
    """A job on a remote host ended with a non-zero exit status, or vanished without one.

    ``exit_status`` is the job's own status (``None`` when the process disappeared without
    recording one: killed with SIGKILL, out of memory, host rebooted — retryable, since training
    resumes from its newest checkpoint); ``log_tail`` holds the last lines of its log.
    """

    def __init__(self, job: str, host: str, exit_status: int | None, log_tail: str, hint: str = ""):
        self.job = job
        self.host = host
        self.exit_status = exit_status
        self.log_tail = log_tail
        self.retryable = exit_status is None
        how = (f"failed with exit status {exit_status}" if exit_status is not None
               else "vanished without an exit status (killed, out of memory, or the host rebooted)")
        tail = "\n".join("  | " + line for line in log_tail.splitlines()) or "  | (the log is empty)"
        super().__init__(f"job {job!r} on {host} {how}{'; ' + hint if hint else ''}. Last lines of its log:\n{tail}")


class GateFailed(HybridtrainError):
    """A promotion gate refused the model; the registry alias was left untouched."""

    exit_code = 6

    def __init__(self, gate: str, reason: str):
        self.gate = gate
        self.reason = reason
        super().__init__(f"promotion gate {gate!r} failed: {reason}")


class BundleRejected(HybridtrainError):
    """A model bundle failed verification; ``problems`` name each file (or the signature) and what is wrong.

    A bundle that does not verify is never trusted: not promoted, released or served. ``advice``
    says what to do for this cause (another trusted key, a rebuilt bundle, a readable archive);
    by default: rebuild the bundle from the registry version and sign it again. Never retried.
    """

    exit_code = 7

    DEFAULT_ADVICE = ("Do not use it: rebuild the bundle from the registry version and sign it again with the release "
                      "key.")

    def __init__(self, bundle: str, problems: Sequence[Problem] | Iterable[Problem], advice: str | None = None):
        self.bundle = bundle
        self.problems = list(problems)
        self.files = [p.path for p in self.problems]
        self.advice = advice or self.DEFAULT_ADVICE
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"model bundle {bundle} was refused:\n{lines}\n{self.advice}")


class AuditLogUnwritable(HybridtrainError):
    """The audit log cannot be written at all — its directory is a file, a path is not writable, the disk is
    full: a setup problem to fix (not evidence of tampering); never retried."""

    exit_code = 8

    def __init__(self, log: str, reason: str):
        self.log = log
        self.reason = reason
        super().__init__(f"audit log {log} cannot be written: {reason}")


class AuditLogInvalid(HybridtrainError):
    """The audit log does not verify: records were edited, removed, reordered or cut off the end.

    ``problems`` locate each one (record seq or line). Appending is refused until a person has
    investigated; restore the log from a backup or keep it as evidence and start a new one.
    """

    exit_code = 8

    def __init__(self, log: str, problems: Sequence[Problem] | Iterable[Problem]):
        self.log = log
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = len(self.problems)
        super().__init__(f"audit log {log} does not verify ({count} problem{'s' if count != 1 else ''}):\n{lines}")


class ReleaseRefused(HybridtrainError):
    """A rollback, retirement or release cannot be done as asked (say, nothing to roll back to, or retiring
    the version being served); nothing was changed. The message says what to do instead."""

    exit_code = 9

    def __init__(self, model: str, reason: str):
        self.model = model
        self.reason = reason
        super().__init__(f"model {model}: {reason}")


def is_retryable(exc: BaseException) -> bool:
    """True when retrying the same call may succeed (used by the Prefect tasks' retry policy)."""
    if isinstance(exc, HybridtrainError):
        return exc.retryable
    # Errors from outside the project (network stacks, servers) are retried; programming errors are not.
    return isinstance(exc, (ConnectionError, TimeoutError, OSError)) and not isinstance(
        exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
    )
