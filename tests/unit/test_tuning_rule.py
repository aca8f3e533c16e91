"""The tuning rule (``comparison.pick``): the cheapest setting clear of its misses line by more than the
line's noise is kept; when none is, settings whose cost difference is within its own window-to-window
noise cost the same and the one missing fewest of them is kept; a real saving still wins."""

from __future__ import annotations

import pytest

from hybridtrain.simulation.comparison import MISS_MARGIN, clear_of_the_line, cost_se, pick, window_costs, window_cuts
from hybridtrain.simulation.simulator import Outcome
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity


def setting(q: float, value: float | None, misses: list[int], usd: list[float]) -> dict:
    return {"quantile": q, "queue_quantile": 0.5, "miss_above_usd": value, "total_usd": round(sum(usd), 2),
            "misses": sum(misses), "window_usd": usd, "window_misses": misses}


# The tuning half of seed 2024, loose deadlines, 1.57x: misses and cost per quarter of its jobs.
REFERENCE = [2, 0, 3, 1]  # bursting at the first queued job: 6 misses
CHEAPEST = setting(0.75, 10.0, [1, 0, 3, 1], [1978.0, 647.0, 2857.0, 1667.0])
FEWER_MISSES = setting(0.9, 20.0, [0, 0, 3, 1], [1948.0, 645.0, 2865.0, 1697.0])  # $8 dearer in all
NO_VALUE = setting(0.9, None, [0, 0, 2, 0], [2020.0, 644.0, 3137.0, 1667.0])  # $320 dearer, mostly in one quarter


def test_a_setting_clear_of_the_line_beats_cheaper_ones_that_only_just_make_it():
    # Regression (issue #21, loose 1.57x): the cheapest setting, 5 misses where 5.1 were allowed, was kept;
    # on the report half it missed more deadlines than bursting at the first queued job on 3 of 5 seeds.
    # Then (spot failover, 11-28) the next one, 4 misses, fell out of its cost noise and the same happened.
    assert not clear_of_the_line(CHEAPEST, REFERENCE) and not clear_of_the_line(FEWER_MISSES, REFERENCE)
    assert clear_of_the_line(NO_VALUE, REFERENCE)
    assert pick([CHEAPEST, FEWER_MISSES, NO_VALUE], 6, REFERENCE) is NO_VALUE
    assert pick([CHEAPEST, FEWER_MISSES, NO_VALUE], 6) is CHEAPEST  # without windows: the cheapest, as before


def test_with_none_clear_a_saving_smaller_than_its_noise_does_not_buy_a_miss():
    assert FEWER_MISSES["total_usd"] - CHEAPEST["total_usd"] < cost_se(FEWER_MISSES, CHEAPEST)
    assert pick([CHEAPEST, FEWER_MISSES], 6, REFERENCE) is FEWER_MISSES


def test_the_cheapest_is_kept_when_it_is_clear_of_the_line():
    # far under the line (tight deadlines: hundreds of misses), fewer misses within the cost noise buy nothing
    reference = [40, 45, 38, 42]
    cheap = setting(0.75, 3.0, [10, 12, 9, 11], CHEAPEST["window_usd"])
    safer = setting(0.75, 5.0, [5, 6, 4, 5], FEWER_MISSES["window_usd"])
    assert clear_of_the_line(cheap, reference)
    assert pick([safer, cheap], sum(reference), reference) is cheap


def test_a_saving_larger_than_its_noise_wins():
    # neither is clear of the line: the cost decides when the difference is real
    steady = setting(0.9, 20.0, [0, 0, 3, 1], [w + 30.0 for w in CHEAPEST["window_usd"]])  # $120 dearer in every quarter
    assert cost_se(steady, CHEAPEST) == pytest.approx(0.0)
    assert pick([CHEAPEST, steady], 6, REFERENCE) is CHEAPEST


def test_the_misses_line_comes_first():
    # fewer misses, within the noise, but a deadline value needs the margin: not allowed
    over = setting(0.9, 20.0, [2, 0, 3, 1], FEWER_MISSES["window_usd"])
    assert over["misses"] > MISS_MARGIN * 6
    assert pick([CHEAPEST, over], 6, REFERENCE) is CHEAPEST
    # nothing misses as few as the reference: the fewest misses, whatever it costs
    assert pick([CHEAPEST, NO_VALUE], 1, [0, 0, 1, 0]) is NO_VALUE


def test_windows_split_the_jobs_evenly_and_count_each_job_once():
    jobs = [SimJob(f"j{i}", float(i), 1, 1.0, 1.0, "standard", Sensitivity.internal, 5.0 if i % 2 else None,
                   0, 0, 1800.0) for i in range(8)]
    cuts = window_cuts(jobs, 4)
    assert cuts == [2.0, 4.0, 6.0]
    outs = [Outcome(job=j, start=j.arrival, finish=j.arrival + 3600.0, site="onprem-dc1", compute_usd=1.0 + i)
            for i, j in enumerate(jobs)]
    outs[7] = Outcome(job=jobs[7], unplaceable=True)
    usd, misses = window_costs(outs, cuts)
    assert usd == [1.0 + 2.0, 3.0 + 4.0, 5.0 + 6.0, 7.0]
    assert misses == [1, 1, 1, 1]  # every odd job is due 5 s after arriving and takes an hour
