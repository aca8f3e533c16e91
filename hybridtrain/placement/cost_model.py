"""CostModel: what a job would cost and when it would finish at one site and capacity class.

For a candidate (site, capacity class) the estimate adds up, in terms a person can check by hand:

- compute: GPUs × run hours × price per GPU-hour (on-prem: amortized; cloud: list price);
- spot: billed hours grow by the expected preemption overhead — each preemption loses half a
  checkpoint interval plus a restart — and, when the job has a deadline, the part of the work
  spot cannot be expected to finish in time is priced at on-demand (the uniform-progress
  fallback, see ``SpotRule``);
- data movement: dataset bytes × the egress price of the site holding the data, and sync time
  at the slower of the two sites' bandwidths; the final checkpoint comes back at the run site's
  egress price ("checkpoint traffic");
- time: expected finish = now + queue wait + start-up + sync + run time.

Run hours are given for the reference GPU; ``gpu_speed`` (GPU type → throughput relative to the
reference, default 1.0 for every type) scales them for other types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hybridtrain.placement.queue_state import QueueState, QueueTier
from hybridtrain.placement.request import GB, ResourceRequest
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.specs.sites import CapacityClass, Site, SiteKind


def hhmm(seconds: float) -> str:
    """A duration as ``1h05m`` (or ``never`` for infinity)."""
    if math.isinf(seconds):
        return "never"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"


def clock(t: float) -> str:
    """A POSIX time as ``2026-05-01 14:05 UTC``."""
    if math.isnan(t):
        return "unknown"
    if math.isinf(t):
        return "never" if t > 0 else "always"
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, ValueError, OSError):  # beyond what a datetime holds: an estimate gone astronomical
        return "after 9999-12-31" if t > 0 else "before 0001-01-01"


@dataclass(frozen=True, slots=True)
class SpotSplit:
    """How a spot run's work is expected to divide between spot and the on-demand fallback."""

    spot_hours: float  # billed spot hours (useful work × overhead factor)
    on_demand_hours: float
    wall_hours: float  # expected hours from start to finish


def spot_split(run_h: float, factor: float, availability: float, window_h: float | None, restart_h: float) -> SpotSplit:
    """Expected spot/on-demand split of ``run_h`` useful hours under the uniform-progress rule.

    Without a deadline everything runs on spot and the wall time stretches by 1/availability.
    With ``window_h`` hours until the deadline, spot alone suffices when availability × window
    covers the billed hours; otherwise the useful spot progress ``p`` before the switch solves
    ``p = a·(W − (run − p) − restart)/f``, and the rest runs on demand.
    """
    spot_only = run_h * factor / availability
    if window_h is None or spot_only <= window_h:
        return SpotSplit(run_h * factor, 0.0, spot_only)
    denom = factor - availability
    p = availability * (window_h - run_h - restart_h) / denom if denom > 0 else 0.0
    p = min(max(p, 0.0), run_h)
    if p <= 0.0:
        return SpotSplit(0.0, run_h, run_h)
    return SpotSplit(p * factor, run_h - p, max(window_h, run_h + restart_h))


@dataclass(frozen=True)
class Estimate:
    """The cost and timing of one job at one (site, capacity class); every term kept for the explanation."""

    site: str
    capacity_class: CapacityClass
    gpus: int
    run_hours: float  # useful run hours at this site's GPU
    price_per_gpu_hour: float
    on_demand_price_per_gpu_hour: float
    spot_gpu_hours: float
    on_demand_gpu_hours: float
    compute_usd: float
    dataset_gb: float
    dataset_egress_usd: float
    checkpoint_gb: float
    checkpoint_egress_usd: float
    queue_wait_s: float
    startup_s: float
    sync_s: float
    run_s: float
    now: float
    finish_at: float

    @property
    def egress_gb(self) -> float:
        return self.dataset_gb + self.checkpoint_gb

    @property
    def egress_usd(self) -> float:
        return self.dataset_egress_usd + self.checkpoint_egress_usd

    @property
    def total_usd(self) -> float:
        return self.compute_usd + self.egress_usd

    @property
    def start_at(self) -> float:
        return self.now + self.queue_wait_s + self.startup_s + self.sync_s

    def lines(self) -> list[str]:
        """The breakdown as sentences with the numbers, so the total can be checked by hand."""
        out = []
        if self.capacity_class is CapacityClass.opportunistic:
            out.append(
                f"compute: spot {self.gpus} GPU × {self.spot_gpu_hours / max(self.gpus, 1):.2f} h "
                f"× ${self.price_per_gpu_hour:.4f}/GPU-h + on-demand fallback "
                f"{self.gpus} GPU × {self.on_demand_gpu_hours / max(self.gpus, 1):.2f} h "
                f"× ${self.on_demand_price_per_gpu_hour:.4f}/GPU-h = ${self.compute_usd:.2f}"
            )
        else:
            out.append(
                f"compute: {self.gpus} GPU × {self.run_hours:.2f} h × ${self.price_per_gpu_hour:.4f}/GPU-h "
                f"= ${self.compute_usd:.2f}"
            )
        if self.dataset_gb:
            out.append(f"data: {self.dataset_gb:.2f} GB synced = ${self.dataset_egress_usd:.2f}, {hhmm(self.sync_s)}")
        if self.checkpoint_gb:
            out.append(f"checkpoint back: {self.checkpoint_gb:.2f} GB = ${self.checkpoint_egress_usd:.2f}")
        out.append(
            f"time: wait {hhmm(self.queue_wait_s)} + start-up {hhmm(self.startup_s)} + sync {hhmm(self.sync_s)} "
            f"+ run {hhmm(self.run_s)} → finish {clock(self.finish_at)}"
        )
        out.append(f"total: ${self.total_usd:.2f}")
        return out


