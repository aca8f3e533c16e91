"""SpotOutlook: what a site's spot capacity looks like now — there or not, how often it is there, how often it is taken back.

Passed into the cost model next to queue states and prices. The flow may fill it from a cloud's
spot-placement score or from its own preemption history; the simulator fills it from the spot
trace *up to the simulated now* (never from the future). Without one, ``CostModel`` uses its
default outlook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpotOutlook:
    """Spot capacity at one site: ``availability`` is the long-run share of time it can be had."""

    available_now: bool = True
    availability: float = 0.9
    preemptions_per_hour: float = 0.05
    #: Expected seconds until spot capacity returns when it is not available now.
    expected_wait_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.availability <= 1:  # NaN fails the comparison too
            raise ValueError(f"availability must be in (0, 1], got {self.availability}")
        # `x < 0` is False for NaN: a NaN preemption rate would price spot like on-demand, unnoticed.
        for name in ("preemptions_per_hour", "expected_wait_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    def overhead_factor(self, checkpoint_interval_h: float, restart_h: float) -> float:
        """Billed hours per useful hour: each preemption loses half a checkpoint interval and a restart."""
        return 1.0 + self.preemptions_per_hour * (checkpoint_interval_h / 2 + restart_h)
