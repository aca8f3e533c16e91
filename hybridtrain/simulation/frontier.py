"""Frontier: each baseline family as a cost–misses curve, and what it would cost at exactly our number of misses.

A *family* is one baseline swept over its knob — ``threshold_burst`` (on-demand burst once more than
N runs queue; ``cloud_on_demand`` is N = −1 and ``onprem_fifo`` N = ∞) and ``spot_burst`` (the same,
bursting to the cheapest spot the job may use, else on-demand). Each setting is one point
(deadline misses, total cost). The family's *frontier* is the lower convex hull of its
Pareto-efficient points: any point on a segment between two settings is reachable in expectation
by running each job under one setting or the other at random (weights in proportion), so the
hull — not just the settings tried — is what a baseline can achieve.

``at_misses`` reads the frontier at a given number of misses by linear interpolation along the
hull segment that spans it (cloud spend interpolated with the same weights). Fewer misses than
any setting reaches: the family cannot match, flagged ``reachable=False``, and the reference is
its cheapest setting missing no more than ``floor`` deadlines (e.g. bursting at the first queued
job's misses) or than its fewest-miss setting, whichever is more — not the fewest-miss setting
itself, which can be far dearer for one fewer miss (``cloud_on_demand``) and would flatter us.
More misses than its cheapest point: that cheapest point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: family → how a row name belongs to it (prefix) and the end points' names
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "threshold_burst": ("threshold_", ("cloud_on_demand", "onprem_fifo")),
    "spot_burst": ("spot_burst_", ("greedy_spot", "onprem_fifo")),
}


@dataclass(frozen=True)
class Point:
    """One setting of a baseline: its name, misses, total cost and cloud spend."""

    name: str
    misses: float
    total_usd: float
    cloud_usd: float
    forced_cloud_usd: float = 0.0  # cloud spend on jobs the on-prem pool can never hold


@dataclass(frozen=True)
class AtMisses:
    """A family's frontier read at ``misses``."""

    family: str
    misses: float
    total_usd: float
    cloud_usd: float
    reachable: bool
    how: str  # e.g. "interpolated 30% threshold_4 + 70% threshold_8"
    forced_cloud_usd: float = 0.0


def family_points(rows: Sequence, family: str) -> list[Point]:
    """The family's settings among ``rows`` (objects with name, misses, total_usd, cloud_usd)."""
    prefix, ends = FAMILIES[family]
    return [Point(r.name, float(r.misses), float(r.total_usd), float(r.cloud_usd),
                  float(getattr(r, "forced_cloud_usd", 0.0))) for r in rows
            if r.name.startswith(prefix) or r.name in ends]


def frontier(points: Sequence[Point]) -> list[Point]:
    """Lower convex hull of the Pareto-efficient points, by misses ascending (cost descending)."""
    best: dict[float, Point] = {}
    for p in points:
        if p.misses not in best or p.total_usd < best[p.misses].total_usd:
            best[p.misses] = p
    pareto: list[Point] = []
    for p in sorted(best.values(), key=lambda p: p.misses):
        if not pareto or p.total_usd < pareto[-1].total_usd:
            pareto.append(p)
    hull: list[Point] = []
    for p in pareto:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or above the segment a–p: drop it
            if (b.total_usd - a.total_usd) * (p.misses - a.misses) >= (p.total_usd - a.total_usd) * (b.misses - a.misses):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def at_misses(points: Sequence[Point], misses: float, family: str = "", floor: float | None = None) -> AtMisses:
    """The frontier's cost and cloud spend at ``misses`` (see the module docstring)."""
    hull = frontier(points)
    if not hull:
        return AtMisses(family, misses, math.nan, math.nan, False, "no settings")
    if misses < hull[0].misses:
        cap = max(hull[0].misses, floor if floor is not None else -math.inf)
        p = min((q for q in points if q.misses <= cap), key=lambda q: (q.total_usd, q.misses))
        return AtMisses(family, p.misses, p.total_usd, p.cloud_usd, False,
                        f"cannot miss as few as {misses:g} (fewest: {hull[0].misses:g}); cheapest missing "
                        f"≤ {cap:g}: {p.name} ({p.misses:g})", p.forced_cloud_usd)
    if misses >= hull[-1].misses:
        p = hull[-1]
        return AtMisses(family, misses, p.total_usd, p.cloud_usd, True, f"{p.name} (its cheapest setting)",
                        p.forced_cloud_usd)
    for a, b in zip(hull, hull[1:], strict=False):
        if a.misses <= misses <= b.misses:
            w = (misses - a.misses) / (b.misses - a.misses)
            if w <= 1e-12:
                return AtMisses(family, misses, a.total_usd, a.cloud_usd, True, a.name, a.forced_cloud_usd)
            return AtMisses(family, misses, (1 - w) * a.total_usd + w * b.total_usd,
                            (1 - w) * a.cloud_usd + w * b.cloud_usd, True,
                            f"interpolated {100 * (1 - w):.0f}% {a.name} + {100 * w:.0f}% {b.name}",
                            (1 - w) * a.forced_cloud_usd + w * b.forced_cloud_usd)
    raise AssertionError("unreachable: misses lies within the hull")


def best_at_misses(rows: Sequence, misses: float, floor: float | None = None) -> AtMisses:
    """The cheapest family at ``misses`` among those that can reach it (else the one missing fewest)."""
    reads = [at_misses(family_points(rows, f), misses, f, floor) for f in FAMILIES if family_points(rows, f)]
    ok = [r for r in reads if r.reachable]
    if ok:
        return min(ok, key=lambda r: r.total_usd)
    return min(reads, key=lambda r: (r.misses, r.total_usd))
