"""Young/Daly checkpoint interval: the optimum of the overhead model, clamped, from a preemption rate."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hybridtrain.errors import SpecError
from hybridtrain.specs.job import CheckpointSpec, parse_spec
from hybridtrain.training.checkpoint_interval import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    expected_overhead,
    mean_time_between_preemptions_s,
    optimal_interval_s,
)
from tests.fixtures.workspaces import ROOT


def test_worked_example_from_the_docstring():
    # 4 s writes, 0.5 preemptions/h (MTBF 7200 s) → sqrt(2 × 4 × 7200) = 240 s, 3.3 % overhead.
    assert optimal_interval_s(4.0, 0.5) == pytest.approx(240.0)
    assert expected_overhead(240.0, 4.0, 0.5) == pytest.approx(1 / 30)
    assert mean_time_between_preemptions_s(0.5) == 7200.0


def test_more_preemptions_or_cheaper_writes_mean_more_frequent_checkpoints():
    assert optimal_interval_s(10.0, 2.0) < optimal_interval_s(10.0, 0.5) < optimal_interval_s(10.0, 0.1)
    assert optimal_interval_s(2.0, 0.5) < optimal_interval_s(20.0, 0.5)


def test_clamped_to_sane_bounds():
    assert optimal_interval_s(0.0, 1.0) == MIN_INTERVAL_S  # write time not measured yet
    assert optimal_interval_s(0.01, 30.0) == MIN_INTERVAL_S  # tiny state, very unstable capacity
    assert optimal_interval_s(5.0, 0.0) == MAX_INTERVAL_S  # no preemption observed: never unbounded
    assert optimal_interval_s(600.0, 0.01) == MAX_INTERVAL_S
    assert optimal_interval_s(4.0, 0.5, min_s=300, max_s=900) == 300
    assert mean_time_between_preemptions_s(0) == math.inf and expected_overhead(60, 1, 0) == pytest.approx(1 / 60)


@given(write_s=st.floats(0.5, 120), rate=st.floats(0.01, 20))
def test_the_unclamped_optimum_minimizes_the_expected_overhead(write_s, rate):
    t = optimal_interval_s(write_s, rate, min_s=1e-3, max_s=1e9)
    best = expected_overhead(t, write_s, rate)
    for factor in (0.5, 0.9, 1.1, 2.0):
        assert best <= expected_overhead(t * factor, write_s, rate) + 1e-12


def test_invalid_inputs_are_refused():
    for bad in (lambda: optimal_interval_s(-1, 1), lambda: optimal_interval_s(1, -1),
                lambda: optimal_interval_s(1, 1, min_s=10, max_s=5), lambda: expected_overhead(0, 1, 1),
                lambda: optimal_interval_s(float("nan"), 1)):
        with pytest.raises(ValueError):
            bad()


def test_spec_fields_default_off_and_auto_excludes_a_fixed_time_interval():
    cp = CheckpointSpec()
    assert cp.auto_interval is False and cp.preemption_grace_s == 30.0
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data["checkpoint"] = {"interval_steps": None, "auto_interval": True, "preemption_grace_s": 90}
    spec = parse_spec(data)
    assert spec.checkpoint.auto_interval and spec.checkpoint.preemption_grace_s == 90
    data["checkpoint"] = {"auto_interval": True, "interval_minutes": 10}
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert [p.path for p in err.value.problems] == ["checkpoint.interval_minutes"]
    assert "auto_interval derives the time interval" in str(err.value)
    data["checkpoint"] = {"preemption_grace_s": 0}
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert [p.path for p in err.value.problems] == ["checkpoint.preemption_grace_s"]