@dataclass(frozen=True)
class CostModel:
    """Prices a candidate; constants are the few facts not in the sites catalog."""

    #: Seconds to relaunch on new capacity and restore the last checkpoint after a preemption.
    restart_s: float = 300.0
    #: Seconds for a cloud pool to start a worker (image pull, boot); on-prem pools are warm.
    cloud_startup_s: float = 120.0
    #: GPU type → training throughput relative to the reference GPU (missing types: 1.0).
    gpu_speed: Mapping[str, float] = field(default_factory=dict)
    #: Spot outlook assumed for a site when none is passed in.
    default_spot: SpotOutlook = SpotOutlook()

    def speed(self, site: Site) -> float:
        return self.gpu_speed.get(site.gpu_type or "", 1.0)

    def startup(self, site: Site) -> float:
        return 0.0 if site.kind is SiteKind.onprem else self.cloud_startup_s

    def estimate(
        self,
        request: ResourceRequest,
        site: Site,
        *,
        now: float,
        capacity_class: CapacityClass | None = None,
        queue: QueueState | None = None,
        spot: SpotOutlook | None = None,
        data_site: Site | None = None,
        tier: QueueTier = QueueTier.on_demand,
    ) -> Estimate:
        """Cost and finish time of ``request`` at ``site`` (``data_site``: the site holding its data).

        ``tier``: the pool queue the run would wait in (see ``QueueTier``).
        """
        klass = capacity_class or site.capacity_class
        run_h = request.run_hours / self.speed(site)
        remote = site.name != request.data_site
        src_egress = data_site.egress_per_gb if data_site is not None else 0.0
        src_bw = data_site.bandwidth_mbps if data_site is not None else site.bandwidth_mbps
        dataset_gb = request.dataset_bytes / GB if remote else 0.0
        ckpt_gb = request.checkpoint_bytes / GB if remote else 0.0
        sync_s = dataset_gb * GB * 8 / (min(src_bw, site.bandwidth_mbps) * 1e6) if remote else 0.0
        limit_h = request.max_run_hours / self.speed(site)
        wait = queue.wait_s(request.gpus, tier, run_h, limit_h) if queue is not None else 0.0
        startup = self.startup(site)
        od_price = site.gpu_hour_price
        if klass is CapacityClass.opportunistic:
            if site.spot_price_per_gpu_hour is None:
                raise ValueError(f"site {site.name} offers no spot capacity")
            outlook = spot or self.default_spot
            price = site.spot_price_per_gpu_hour
            restart_h = self.restart_s / 3600
            factor = outlook.overhead_factor(request.checkpoint_interval_s / 3600, restart_h)
            if not outlook.available_now:
                wait += outlook.expected_wait_s
            start = now + wait + startup + sync_s
            window = (request.deadline - start) / 3600 if request.deadline is not None else None
            split = spot_split(run_h, factor, outlook.availability, window, restart_h)
            spot_gh, od_gh, wall_h = request.gpus * split.spot_hours, request.gpus * split.on_demand_hours, split.wall_hours
        else:
            price = od_price
            spot_gh, od_gh, wall_h = 0.0, request.gpus * run_h, run_h
        compute = spot_gh * price + od_gh * od_price if klass is CapacityClass.opportunistic else od_gh * price
        return Estimate(
            site=site.name,
            capacity_class=klass,
            gpus=request.gpus,
            run_hours=run_h,
            price_per_gpu_hour=price,
            on_demand_price_per_gpu_hour=od_price,
            spot_gpu_hours=spot_gh,
            on_demand_gpu_hours=od_gh,
            compute_usd=compute,
            dataset_gb=dataset_gb,
            dataset_egress_usd=dataset_gb * src_egress,
            checkpoint_gb=ckpt_gb,
            checkpoint_egress_usd=ckpt_gb * site.egress_per_gb,
            queue_wait_s=wait,
            startup_s=startup,
            sync_s=sync_s,
            run_s=wall_h * 3600,
            now=now,
            finish_at=now + wait + startup + sync_s + wall_h * 3600,
        )
