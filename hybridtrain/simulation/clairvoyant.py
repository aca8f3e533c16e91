"""Clairvoyant: what a schedule that knows every job in advance costs — the other side of ``×bound``.

``capacity_bound`` is a lower bound: no schedule costs less. How far above it the *best* schedule
lies is unknown, so ``ours ÷ bound`` mixes two gaps — the bound's slack and our policy's loss. This
module builds one concrete schedule that sees the whole trace at once, to split the two:

- each job goes where ``job_prices`` says it is cheapest (cloud if the pool cannot hold it);
- the on-prem jobs run in preemptive EDF order on the pool's GPUs: at every arrival or finish,
  the waiting and running jobs in deadline order (jobs without one last, by arrival) take GPUs
  while a job's whole GPU count fits; the rest pause;
- while more jobs end late than ``misses`` allows, the late on-prem jobs with the earliest
  deadlines move to their cheapest cloud option (a tenth of the excess per round) and the pool is
  replayed.

Preemption is taken as free (as if every pause fell on a checkpoint) and cloud work runs at its
cheapest list or spot price with no preemption, like the bound's cloud; so this is an *estimate*
of the best cost, not a bound on either side. Where it equals ``capacity_bound`` the bound is tight
and ``×bound`` is all policy (no knowledge of the future, no free preemption); where it is well
above, the bound may be loose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hybridtrain.simulation.lower_bound import JobPrices, job_prices
from hybridtrain.simulation.simulator import MISS_GRACE_S
from hybridtrain.simulation.workload import SimJob

MAX_ROUNDS = 200


@dataclass(frozen=True)
class Clairvoyant:
    """The clairvoyant schedule's outcome."""

    usd: float
    misses: int
    last_finish_s: float  # trace clock; NaN when nothing ran on-prem
    cloud_jobs: int
    preemptions: int


def preemptive_edf(jobs: Sequence[SimJob], capacity: int) -> tuple[dict[str, float], int]:
    """Every job's finish time under preemptive EDF on ``capacity`` GPUs, and the number of pauses."""
    order = sorted(jobs, key=lambda j: j.arrival)
    key = {j.id: ((j.deadline + MISS_GRACE_S) if j.deadline is not None else math.inf, j.arrival) for j in jobs}
    left = {j.id: j.true_hours * 3600.0 for j in jobs}
    finish: dict[str, float] = {}
    active: list[SimJob] = []
    running: set[str] = set()
    pauses = 0
    i, t = 0, order[0].arrival if order else 0.0
    while i < len(order) or active:
        while i < len(order) and order[i].arrival <= t:
            active.append(order[i])
            i += 1
        active.sort(key=lambda j: key[j.id])
        free, run = capacity, []
        for j in active:
            if j.gpus <= free:
                free -= j.gpus
                run.append(j)
        now = {j.id for j in run}
        pauses += sum(1 for k in running - now if k not in finish)
        running = now
        next_arrival = order[i].arrival if i < len(order) else math.inf
        if not run:
            if next_arrival == math.inf:
                raise ValueError(f"jobs wider than the pool's {capacity} GPUs: {sorted(j.id for j in active)[:5]}")
            t = next_arrival
            continue
        dt = min(min(left[j.id] for j in run), next_arrival - t)
        t += dt
        for j in run:
            left[j.id] -= dt
            if left[j.id] <= 1e-6:
                finish[j.id] = t
        active = [j for j in active if j.id not in finish]
        running -= finish.keys()
    return finish, pauses


def clairvoyant(scenario, jobs: Sequence[SimJob], *, misses: int,  # scenario: simulator.Scenario
                prices: Sequence[JobPrices] | None = None) -> Clairvoyant:
    """The clairvoyant schedule (see the module docstring) allowed ``misses`` late jobs."""
    prices = list(prices) if prices is not None else job_prices(scenario, jobs)
    price = {j.id: p for j, p in zip(jobs, prices, strict=True) if p.per_job is not None}
    cloud = {k for k, p in price.items() if p.cloud_usd < p.onprem_usd}
    finish: dict[str, float] = {}
    late: list[SimJob] = []
    pauses = 0
    for _ in range(MAX_ROUNDS):
        onprem = [j for j in jobs if j.id in price and j.id not in cloud]
        finish, pauses = preemptive_edf(onprem, scenario.capacity)
        late = sorted((j for j in onprem if j.deadline is not None and finish[j.id] > j.deadline + MISS_GRACE_S),
                      key=lambda j: j.deadline)
        movable = [j for j in late if not math.isinf(price[j.id].cloud_usd)]
        if len(late) <= misses or not movable:
            break
        cloud.update(j.id for j in movable[: max(1, (len(late) - misses) // 10)])
    usd = sum(p.cloud_usd if k in cloud else p.onprem_usd for k, p in price.items())
    return Clairvoyant(float(usd), len(late), max(finish.values(), default=math.nan), len(cloud), pauses)
