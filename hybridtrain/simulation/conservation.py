"""Conservation: the bookkeeping invariants every simulated run must satisfy, checked at the end of each replay.

Per job: the work executed equals the work needed plus the work redone, and every dollar is
attributed once —

- ``onprem_gpu_hours × speed(on-prem) + (spot + on-demand − restart overhead) × speed(cloud site)
  = gpus × true hours + lost (redone) GPU-hours`` (reference GPU-hours);
- ``onprem_usd = onprem_gpu_hours × the on-prem price`` and ``compute_usd − onprem_usd =
  spot GPU-hours × spot price + on-demand GPU-hours × on-demand price`` at the job's cloud site (for a
  spot run that failed over between sites, per leg at each leg's site, the legs adding up to the totals);
- a placed job starts no earlier than it arrives and finishes no earlier than it starts.

A violation is a simulator bug, never a user mistake: ``ConservationError`` names the job and the
numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridtrain.simulation.simulator import Outcome, Scenario

REL_TOL = 1e-6
ABS_TOL = 1e-6


class ConservationError(RuntimeError):
    """A replay's bookkeeping does not add up (a simulator bug: report it with the job named)."""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def cloud_compute_usd(site, spot_gpu_hours: float, od_gpu_hours: float) -> float:
    """Compute spend at one cloud site (``specs.sites.Site``): spot at its spot price, on-demand at its list price."""
    return spot_gpu_hours * (site.spot_price_per_gpu_hour or 0.0) + od_gpu_hours * site.gpu_hour_price


def check_conservation(scenario: Scenario, outcomes: Sequence[Outcome]) -> None:
    """Raise ``ConservationError`` for the first outcome whose work or spend does not add up."""
    cm = scenario.cost_model
    onprem = scenario.site(scenario.onprem)
    s_on, p_on = cm.speed(onprem), onprem.gpu_hour_price
    seen: set[str] = set()
    for o in outcomes:
        job = o.job
        if job.id in seen:
            raise ConservationError(f"job {job.id}: more than one outcome")
        seen.add(job.id)
        if o.unplaceable:
            if o.compute_usd or o.onprem_gpu_hours or o.spot_gpu_hours or o.od_gpu_hours:
                raise ConservationError(f"job {job.id}: unplaceable but charged")
            continue
        site = scenario.site(o.site) if o.cloud else None
        if o.legs:  # a spot run that failed over: each leg at its own site's speed and prices
            if o.legs[-1].site != o.site or any(not _close(sum(getattr(leg, f) for leg in o.legs), getattr(o, f))
                                                for f in ("spot_gpu_hours", "od_gpu_hours", "overhead_gpu_hours")):
                raise ConservationError(f"job {job.id}: its cloud legs do not add up to its outcome")
            parts = [(scenario.site(leg.site), leg.spot_gpu_hours, leg.od_gpu_hours, leg.overhead_gpu_hours)
                     for leg in o.legs]
        elif site is not None:
            parts = [(site, o.spot_gpu_hours, o.od_gpu_hours, o.overhead_gpu_hours)]
        elif o.spot_gpu_hours or o.od_gpu_hours:
            raise ConservationError(f"job {job.id}: cloud GPU-hours on an on-prem outcome")
        else:
            parts = []
        executed = o.onprem_gpu_hours * s_on + sum((sp + od - ovh) * cm.speed(at) for at, sp, od, ovh in parts)
        needed = job.gpu_hours + o.lost_gpu_hours
        if not _close(executed, needed):
            raise ConservationError(
                f"job {job.id}: executed {executed:.6f} GPU-h but needed {job.gpu_hours:.6f} + redone "
                f"{o.lost_gpu_hours:.6f} = {needed:.6f}")
        if not _close(o.onprem_usd, o.onprem_gpu_hours * p_on):
            raise ConservationError(f"job {job.id}: on-prem spend {o.onprem_usd:.6f} ≠ "
                                    f"{o.onprem_gpu_hours:.6f} GPU-h × {p_on:.4f}")
        cloud_compute = sum(cloud_compute_usd(at, sp, od) for at, sp, od, _ in parts)
        if not _close(o.compute_usd - o.onprem_usd, cloud_compute):
            raise ConservationError(f"job {job.id}: cloud compute {o.compute_usd - o.onprem_usd:.6f} ≠ "
                                    f"{cloud_compute:.6f} from its cloud GPU-hours")
        if not (o.start >= job.arrival - ABS_TOL and o.finish >= o.start - ABS_TOL):
            raise ConservationError(f"job {job.id}: arrives {job.arrival}, starts {o.start}, finishes {o.finish}")
