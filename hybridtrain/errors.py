"""Errors: what went wrong and what the caller should do about it.

Each class tells the orchestrator how to react:

- ``SpecError`` / ``DataError`` — the user must fix the spec or the data; never retried.
- ``LeakDetected`` — a raw sensitive value survived anonymization; the sync is refused.
- ``NoFeasiblePlacement`` — every candidate site was rejected; carries each site and the rule.
- ``SiteUnavailable`` — a site cannot be reached now; try the next allowed site.
- ``TransientError`` — retry with backoff.
- ``Preempted`` — the capacity went away; resume from the newest checkpoint.
- ``GateFailed`` — a promotion gate said no; the alias stays where it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


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
    """No site may run the job; ``rejected`` maps each site to the rule that rejected it."""

    exit_code = 5

    def __init__(self, job: str, rejected: dict[str, str]):
        self.job = job
        self.rejected = dict(rejected)
        lines = "\n".join(f"  - {site}: {why}" for site, why in sorted(self.rejected.items()))
        super().__init__(f"no site may run job {job!r}:\n{lines}")


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


class Preempted(HybridtrainError):
    """Training was stopped by its capacity going away; a checkpoint was written. Resume it."""

    retryable = True

    def __init__(self, job: str, step: int, checkpoint: str | None):
        self.job = job
        self.step = step
        self.checkpoint = checkpoint
        super().__init__(
            f"job {job!r} was preempted at step {step}; resume from {checkpoint or 'the start'}"
        )


class GateFailed(HybridtrainError):
    """A promotion gate refused the model; the registry alias was left untouched."""

    exit_code = 6

    def __init__(self, gate: str, reason: str):
        self.gate = gate
        self.reason = reason
        super().__init__(f"promotion gate {gate!r} failed: {reason}")


def is_retryable(exc: BaseException) -> bool:
    """True when retrying the same call may succeed (used by the Prefect tasks' retry policy)."""
    if isinstance(exc, HybridtrainError):
        return exc.retryable
    # Errors from outside the project (network stacks, servers) are retried; programming errors are not.
    return isinstance(exc, (ConnectionError, TimeoutError, OSError)) and not isinstance(
        exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
    )
