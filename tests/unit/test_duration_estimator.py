"""The engine's duration estimates: a job's own finished runs first, its class's when it has too few."""

from __future__ import annotations

import pytest

from hybridtrain.placement.duration_estimator import DeclaredLimit, HistoryQuantile, plan_hours


def _history(class_ratios, family_ratios=(), quantile=0.9, **kw) -> HistoryQuantile:
    h = HistoryQuantile(quantile=quantile, **kw)
    for r in class_ratios:
        h.observe(10.0, 10.0 * r, "opportunistic")
    for r in family_ratios:
        h.observe(2.0, 2.0 * r, "opportunistic", family="sweep")
    return h


def test_a_job_with_three_finished_runs_is_estimated_from_them_not_from_its_class():
    # The class runs to half its limit; this job's runs go to the limit, or stop at a third (pruned).
    h = _history([0.5] * 40, [1.0, 0.34, 1.0])
    assert h.estimate(2.0, "opportunistic", family="sweep") == pytest.approx(2.0)
    assert h.estimate(2.0, "opportunistic", 0.5, family="sweep") == pytest.approx(2.0)
    assert h.estimate(2.0, "opportunistic", 0.1, family="sweep") == pytest.approx(0.68)
    # Its runs count for the class too; a one-off of the class still gets the class's estimate.
    assert h.estimate(2.0, "opportunistic", 0.5) == pytest.approx(1.0)
    assert h.estimate(2.0, "opportunistic", family="other") == h.estimate(2.0, "opportunistic")


def test_before_enough_runs_of_its_own_a_job_gets_its_classs_estimate_and_before_that_its_limit():
    assert _history([0.5] * 40, [1.0, 1.0]).estimate(2.0, "opportunistic", family="sweep") == pytest.approx(1.0)
    assert _history([0.5] * 5, [1.0, 1.0]).estimate(2.0, "opportunistic", family="sweep") == 2.0
    assert _history([], [0.25] * 4, family_min_samples=5).estimate(2.0, "opportunistic", family="sweep") == 2.0
    assert _history([], [0.25] * 5, family_min_samples=5).estimate(2.0, "opportunistic", family="sweep") == 0.5


def test_the_window_keeps_the_newest_runs():
    h = _history([], [1.0] * 5 + [0.25] * 5, window=5)
    assert h.estimate(2.0, "opportunistic", family="sweep") == pytest.approx(0.5)
    assert h.estimate(2.0, "opportunistic", 1.0) == 2.0  # the class had fewer than min_samples: its limit


def test_the_declared_limit_ignores_history_and_plans_never_exceed_the_limit_or_the_deadline():
    assert DeclaredLimit(0.5).estimate(4.0, "standard", family="x") == 2.0
    assert plan_hours(6.0, 4.0) == 4.0 and plan_hours(2.0, 4.0, 0.5) == 0.5
    with pytest.raises(ValueError, match="quantile"):
        HistoryQuantile(quantile=0)
