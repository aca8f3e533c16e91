"""LowerBound: what no schedule of the same jobs can cost less than — per job, and capacity-aware (an LP relaxation).

Two bounds, both valid (never above the cost of any schedule the simulator can produce):

- ``per_job_bounds``: each job alone at the cheapest price any allowed option offers × its true
  GPU-hours, plus the data movement that option needs. Capacity is ignored, so with a busy pool it
  is far below anything achievable.
- ``capacity_bound``: the LP relaxation of "run every job, on-prem or in the cloud, with at most
  ``capacity`` on-prem GPUs busy at any time, missing at most ``misses`` deadlines, and finishing
  everything by ``horizon``". Time is cut into buckets; variable ``y[j, b]`` is the on-prem
  GPU-hours job *j* runs in bucket *b*, at most its GPUs × the part of *b* it may use (after its
  arrival; before its deadline — plus the simulator's ``MISS_GRACE_S``, since a run that ends
  that little late is no miss — unless it is one of the jobs allowed to miss — relaxed to a
  fraction ``m[j]`` ∈ [0, 1] with Σ m ≤ ``misses``); every bucket holds at most ``capacity`` × its
  length. What is not on-prem runs in the cheapest allowed cloud option at its list (or spot)
  price with no queue, no start-up, no preemption, and pays that option's data movement in
  proportion. Jobs whose data may not leave must run entirely on-prem. Every real schedule that
  misses at most ``misses`` deadlines and ends by ``horizon`` is a feasible point, so the LP's
  optimum is a lower bound on its cost. Solved with HiGHS (``scipy.optimize.linprog``).

Compare a policy with ``capacity_bound(..., misses=its misses, horizon=its last finish)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hybridtrain.placement.duration_estimator import DeclaredLimit
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.request import DataTier, ResourceRequest
from hybridtrain.simulation.simulator import MISS_GRACE_S
from hybridtrain.simulation.workload import SimJob

#: Bucket length of the LP's time grid (coarser: faster and a little looser, still valid). On the pod
#: trace 3-h and 1-h buckets gave the same optimum at ~4× and ~10× the variables (README, "What the bound means").
BUCKET_S = 12 * 3600.0
LP_METHOD = "highs"


@dataclass(frozen=True)
class JobPrices:
    """What one job costs at the extremes: all on-prem, all at the cheapest cloud option (inf: not allowed)."""

    onprem_usd: float  # the whole job on-prem (inf if on-prem is not allowed)
    cloud_usd: float  # the whole job at its cheapest allowed cloud option, data movement included
    onprem_slot_hours: float  # on-prem GPU-hours the whole job occupies

    @property
    def per_job(self) -> float | None:
        best = min(self.onprem_usd, self.cloud_usd)
        return None if math.isinf(best) else best


def job_prices(scenario, jobs: Sequence[SimJob]) -> list[JobPrices]:  # scenario: simulator.Scenario
    """Each job's all-on-prem and cheapest-cloud cost from the policy's allowed options."""
    engine = Placement(scenario.sites, scenario.policy, scenario.cost_model)
    cm = scenario.cost_model
    data_site = scenario.data_site or scenario.onprem
    out = []
    for job in jobs:
        req = ResourceRequest(
            job=job.id, gpus=job.gpus, run_hours=DeclaredLimit().estimate(job.declared_hours),
            max_run_hours=job.declared_hours, submitted_at=job.arrival, data_site=data_site,
            dataset_bytes=job.dataset_bytes, sensitivity=job.sensitivity, tier=DataTier.approved,
            deadline=job.deadline, job_class=job.job_class, checkpoint_bytes=job.checkpoint_bytes,
            checkpoint_interval_s=job.checkpoint_interval_s)
        onprem = cloud = math.inf
        slot_h = math.inf
        for c in engine.plan_for(req).cands:
            site = scenario.site(c.site)
            speed = cm.speed(site)
            price = min(site.spot_price_per_gpu_hour, c.price) if c.spot and site.spot_price_per_gpu_hour is not None \
                else c.price
            cost = job.gpu_hours / speed * price + job.dataset_bytes * c.egress_usd_per_byte \
                + job.checkpoint_bytes * c.ckpt_usd_per_byte
            if c.onprem:
                if job.gpus > site.gpu_count:
                    continue  # the pool can never hold it
                if cost < onprem:
                    onprem, slot_h = cost, job.gpu_hours / speed
            else:
                cloud = min(cloud, cost)
        out.append(JobPrices(onprem, cloud, slot_h))
    return out


def per_job_bounds(scenario, jobs: Sequence[SimJob]) -> list[float | None]:
    """Per job: the cheapest allowed option alone, capacity ignored (``None``: no site may run it)."""
    return [p.per_job for p in job_prices(scenario, jobs)]


@dataclass(frozen=True)
class Bound:
    """The capacity-aware bound and how it was reached."""

    usd: float
    misses: int
    horizon: float
    status: str  # "optimal", or why the per-job bound is given instead
    per_job_usd: float
    variables: int = 0


def capacity_bound(scenario, jobs: Sequence[SimJob], *, misses: int, horizon: float,
                   prices: Sequence[JobPrices] | None = None, bucket_s: float = BUCKET_S) -> Bound:
    """The LP bound (see the module docstring) for schedules missing ≤ ``misses`` deadlines and ending by ``horizon``."""
    prices = list(prices) if prices is not None else job_prices(scenario, jobs)
    capacity = scenario.capacity
    per_job = float(sum(p.per_job for p in prices if p.per_job is not None))
    t0 = min(j.arrival for j in jobs)
    horizon = max(horizon, max(j.arrival for j in jobs))
    n_buckets = max(1, math.ceil((horizon - t0) / bucket_s))
    edges = t0 + bucket_s * np.arange(n_buckets + 1)
    edges[-1] = max(edges[-1], horizon)
    const = 0.0
    cols_c: list[float] = []  # objective per variable
    ub: list[float] = []
    rows, cols, vals = [], [], []  # A_ub triplets
    b_ub: list[float] = []
    eq_rows, eq_cols, eq_vals, b_eq = [], [], [], []
    n_rows = n_buckets  # rows 0..n_buckets-1: bucket capacity
    b_ub.extend(capacity * (edges[1:] - edges[:-1]) / 3600.0)
    miss_vars: list[int] = []
    for job, p in zip(jobs, prices, strict=True):
        if p.per_job is None:
            continue  # no site may run it: no policy pays for it either
        if math.isinf(p.onprem_usd):
            const += p.cloud_usd
            continue
        stay = math.isinf(p.cloud_usd)
        per_h = p.onprem_usd / p.onprem_slot_hours
        if stay:
            const += p.onprem_usd
            gain = 0.0
        else:
            const += p.cloud_usd
            gain = p.cloud_usd / p.onprem_slot_hours - per_h  # saved per on-prem GPU-hour
            if gain <= 0:
                continue  # the cloud is cheaper: on-prem never helps the bound
        start = job.arrival
        deadline = job.deadline + MISS_GRACE_S if job.deadline is not None else math.inf
        first = int(np.searchsorted(edges, start, side="right")) - 1
        post = []
        job_vars = []
        for b in range(max(first, 0), n_buckets):
            lo, hi = max(edges[b], start), edges[b + 1]
            if hi <= lo:
                continue
            for a, z, late in ((lo, min(hi, deadline), False), (max(lo, deadline), hi, True)):
                if z <= a:
                    continue
                v = len(cols_c)
                cols_c.append(-gain)
                ub.append(job.gpus * (z - a) / 3600.0)
                rows.append(b), cols.append(v), vals.append(1.0)
                job_vars.append(v)
                if late:
                    post.append(v)
        if not job_vars:
            if stay:
                return Bound(per_job, misses, horizon, "no on-prem time for a job that must stay", per_job)
            continue
        if stay:
            eq_rows.extend([len(b_eq)] * len(job_vars)), eq_cols.extend(job_vars), eq_vals.extend([1.0] * len(job_vars))
            b_eq.append(p.onprem_slot_hours)
        else:
            rows.extend([n_rows] * len(job_vars)), cols.extend(job_vars), vals.extend([1.0] * len(job_vars))
            b_ub.append(p.onprem_slot_hours)
            n_rows += 1
        if post:
            m = len(cols_c)
            cols_c.append(0.0)
            ub.append(1.0)
            miss_vars.append(m)
            rows.extend([n_rows] * (len(post) + 1)), cols.extend([*post, m])
            vals.extend([1.0] * len(post) + [-p.onprem_slot_hours])
            b_ub.append(0.0)
            n_rows += 1
    if miss_vars:
        rows.extend([n_rows] * len(miss_vars)), cols.extend(miss_vars), vals.extend([1.0] * len(miss_vars))
        b_ub.append(float(misses))
        n_rows += 1
    n = len(cols_c)
    if n == 0:
        return Bound(const, misses, horizon, "optimal", per_job)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(n_rows, n)).tocsr()
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(len(b_eq), n)).tocsr() if b_eq else None
    res = linprog(np.asarray(cols_c), A_ub=a_ub, b_ub=np.asarray(b_ub), A_eq=a_eq,
                  b_eq=np.asarray(b_eq) if b_eq else None, bounds=np.column_stack([np.zeros(n), ub]), method=LP_METHOD)
    if res.status != 0:
        return Bound(per_job, misses, horizon, f"LP not solved ({res.message}); per-job bound given", per_job, n)
    value = const + float(res.fun)
    value -= 1e-7 * abs(value)  # the solver's tolerance, on the safe side
    # both are valid bounds; the LP is never below the per-job one but for rounding
    return Bound(max(value, per_job), misses, horizon, "optimal", per_job, n)
