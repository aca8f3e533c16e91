"""Recovery: keep one training run going through preemptions, real failures and lost sites.

A run is a series of *attempts*, each a stretch of training on one site's capacity that resumes
from the newest valid checkpoint of the run's ``run_key``. ``supervise`` runs attempts until one
succeeds, deciding after each from what ended it (``classify``):

- **preempted** (``Preempted``: a spot notice or pool shutdown; the process checkpointed and
  stopped) — not a failure. The job is placed again by the engine with live health: a spot
  (opportunistic) site that just reclaimed its capacity is left out of that one decision, any
  other site may take it back. Bounded by ``recovery.max_preemptions``.
- **site lost** (``SiteUnavailable``: its SSH host, store or pool cannot be reached) — every
  site is health-checked, the unhealthy ones (and the lost one) are excluded, and the job is
  placed on the next site the policy allows. When none is allowed and healthy the run *waits*,
  saying why (``on_wait``), re-checking health every ``recovery.health_poll_s`` for up to
  ``recovery.wait_for_site_s``: data that may not leave stays and waits; it never fails over to
  a forbidden site (the engine enforces policy; the sync checks it again). Site losses share the
  preemption budget: the infrastructure went away, the job did nothing wrong.
- **failed** (a retryable error: a crashed or killed process, a remote job that died with no
  status, a network error) — retried at the same site, at most ``recovery.max_failures`` times,
  counted apart from preemptions.
- anything else (a spec or data mistake, a leak, a job that exited non-zero on its own) is not
  retried: it is raised at once with its own message.

When an attempt moves the run to another site, ``move`` copies the newest valid checkpoint (and
the approved data when the new site lacks it) and returns the crossings, which are counted like
every other byte that leaves a site. Every attempt is kept (``Attempt``) so the ledger can charge
wasted work (preempted and failed attempts) to the model.

Pure of Prefect: the flows pass the callables (dispatch, placement, health, data movement,
notifications); the tests pass real ones too, with real exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Generic, TypeVar

from pydantic import BaseModel

from hybridtrain.errors import HybridtrainError, NoFeasiblePlacement, Preempted, SiteUnavailable, is_retryable
from hybridtrain.specs.job import RecoverySpec

T = TypeVar("T")


class Outcome(StrEnum):
    succeeded = "succeeded"
    preempted = "preempted"
    failed = "failed"
    site_lost = "site-lost"


class Attempt(BaseModel):
    """One attempt of a run: where, how long, how it ended, and from which step it started."""

    number: int
    site: str
    capacity_class: str
    started_at: datetime
    seconds: float
    outcome: Outcome
    detail: str = ""
    step: int | None = None  # the step a preemption checkpointed at


class RecoveryExhausted(HybridtrainError):
    """A run used up its preemption or failure budget; carries the attempts."""

    exit_code = 6
    retryable = False

    def __init__(self, job: str, what: str, limit: int, attempts: list[Attempt], last: BaseException):
        self.job = job
        self.attempts = list(attempts)
        self.last = last
        super().__init__(
            f"job {job!r} gave up after {len(attempts)} attempts: more {what} than recovery.max_{what} = {limit} "
            f"allows (raise it in the spec if that is expected). Last: {last}")


def classify(exc: BaseException) -> Outcome | None:
    """What ended an attempt; None when it must not be retried (a user mistake or a bug in the job)."""
    if isinstance(exc, Preempted):
        return Outcome.preempted
    if isinstance(exc, SiteUnavailable):
        return Outcome.site_lost
    if is_retryable(exc):
        return Outcome.failed
    return None


@dataclass
class Placed:
    """Where the next attempt runs."""

    site: str
    capacity_class: str
    why: str = ""


@dataclass
class Supervisor(Generic[T]):
    """The callables ``supervise`` drives; see the module docstring for the rules.

    - ``attempt(site)`` trains at ``site`` (resuming the run's checkpoints) and returns its result;
    - ``place(exclude)`` asks the placement engine again with ``exclude`` (site → reason) left out
      and returns the choice, or raises ``NoFeasiblePlacement``;
    - ``health()`` checks every site: unhealthy site → reason;
    - ``move(source, destination)`` brings the run's checkpoint (and data) to ``destination``;
    - ``on_attempt(attempt)`` and ``on_wait(reason)`` report (log, artifacts, MLflow).
    """

    job: str
    policy: RecoverySpec
    attempt: Callable[[str], T]
    place: Callable[[dict[str, str]], Placed]
    health: Callable[[], dict[str, str]]
    move: Callable[[str, str], None]
    on_attempt: Callable[[Attempt], None] = lambda a: None
    on_wait: Callable[[str], None] = lambda reason: None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    attempts: list[Attempt] = field(default_factory=list)

    def count(self, *outcomes: Outcome) -> int:
        return sum(a.outcome in outcomes for a in self.attempts)

    def run(self, first: Placed) -> tuple[T, Placed]:
        """Attempts from ``first`` until one succeeds; returns its result and where it ran."""
        where = first
        while True:
            started, t0 = datetime.now(UTC), self.clock()
            try:
                result = self.attempt(where.site)
            except BaseException as exc:  # noqa: BLE001 - classified below, re-raised when not recoverable
                outcome = classify(exc)
                if outcome is None or not isinstance(exc, Exception):
                    raise
                step = exc.step if isinstance(exc, Preempted) else None
                self._record(where, started, t0, outcome, str(exc), step)
                where = self._next(where, outcome, exc)
                continue
            self._record(where, started, t0, Outcome.succeeded, "", None)
            return result, where

    def _record(self, where: Placed, started: datetime, t0: float, outcome: Outcome, detail: str,
                step: int | None) -> None:
        a = Attempt(number=len(self.attempts) + 1, site=where.site, capacity_class=where.capacity_class,
                    started_at=started, seconds=max(0.0, self.clock() - t0), outcome=outcome, detail=detail[:500],
                    step=step)
        self.attempts.append(a)
        self.on_attempt(a)

    def _next(self, where: Placed, outcome: Outcome, exc: Exception) -> Placed:
        if outcome is Outcome.failed:
            if self.count(Outcome.failed) > self.policy.max_failures:
                raise RecoveryExhausted(self.job, "failures", self.policy.max_failures, self.attempts, exc) from exc
            return where  # a real failure: retry where it was, from its newest checkpoint
        if self.count(Outcome.preempted, Outcome.site_lost) > self.policy.max_preemptions:
            raise RecoveryExhausted(self.job, "preemptions", self.policy.max_preemptions, self.attempts, exc) from exc
        if outcome is Outcome.preempted:
            unhealthy = self.health()
            exclude = dict(unhealthy)
            if where.capacity_class == "opportunistic":
                exclude[where.site] = f"preempted there at step {getattr(exc, 'step', '?')}: its capacity was reclaimed"
            try:
                nxt = self.place(exclude)
            except NoFeasiblePlacement:
                nxt = where if where.site not in unhealthy else self._wait(where)
        else:
            nxt = self._wait(where, {where.site: getattr(exc, "reason", str(exc))})
        if nxt.site != where.site:
            self.move(where.site, nxt.site)
        return nxt

    def _wait(self, where: Placed, lost: dict[str, str] | None = None) -> Placed:
        """Place on a healthy allowed site, waiting (and saying why) while there is none."""
        deadline = self.clock() + self.policy.wait_for_site_s
        first = True
        while True:
            unhealthy = self.health()
            if first and lost:
                # The site just failed us: out until a health check after this one says otherwise.
                unhealthy = {**lost, **unhealthy}
            first = False
            try:
                return self.place(unhealthy)
            except NoFeasiblePlacement as exc:
                if not exc.hint or self.clock() >= deadline:
                    if exc.hint:
                        raise NoFeasiblePlacement(
                            self.job, exc.rejected,
                            hint=f"waited {self.policy.wait_for_site_s:.0f} s (recovery.wait_for_site_s) for an "
                                 "allowed site to be healthy again") from exc
                    raise
                self.on_wait(f"job {self.job!r} is waiting: no site the policy allows is healthy now — "
                             + "; ".join(f"{s}: {r}" for s, r in sorted(exc.rejected.items()))
                             + f". Checking again every {self.policy.health_poll_s:.0f} s, for up to "
                             f"{max(0.0, deadline - self.clock()):.0f} s more.")
                self.sleep(min(self.policy.health_poll_s, max(0.0, deadline - self.clock())))
