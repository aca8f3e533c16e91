"""Strategy: how the placement engine picks one candidate from the allowed, priced ones — pluggable by name.

Every strategy sees the same ``CandidateView`` — the candidates the policy allows, priced on
demand — asks it what it needs ("the cheapest on-prem candidate that meets the deadline", "the
least late one") and returns the position it picks plus the reasons. Strategies
are looked up by the name used in YAML (``policy.yaml`` ``default_strategy`` /
``job_classes.<c>.strategy``, spec ``placement.strategy``) in ``STRATEGIES``, whose default is
``onprem_first``; an unknown name lists the valid ones. Options for a strategy come from
``policy.yaml`` ``strategy_options.<name>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar, Protocol

from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.cost_model import clock, hhmm

if TYPE_CHECKING:
    from hybridtrain.placement.candidate import CandidateView


@dataclass(frozen=True, slots=True)
class Choice:
    """The picked position (-1: nothing feasible) and a function producing the reasons when read.

    ``urgent``: the run can make its deadline only on-prem and only if it starts now — it goes to
    the pool's first queue and the burst controller makes room for it. ``late``: the run stays
    on-prem knowing it will miss its deadline (getting it done in time elsewhere costs more than
    the policy says a deadline is worth) — it goes to the pool's last queue.
    """

    pos: int
    reasons: Callable[[], list[str]]
    urgent: bool = False
    late: bool = False


class Strategy(Protocol):
    name: ClassVar[str]

    def choose(self, c: CandidateView) -> Choice: ...


def due_text(c: CandidateView) -> str:
    if c.deadline is not None:
        return f"the deadline {clock(c.deadline)}"
    return f"the {c.slo_s / 3600:g} h wait SLO (start by {clock(c.due)})"


def onprem_status(c: CandidateView) -> list[str]:
    """Why on-prem was not kept: not allowed, over a cap, or too late (with its numbers)."""
    if not c.has_onprem():
        return ["no on-prem site is allowed for this job (see the rejected candidates)"]
    best = c.fastest("onprem")
    if best < 0:
        return ["every on-prem candidate is over a cost cap"]
    late = c.lateness(best)
    if c.deadline is not None:
        what, when = "finish", c.finish_at(best)
    else:
        what, when = "start", c.now + c.start_in(best)
    return [f"on-prem {c.site(best)} would {what} at {clock(when)} (queue wait {hhmm(c.wait(best))}, "
            f"{c.queued(best)} run(s) queued), {hhmm(max(late, 0.0))} after {due_text(c)}"]


def late_choice(c: CandidateView, context: Callable[[CandidateView], list[str]]) -> Choice:
    """Nothing meets the due time: the feasible candidate that misses it by least, flagged."""
    pos = c.least_late()

    def reasons() -> list[str]:
        return [*context(c), f"no allowed candidate meets {due_text(c)}; {c.label(pos)} misses it by least "
                             f"({hhmm(max(c.lateness(pos), 0.0))}) at ${c.total(pos):.2f} — flagged"]
    return Choice(pos, reasons)


def cheapest_meeting(c: CandidateView, context: Callable[[CandidateView], list[str]]) -> Choice:
    """The cheapest candidate that meets the due time; else the least late."""
    pos = c.cheapest()
    if pos < 0:
        return late_choice(c, context)

    def reasons() -> list[str]:
        return [*context(c), f"cheapest allowed candidate that meets {due_text(c)}: {c.label(pos)} "
                             f"at ${c.total(pos):.2f}, finishing {clock(c.finish_at(pos))}"]
    return Choice(pos, reasons)


class StrategyRegistry:
    """Strategies by name, with a declared default; unknown names are refused with the valid ones listed."""

    def __init__(self, default: str) -> None:
        self.default = default
        self._classes: dict[str, type] = {}

    def register(self, cls: type) -> type:
        self._classes[cls.name] = cls
        return cls

    @property
    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def unknown_message(self, name: str) -> str:
        valid = ", ".join(f"{n} (default)" if n == self.default else n for n in self.names)
        return f"unknown strategy {name!r}; choose one of: {valid}"

    def option_names(self, name: str) -> list[str]:
        return [f.name for f in fields(self._classes[name])]

    def create(self, name: str | None = None, **options: float) -> Strategy:
        """A strategy instance by name (``None``: the default) with ``options`` as its parameters."""
        name = name or self.default
        if name not in self._classes:
            raise SpecError("placement strategy", [Problem("strategy", self.unknown_message(name))])
        known = self.option_names(name)
        bad = [k for k in options if k not in known]
        if bad:
            raise SpecError("placement strategy", [
                Problem(f"strategy_options.{name}.{k}",
                        f"unknown option; {name} takes: {', '.join(known) or 'no options'}") for k in bad])
        for k, v in options.items():
            # Every option is a limit, a ratio or a count: a negative, NaN or infinite one is a typo.
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SpecError("placement strategy", [
                    Problem(f"strategy_options.{name}.{k}", f"must be a number >= 0, not {v!r}")])
        return self._classes[name](**options)


STRATEGIES = StrategyRegistry(default="onprem_first")


@STRATEGIES.register
@dataclass(frozen=True)
class OnPremFirst:
    """Stay on-prem while the job still meets its deadline there; otherwise burst to the cheapest site that does.

    Steps: (1) if an allowed on-prem candidate finishes by the deadline — or, without a deadline,
    starts within the policy's wait SLO — take the cheapest such one; (2) with
    ``displace_max_hours`` > 0, a run planned at most that many hours that on-prem would still
    get done by its deadline if it started now, and that on-prem runs cheaper than any site
    meeting the deadline, is taken on-prem as *urgent* instead of bursting: stopping a running
    run at its checkpoint for a short while (the controller picks the one that loses least)
    costs less than an on-demand start, a sync and a checkpoint sent home; (3) otherwise take
    the cheapest allowed candidate (cloud on-demand, or spot priced with its on-demand
    fallback) that meets it — unless, with ``miss_above_usd`` > 0, it costs more than that above
    on-prem: then the run stays on-prem, *late*, in the pool's last queue, where it takes only GPUs
    no run that can still make its deadline needs (a deadline is worth that much, no more);
    (4) if none does but on-prem would were the run to start now, take on-prem as *urgent*
    (first queue; the burst controller makes room); (5) otherwise the candidate that misses by
    least, flagged — or, with ``miss_above_usd`` > 0, on-prem late in the last queue when that
    is cheaper (a deadline lost anyway is not worth paying for).

    Example: 8 on-prem GPUs all busy, 3 runs queued; a 1-GPU, 2 h job due in 6 h. Queue wait is
    estimated at 1 h → finish in 3 h → stays on-prem. Ten more runs arrive; the next such job
    would wait 5 h and finish 1 h late → it goes to the cheapest candidate that makes it, say
    cloud-eu on-demand at $8.20 finishing in 2 h 10 m incl. sync. Later the queue drains and the
    burst controller reports that the burst capacity can be released.
    """

    name: ClassVar[str] = "onprem_first"
    #: Runs planned at most this many hours displace a running run rather than burst (0: never).
    displace_max_hours: float = 0.0
    #: What a deadline (or, for a run without one, the wait SLO) is worth, USD: a run on-prem would
    #: get done late stays there, in the last queue, when getting it done in time elsewhere costs
    #: more than this above on-prem (0: never).
    miss_above_usd: float = 0.0

    def choose(self, c: CandidateView) -> Choice:
        pos = c.cheapest("onprem")
        if pos >= 0:
            def stay() -> list[str]:
                if c.deadline is not None:
                    return [f"on-prem first: {c.site(pos)} finishes at {clock(c.finish_at(pos))}, "
                            f"{hhmm(-c.lateness(pos))} before the deadline {clock(c.deadline)} "
                            f"(queue wait {hhmm(c.wait(pos))})"]
                return [f"on-prem first: {c.site(pos)} starts in {hhmm(c.start_in(pos))}, within {due_text(c)}"]
            return Choice(pos, stay)
        if self.displace_max_hours > 0 and c.deadline is not None and c.request.run_hours <= self.displace_max_hours:
            displace = self._displace(c)
            if displace is not None:
                return displace
        choice = cheapest_meeting(c, onprem_status)
        if choice.pos < 0:
            return choice
        if c.priced(choice.pos).meets:
            return self._accept_miss(c, choice) or choice
        now = c.cheapest_meeting_if_started_now("onprem")
        if now < 0:
            return self._accept_miss(c, choice) or choice

        def urgent() -> list[str]:
            return [*onprem_status(c), f"no allowed candidate meets {due_text(c)} with the queues as they are, "
                                       f"but {c.site(now)} would if the run started now: queued first as urgent, "
                                       f"the burst controller makes room"]
        return Choice(now, urgent, urgent=True)

    def _accept_miss(self, c: CandidateView, rescue: Choice) -> Choice | None:
        """Step (3'): on-prem, late, in the last queue, when ``rescue`` (the cheapest site meeting the
        deadline, or the least late one when none does) costs more than ``miss_above_usd`` above it."""
        if self.miss_above_usd <= 0 or c.plan.must_stay:
            return None
        late = c.cheapest("onprem", meeting=False)
        if late < 0 or late == rescue.pos:
            return None
        meets = c.priced(rescue.pos).meets
        extra = c.total(rescue.pos) - c.total(late)
        if meets and extra <= self.miss_above_usd:
            return None

        def reasons() -> list[str]:
            why = (f"{c.label(rescue.pos)} would meet it for ${extra:.2f} more than on-prem, above the "
                   f"${self.miss_above_usd:g} a deadline is worth here" if meets
                   else f"no allowed candidate meets {due_text(c)}")
            return [*onprem_status(c), (f"{why}: {c.site(late)} at ${c.total(late):.2f}, late, queued last "
                                        "(it runs on GPUs no run that can still make its deadline needs)")]
        return Choice(late, reasons, late=True)

    def _displace(self, c: CandidateView) -> Choice | None:
        """Step (2): a short run on-prem now, as urgent, when that is cheaper than the cheapest site meeting its deadline."""
        now = c.cheapest_meeting_if_started_now("onprem")
        if now < 0:
            return None
        other = c.cheapest()
        if other >= 0 and c.total(other) <= c.total(now):
            return None

        def reasons() -> list[str]:
            alt = (f"{c.label(other)} at ${c.total(other):.2f}" if other >= 0
                   else "no other site meets it either")
            return [*onprem_status(c), (f"a {hhmm(c.request.run_hours * 3600.0)} run (≤ {self.displace_max_hours:g} h): "
                                        f"{c.site(now)} at ${c.total(now):.2f} if it starts now, cheaper than "
                                        f"bursting ({alt}) — queued first as urgent, the burst controller makes room")]
        return Choice(now, reasons, urgent=True)


@STRATEGIES.register
@dataclass(frozen=True)
class Cheapest:
    """The cheapest allowed candidate that meets the deadline (or wait SLO); else the least late.

    Example: on-prem $1.13/GPU-h with a 1 h queue, cloud-us spot $0.85/GPU-h; a 4-GPU, 3 h job
    due in 10 h goes to cloud-us spot ($10.70 incl. preemption overhead) although on-prem would
    also make it.
    """

    name: ClassVar[str] = "cheapest"

    def choose(self, c: CandidateView) -> Choice:
        return cheapest_meeting(c, lambda _: [])


@STRATEGIES.register
@dataclass(frozen=True)
class Fastest:
    """The allowed candidate with the earliest expected finish, whatever it costs.

    Example: on-prem has a 3 h queue, cloud-eu on-demand starts in 10 min; a job due tomorrow
    still goes to cloud-eu because it finishes first.
    """

    name: ClassVar[str] = "fastest"

    def choose(self, c: CandidateView) -> Choice:
        pos = c.fastest()
        return Choice(pos, lambda: [f"fastest allowed candidate: {c.label(pos)} finishes at "
                                    f"{clock(c.finish_at(pos))} for ${c.total(pos):.2f}"])


@STRATEGIES.register
@dataclass(frozen=True)
class DeadlineSpot:
    """On-prem first, but jobs that may use spot take it once the on-prem wait passes a limit.

    Spot runs follow the uniform-progress rule (``SpotRule``, after "Can't Be Late", NSDI'24):
    they stay on spot while progress keeps pace with a straight line from start to deadline, wait
    out spot gaps while ahead of it, and switch to on-demand before the remaining slack is too
    small to finish — so choosing spot gives up money, not the deadline, when spot is scarce.

    Steps: (1) if the cheapest on-prem candidate that meets the due time would wait at most
    ``max_onprem_wait_hours``, stay there; (2) else, if a spot candidate meets it and costs at
    most ``max_cost_ratio`` × that on-prem candidate (or on-prem cannot make it at all), take the
    cheapest such spot candidate; (3) otherwise behave as ``onprem_first`` (with this strategy's
    ``displace_max_hours`` and ``miss_above_usd``).

    Example: on-prem queue wait 3 h (> 1 h); an opportunistic 1-GPU 4 h job due in 12 h →
    cloud-us spot. At 1 h 30 m spot is preempted with the job ahead of its line (1.5 h done, the
    line asks 0.5 h): it waits. At 4 h 30 m the line catches up → on-demand; at 5 h 30 m spot is
    back and the job is 40 min ahead → spot again; it finishes at about 7 h 15 m.
    """

    name: ClassVar[str] = "deadline_spot"
    max_onprem_wait_hours: float = 1.0
    max_cost_ratio: float = 1.5
    #: ``onprem_first``'s options, for step (3)
    displace_max_hours: float = 0.0
    miss_above_usd: float = 0.0

    def choose(self, c: CandidateView) -> Choice:
        onprem = c.cheapest("onprem")
        fallback = OnPremFirst(self.displace_max_hours, self.miss_above_usd)
        if onprem >= 0 and c.wait(onprem) <= self.max_onprem_wait_hours * 3600.0:
            return fallback.choose(c)
        spot = c.cheapest("spot")
        if spot < 0 or (onprem >= 0 and c.total(spot) > self.max_cost_ratio * c.total(onprem)):
            return fallback.choose(c)

        def reasons() -> list[str]:
            head = (f"on-prem {c.site(onprem)} would wait {hhmm(c.wait(onprem))}, over the "
                    f"{self.max_onprem_wait_hours:g} h limit for jobs that may use spot"
                    if onprem >= 0 else onprem_status(c)[0])
            return [head, f"{c.label(spot)} at ${c.total(spot):.2f}; the uniform-progress rule falls back to "
                          f"on-demand in time to keep {due_text(c)}"]
        return Choice(spot, reasons)


@STRATEGIES.register
@dataclass(frozen=True)
class ThresholdBurst:
    """Burst when the on-prem queue is longer than ``queue_limit`` runs (counting this one if it must wait).

    The classic rule, kept as a strategy so it can be compared on the same engine. The burst goes
    to the cheapest allowed on-demand cloud candidate; jobs that may not leave stay on-prem.

    Example: ``queue_limit: 2``; two runs queued and the pool full → the new job would be third
    in line → cloud-eu on-demand, whatever its deadline.
    """

    name: ClassVar[str] = "threshold_burst"
    queue_limit: int = 0

    def choose(self, c: CandidateView) -> Choice:
        pos = c.fastest("onprem")
        burst = c.cheapest("burst", meeting=False)
        if pos >= 0:
            line = c.queued(pos) + (1 if c.must_wait(pos) else 0)
            if line <= self.queue_limit or burst < 0:
                return Choice(pos, lambda: [f"on-prem queue {line} ≤ {self.queue_limit} (or no cloud allowed): "
                                            f"{c.label(pos)}"])
            return Choice(burst, lambda: [f"on-prem queue {line} > {self.queue_limit}: burst to {c.label(burst)} "
                                          f"at ${c.total(burst):.2f}"])
        if burst < 0:
            burst = c.cheapest(meeting=False)
        return Choice(burst, lambda: [f"no on-prem candidate allowed: {c.label(burst)}"])
