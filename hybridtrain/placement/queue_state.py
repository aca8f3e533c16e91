"""QueueState: a snapshot of one site's work pool — runs waiting and running, GPU slots — and the wait it implies.

The flow reads it from Prefect (runs scheduled, pending, late and running in the site's pool;
the site's global concurrency limit as GPU slots) and passes it in; the simulator builds it
from its simulated queue. The engine never reads a server itself.

How the pool hands out GPU slots (``admit``; the same rule in the simulated pool and in every
wait estimate). The pool has three work queues, one per ``QueueTier`` and scanned in that order:
runs whose data may not leave, then runs that could only burst to on-demand capacity, then runs
that could take spot — so the on-prem GPUs go to the runs that are most expensive (or
impossible) to send elsewhere, and when the pool is overloaded the runs with the cheapest way
out are the ones that wait and, once late, move. Within a work queue the run due first goes
first (earliest deadline first; a run without a deadline is due at the end of its wait SLO,
``QueuedRun.due``; equal dues in arrival order): a run whose deadline is days away waits behind
one due this afternoon instead of pushing it late — or to the cloud. Waiting runs start in that
order while they fit. The first run that does not fit gets a reservation — the time enough slots
are sure to be free, from the running runs' hard limits — and later runs may start ahead of it only if they
cannot delay it: they end (by their own hard limit) before the reservation, or use slots it does
not need (EASY backfilling). A large run is therefore never starved by a stream of small ones.
A pool may keep ``reserved_slots`` of headroom for runs whose data may not leave: any other run
starts only if it leaves that many slots free, so runs that could have gone elsewhere never
fill the pool the stay-at-home runs depend on, and those find a slot on arrival.

``start_delays`` replays that rule over the runs' *estimated* durations to predict when each
waiting run starts; ``QueueState.wait_s`` is the prediction for a new run. With counts only (no
per-run estimates) the work ahead — every run one slot for ``default_run_hours``, running ones
half done — is spread over all slots.

Example: 4 slots; running: X (2 slots, 1 h left, limit 2 h) and Y (2 slots, 3 h left, limit 4 h);
waiting: A (4 slots, 2 h). A does not fit; its reservation is at 4 h (Y's limit). A new 1-slot
run with a 5 h limit cannot start at 1 h when X ends (it would still hold a slot at 4 h) — it
waits until A has started at 3 h (when Y actually ends) and ended at 5 h: expected wait 5 h. With
a 2 h limit it backfills at 1 h: expected wait 1 h.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class QueueTier(IntEnum):
    """The pool's work queue a run waits in; lower goes first."""

    stay = 0  # its data may not leave: no other site is allowed
    on_demand = 1  # could burst, but only to on-demand capacity
    spot = 2  # could burst to spot: the cheapest to move
    late = 3  # late anywhere it could go at a price the policy accepts: runs on GPUs no one else needs


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run as the pool sees it: slots, estimated hours (left), hard-limit hours (left), queue tier."""

    gpus: int
    hours: float
    tier: QueueTier = QueueTier.on_demand
    limit_hours: float | None = None  # None: the estimate is the limit
    #: when it is due (POSIX s): its deadline, else the end of its wait SLO (``due_at``); inf: after
    #: every run of its work queue that has a due time (arrival order among those)
    due: float = math.inf

    @property
    def limit(self) -> float:
        """Hard-limit hours (never below the estimate)."""
        lim = self.limit_hours
        return self.hours if lim is None or lim < self.hours else lim


def due_at(deadline: float | None, submitted_at: float, wait_slo_s: float) -> float:
    """When a run is due, the order within its work queue: its deadline, or — without one — the
    end of its wait SLO (submitted + the policy's ``wait_slo_hours``)."""
    return deadline if deadline is not None else submitted_at + wait_slo_s


def queue_key(tier: QueueTier, due: float) -> tuple[int, float]:
    """Where a run stands in the pool's line: its work queue, then its due time (sort stably, so
    equal dues stay in arrival order)."""
    return (int(tier), due)


def in_queue_order(runs: Sequence[QueuedRun]) -> list[QueuedRun]:
    """``runs`` (in arrival order) in the order the pool serves them: ``queue_key``."""
    return sorted(runs, key=lambda r: queue_key(r.tier, r.due))


#: Waiting runs looked at for backfilling per scheduling pass (as Slurm's ``bf_max_job_test``).
BACKFILL_DEPTH = 256


@dataclass(frozen=True, slots=True)
class Slot:
    """A running run as ``admit`` sees it: when it has surely ended (its hard limit), slots, tier."""

    ends_by: float
    gpus: int
    tier: QueueTier


def admit(
    now: float,
    slots: int,
    running: Sequence[Slot],
    queue: Sequence[QueuedRun],
    reserved: int = 0,
    order: Sequence[int] | None = None,
) -> list[int]:
    """Which waiting runs start at ``now``: indices into ``queue`` (in queue order, ``in_queue_order``).

    ``running`` are the runs on the slots. ``reserved`` slots are headroom for
    ``QueueTier.stay`` runs: any other run starts only if it leaves that many slots free. Runs
    start in order while they can; the first that cannot gets a reservation, and the next
    ``BACKFILL_DEPTH`` runs may start only if they cannot delay it (see the module docstring).
    ``order`` restricts the scan to those indices, in that order (default: all).
    """
    free = slots - sum(r.gpus for r in running)
    idx = range(len(queue)) if order is None else order
    started: list[int] = []
    n = len(idx)
    k = 0
    head = None
    stay = QueueTier.stay
    while k < n and free > 0:
        run = queue[idx[k]]
        room = free if run.tier is stay else free - reserved
        if run.gpus <= room:
            free -= run.gpus
            started.append(idx[k])
        elif run.gpus <= (slots if run.tier is stay else slots - reserved):
            head = run
            break
        k += 1  # a run that can never fit here is passed over
    if head is None or free <= 0:
        return started
    # Reservation: when the running runs (and those just started) have surely freed enough slots.
    ends = sorted([*((r.ends_by, r.gpus) for r in running),
                   *((now + queue[j].limit * 3600.0, queue[j].gpus) for j in started)])
    avail, reserve_at = free, math.inf
    need = head.gpus if head.tier is stay else head.gpus + reserved
    for end, g in ends:
        avail += g
        if avail >= need:
            reserve_at = end
            break
    spare = avail - need  # slots free at the reservation beyond the head's need
    for k2 in range(k + 1, min(n, k + 1 + BACKFILL_DEPTH)):
        if free <= 0:
            break
        j = idx[k2]
        run = queue[j]
        if run.gpus > (free if run.tier is stay else free - reserved):
            continue
        ends_in_time = now + run.limit * 3600.0 <= reserve_at
        if ends_in_time or run.gpus <= spare:
            if not ends_in_time:
                spare -= run.gpus
            free -= run.gpus
            started.append(j)
    return started


def start_delays(
    slots: int,
    running: Sequence[QueuedRun],
    queue: Sequence[QueuedRun],
    *,
    reserved: int = 0,
    until: int | None = None,
) -> list[float]:
    """Seconds until each run of ``queue`` starts, replaying ``admit`` over the estimated durations.

    ``running`` holds the runs on the slots with their estimated (and limit) hours left; ``queue``
    is in queue order (``in_queue_order``). A run that can never fit never starts (``math.inf``). With
    ``until=i`` the replay stops once run ``i`` has started.
    """
    out = [math.inf] * len(queue)
    ends: list[tuple[float, int, Slot]] = []  # (estimated end, id, slot)
    for k, r in enumerate(running):
        heapq.heappush(ends, (r.hours * 3600.0, k, Slot(r.limit * 3600.0, r.gpus, r.tier)))
    ids = len(running)
    pending = list(range(len(queue)))
    t = 0.0
    while pending:
        chosen = admit(t, slots, [e[2] for e in ends], queue, reserved, pending)
        if chosen:
            for i in chosen:
                run = queue[i]
                out[i] = t
                heapq.heappush(ends, (t + run.hours * 3600.0, ids, Slot(t + run.limit * 3600.0, run.gpus, run.tier)))
                ids += 1
            if len(chosen) == 1 and chosen[0] == pending[0]:
                pending.pop(0)
            else:
                taken = set(chosen)
                pending = [i for i in pending if i not in taken]
        if not pending or (until is not None and out[until] != math.inf) or not ends:
            break
        t = heapq.heappop(ends)[0]
        while ends and ends[0][0] <= t:
            heapq.heappop(ends)
    return out


def start_delay(slots: int, running: Sequence[QueuedRun], backlog: Sequence[QueuedRun], run: QueuedRun,
                reserved: int = 0) -> float:
    """Seconds until ``run``, queued behind ``backlog`` (in queue order), starts."""
    queue = (*backlog, run)
    return start_delays(slots, running, queue, reserved=reserved, until=len(queue) - 1)[-1]


def remaining_hours(estimate_h: float, limit_h: float, elapsed_h: float) -> float:
    """Expected hours left of a running run: its estimate minus elapsed, or — past the estimate —
    half the way to its hard limit (it cannot run longer than that)."""
    if elapsed_h < estimate_h:
        return estimate_h - elapsed_h
    return max(limit_h - elapsed_h, 0.0) / 2


@dataclass(frozen=True)
class QueueState:
    """One site's pool at one instant. Counts mirror Prefect run states; slots are GPU slots."""

    site: str
    gpu_slots: int
    gpus_in_use: int = 0
    #: Headroom kept for ``QueueTier.stay`` runs: other runs start only if they leave this many slots free.
    reserved_slots: int = 0
    scheduled: int = 0
    pending: int = 0
    late: int = 0
    running: int = 0
    backlog: tuple[QueuedRun, ...] | None = None  # waiting runs, in arrival order (any tiers, any dues)
    running_runs: tuple[QueuedRun, ...] | None = None
    default_run_hours: float = 1.0
    expected_wait_s: float | None = None
    _waits: dict[tuple, float] = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def queued(self) -> int:
        """Runs waiting for a slot: scheduled (due), pending and late."""
        return self.scheduled + self.pending + self.late

    @property
    def free_slots(self) -> int:
        return max(0, self.gpu_slots - self.gpus_in_use)

    def wait_s(self, gpus: int, tier: QueueTier = QueueTier.on_demand, hours: float = 1.0,
               limit_hours: float | None = None) -> float:
        """Expected seconds before a new run (``gpus`` slots, ``hours`` estimated, ``limit_hours`` hard
        limit) of queue ``tier`` starts here. It waits behind the runs of its own and higher tiers,
        whatever their due times: a run due sooner goes ahead of the runs already waiting, but the
        runs that arrive after it may in turn go ahead of it, so counting only the runs due before
        it would promise a start the queue rarely keeps (measured: more deadlines missed and more
        money spent: the README's *The run due first goes first*). Its limit matters only for
        backfilling. Cached per argument set."""
        key = (gpus, int(tier), hours, limit_hours)
        cached = self._waits.get(key)
        if cached is not None:
            return cached
        if self.expected_wait_s is not None:
            wait = self.expected_wait_s if gpus <= self.gpu_slots - (0 if tier is QueueTier.stay else self.reserved_slots) else math.inf
        else:
            if self.backlog is not None and self.running_runs is not None:
                ahead = in_queue_order([r for r in self.backlog if r.tier <= tier])
                wait = start_delay(self.gpu_slots, self.running_runs, ahead, QueuedRun(gpus, hours, tier, limit_hours),
                                   self.reserved_slots)
            elif gpus > self.gpu_slots - (0 if tier is QueueTier.stay else self.reserved_slots):
                wait = math.inf
            elif self.queued == 0 and self.free_slots >= gpus:
                wait = 0.0
            else:
                # Counts only: the work ahead (running runs half done, queued runs whole, one slot
                # each for default_run_hours) drains over all slots.
                work_h = (self.running / 2 + self.queued) * self.default_run_hours
                wait = work_h / max(self.gpu_slots, 1) * 3600.0
        self._waits[key] = wait
        return wait

    def first_queue_wait_s(self, gpus: int, hours: float = 1.0, limit_hours: float | None = None) -> float:
        """Expected seconds before a new run put in the first queue (``QueueTier.stay``, as an
        urgent run is) starts here if every running run that may be stopped for it were stopped.

        It still waits for what nothing may stop: the runs already in the first queue (as in
        ``wait_s``, whatever their due times) and the running runs of that tier (data that may not
        leave, urgent runs). 0 when the snapshot has no per-run detail (counts only, or a bare
        expected wait). Cached.
        """
        if self.expected_wait_s is not None or self.backlog is None or self.running_runs is None:
            return 0.0
        key = ("first", gpus, hours, limit_hours)
        cached = self._waits.get(key)
        if cached is None:
            stay = QueueTier.stay
            cached = self._waits[key] = start_delay(
                self.gpu_slots, [r for r in self.running_runs if r.tier is stay],
                in_queue_order([r for r in self.backlog if r.tier is stay]),
                QueuedRun(gpus, hours, stay, limit_hours))
        return cached

    @classmethod
    def idle(cls, site: str, gpu_slots: int) -> QueueState:
        return cls(site=site, gpu_slots=gpu_slots)
