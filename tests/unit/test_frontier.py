"""Frontier: a baseline family read at exactly our misses, by linear interpolation along its lower hull."""

from __future__ import annotations

import pytest

from hybridtrain.simulation.frontier import Point, at_misses, best_at_misses, frontier


def pts() -> list[Point]:
    return [Point("a", 0, 100.0, 80.0), Point("b", 10, 60.0, 40.0), Point("c", 20, 58.0, 30.0),
            Point("d", 30, 40.0, 10.0), Point("e", 40, 45.0, 5.0), Point("f", 10, 70.0, 50.0)]


def test_the_frontier_keeps_the_lower_hull_of_the_efficient_settings():
    hull = frontier(pts())
    # f is dominated by b; e is dearer than d with more misses; c lies above the segment b–d
    assert [p.name for p in hull] == ["a", "b", "d"]


def test_reading_at_equal_misses_interpolates_cost_and_cloud_with_the_same_weights():
    r = at_misses(pts(), 5, "x")
    assert r.reachable and r.total_usd == pytest.approx(80.0) and r.cloud_usd == pytest.approx(60.0)
    assert "50% a + 50% b" in r.how
    r = at_misses(pts(), 20, "x")
    assert r.total_usd == pytest.approx(50.0)  # on the b–d segment, below setting c's 58
    assert at_misses(pts(), 10, "x").total_usd == pytest.approx(60.0)


def test_outside_the_range_the_fewest_miss_point_is_flagged_and_more_misses_take_the_cheapest():
    few = [Point("b", 10, 60.0, 40.0), Point("d", 30, 40.0, 10.0)]
    r = at_misses(few, 3, "x")
    assert not r.reachable and r.total_usd == 60.0 and "cannot miss as few as 3" in r.how
    # a dear setting with one miss fewer does not become the reference: the cheapest within the floor does
    dear = [Point("cloud", 9, 170.0, 160.0), *few]
    assert at_misses(dear, 3, "x", floor=10).total_usd == 60.0
    assert at_misses(dear, 3, "x").total_usd == 170.0  # no floor: the fewest-miss setting
    r = at_misses(few, 99, "x")
    assert r.reachable and r.total_usd == 40.0


def test_the_best_family_is_the_cheapest_that_reaches_our_misses():
    class Row:
        def __init__(self, name, misses, total, cloud=0.0):
            self.name, self.misses, self.total_usd, self.cloud_usd = name, misses, total, cloud

    rows = [Row("cloud_on_demand", 2, 200.0), Row("threshold_0", 4, 150.0), Row("threshold_8", 40, 100.0),
            Row("onprem_fifo", 900, 50.0), Row("greedy_spot", 4, 120.0), Row("spot_burst_8", 40, 90.0)]
    assert best_at_misses(rows, 22).family == "spot_burst"
    assert best_at_misses(rows, 1).family == "threshold_burst"  # only it comes near: fewest misses 2
