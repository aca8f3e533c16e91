"""CheckpointInterval: how often to checkpoint, given what a checkpoint costs and how often the capacity is taken away.

Checkpointing every ``T`` seconds costs ``C / T`` of the run (``C``: seconds to write one) and a
preemption loses on average ``T / 2`` of work, so with a mean time between preemptions ``M``
the expected overhead is about ``C / T + T / (2 M)``, smallest at Young's interval
``T* = sqrt(2 C M)`` (Daly's refinement differs only when ``C`` is not small against ``M``).
``M`` comes from the site's observed preemption rate (``SpotOutlook.preemptions_per_hour`` or
the run's own history), ``C`` from the checkpoints the trainer has timed.

Example: a 4 s checkpoint on spot capacity preempted 0.5 times an hour (``M`` = 7200 s) →
``sqrt(2 × 4 × 7200)`` = 240 s: checkpoint every 4 minutes, about 3.3 % expected overhead.
The result is clamped to ``[MIN_INTERVAL_S, MAX_INTERVAL_S]`` — never so often that
checkpoints crowd out training when the write time was measured on a tiny state, never so
rarely that an unobserved rate (0: no preemption seen yet) risks hours of work.

With ``checkpoint.auto_interval: true`` the trainer applies this between checkpoints: until it
has timed one write it uses the lower bound, then the mean of the writes it timed.
"""

from __future__ import annotations

import math

#: Bounds of a derived interval (seconds).
MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 3600.0


def mean_time_between_preemptions_s(preemptions_per_hour: float) -> float:
    """``M`` in seconds; infinite when no preemption is expected."""
    if preemptions_per_hour < 0 or math.isnan(preemptions_per_hour):
        raise ValueError(f"preemptions_per_hour must be >= 0, got {preemptions_per_hour}")
    return math.inf if preemptions_per_hour == 0 else 3600.0 / preemptions_per_hour


def optimal_interval_s(
    write_s: float,
    preemptions_per_hour: float,
    *,
    min_s: float = MIN_INTERVAL_S,
    max_s: float = MAX_INTERVAL_S,
) -> float:
    """Young/Daly's ``sqrt(2 × write_s × MTBF)`` in seconds, clamped to ``[min_s, max_s]``.

    No expected preemptions (rate 0) gives ``max_s``; a write time of 0 (not measured yet) gives
    ``min_s``.
    """
    if write_s < 0 or math.isnan(write_s):
        raise ValueError(f"write_s must be >= 0, got {write_s}")
    if not 0 < min_s <= max_s:
        raise ValueError(f"need 0 < min_s <= max_s, got {min_s} and {max_s}")
    mtbf = mean_time_between_preemptions_s(preemptions_per_hour)
    if math.isinf(mtbf):
        return max_s
    return min(max_s, max(min_s, math.sqrt(2.0 * write_s * mtbf)))


def expected_overhead(interval_s: float, write_s: float, preemptions_per_hour: float) -> float:
    """Expected share of run time lost to writing checkpoints and to redoing work after preemptions.

    ``write_s / interval_s + interval_s / (2 × MTBF)``: the first-order model the optimum minimizes.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    mtbf = mean_time_between_preemptions_s(preemptions_per_hour)
    return write_s / interval_s + (0.0 if math.isinf(mtbf) else interval_s / (2.0 * mtbf))
