"""SpotRule: while a cloud job runs, whether it should be on spot, on on-demand, or wait for spot — deadline-aware.

A rule is asked at each event (spot lost, spot back, a controller tick) with the job's progress
and the clock; it answers ``spot``, ``on_demand`` or ``wait``. Rules are pure: the runner (the
training flow, or the simulator replaying a spot trace) owns the state.

``UniformProgress`` follows the uniform-progress idea of "Can't Be Late" (Wu et al., NSDI'24):
progress should keep pace with a straight line from start (0 done) to the deadline (all done).
``Greedy`` is that paper's baseline: spot whenever it is there, on-demand only when the slack is
gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol


class SpotAction(StrEnum):
    spot = "spot"
    on_demand = "on_demand"
    wait = "wait"


@dataclass(frozen=True, slots=True)
class SpotProgress:
    """What a rule sees: work done and left (hours), clock, deadline, spot now, current capacity."""

    now: float
    started_at: float
    deadline: float | None
    work_done_h: float
    work_left_h: float
    spot_available: bool
    current: SpotAction

    def slack_s(self, restart_s: float) -> float:
        """Seconds to spare if the job switched to on-demand now and ran to the end."""
        if self.deadline is None:
            return float("inf")
        switch = 0.0 if self.current is SpotAction.on_demand else restart_s
        return self.deadline - self.now - self.work_left_h * 3600.0 - switch


class SpotRule(Protocol):
    name: ClassVar[str]

    def choose(self, p: SpotProgress) -> SpotAction: ...


@dataclass(frozen=True)
class UniformProgress:
    """Spot while progress keeps pace with the deadline; on-demand before it is too late.

    1. No deadline: spot when there, else wait.
    2. Safety net: if switching to on-demand now leaves less than ``margin_s`` of slack, go (or
       stay) on on-demand. A job already on on-demand counts the restart it would pay to come back
       after leaving it: it leaves only with ``margin_s`` to spare after that restart.
    3. Spot is there: take it — except that a job already on on-demand goes back only when it is
       ahead of the line by more than ``to_spot_restarts`` restarts (no flapping).
    4. Spot is gone: behind the line → on-demand; ahead → wait for spot. A job already on
       on-demand stops to wait only when ahead by more than ``to_wait_restarts`` restarts: coming
       back costs a restart, so each stop must buy more than one controller tick of progress (the
       hysteresis "Can't Be Late" adds to the rule; without it a job whose spot stays gone stops
       and restarts on-demand every other tick, paying a restart for each tick of work).

    Example (start 0 h, 4 h of work, deadline 12 h, so the line asks 1/3 h per hour; restart
    15 min): spot until preempted at 1 h 30 m (1.5 h done, the line asks 0.5 h) → wait. At 4 h 30 m
    the line reaches 1.5 h → on-demand. Spot returns at 4 h 45 m with 1.75 h done (line 1.58 h):
    ahead by only 10 min, less than a restart → stay on on-demand. At the 5 h 30 m check (2.5 h done,
    line 1.83 h) → back to spot; after the restart it finishes at 7 h 15 m unless preempted again.
    """

    name: ClassVar[str] = "uniform_progress"
    restart_s: float = 300.0
    margin_s: float = 600.0
    to_spot_restarts: float = 1.0
    to_wait_restarts: float = 4.0

    def choose(self, p: SpotProgress) -> SpotAction:
        if p.deadline is None:
            return SpotAction.spot if p.spot_available else SpotAction.wait
        back_s = self.restart_s if p.current is SpotAction.on_demand else 0.0  # leaving it costs a restart back
        if p.slack_s(self.restart_s) - back_s <= self.margin_s:
            return SpotAction.on_demand
        total = p.work_done_h + p.work_left_h
        span = p.deadline - p.started_at
        line_h = total * min(max((p.now - p.started_at) / span, 0.0), 1.0) if span > 0 else total
        ahead_h = p.work_done_h - line_h
        if p.spot_available:
            if p.current is SpotAction.on_demand and ahead_h * 3600.0 <= self.to_spot_restarts * self.restart_s:
                return SpotAction.on_demand
            return SpotAction.spot
        if p.current is SpotAction.on_demand and ahead_h * 3600.0 <= self.to_wait_restarts * self.restart_s:
            return SpotAction.on_demand
        return SpotAction.on_demand if ahead_h < 0 else SpotAction.wait


@dataclass(frozen=True)
class Greedy:
    """Spot whenever it is there; wait while slack remains; on-demand to the end once it is gone.

    Example (4 h of work, deadline 6 h, restart 5 min, margin 10 min): spot until preempted at
    1 h, then wait; at 2 h 45 m the slack (6 h − 2 h 45 m − 3 h left − 5 min) is down to the
    margin → on-demand for the remaining 3 h after a 5-minute start, finishing at 5 h 50 m.
    """

    name: ClassVar[str] = "greedy"
    restart_s: float = 300.0
    margin_s: float = 600.0

    def choose(self, p: SpotProgress) -> SpotAction:
        if p.current is SpotAction.on_demand and p.deadline is not None:
            return SpotAction.on_demand
        if p.slack_s(self.restart_s) <= self.margin_s:
            return SpotAction.on_demand
        return SpotAction.spot if p.spot_available else SpotAction.wait
