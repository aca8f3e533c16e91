"""The control flows' parameters as a Prefect UI user types them: recover-runs' heartbeat timeout, look-back window
and flow name, the burst controller's interval — each wrong one is a problem naming the parameter, with the bounds."""

from __future__ import annotations

import math

import pytest

from flows.burst import interval_problems
from flows.recovery import MAX_HEARTBEAT_TIMEOUT_S, MIN_HEARTBEAT_TIMEOUT_S, parameter_problems
from hybridtrain.placement.burst import plan_bursts
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from tests.fixtures.placement_cases import CLOUD_EU, NOW, ONPREM
from tests.fixtures.workspaces import ROOT

GOOD = {"flow_name": "training-lifecycle", "heartbeat_timeout_s": 300.0, "lookback_hours": 24.0}


def problems(**changes) -> dict[str, str]:
    return {p.path: p.message for p in parameter_problems(**{**GOOD, **changes})}


def test_the_defaults_and_the_bounds_themselves_are_accepted():
    assert MIN_HEARTBEAT_TIMEOUT_S == 90  # three of a worker's 30-s heartbeats
    assert MAX_HEARTBEAT_TIMEOUT_S == 604800  # the longest look-back window, a week
    for ok in ({}, {"heartbeat_timeout_s": 90}, {"heartbeat_timeout_s": 86400.0}, {"heartbeat_timeout_s": 604800},
               {"lookback_hours": 168}, {"lookback_hours": 0.01}):
        assert problems(**ok) == {}, ok


@pytest.mark.parametrize("timeout", [0, 0.0, -1, 30, 89.9])
def test_a_heartbeat_timeout_within_a_live_workers_heartbeats_is_refused(timeout):
    message = problems(heartbeat_timeout_s=timeout)["heartbeat_timeout_s"]
    assert f"{timeout:g} s is shorter than 3 worker heartbeats" in message
    assert "trained twice" in message and message.endswith("give at least 90 (default 300)")


@pytest.mark.parametrize("timeout", [604800.5, 1e308, 99999999999999999999])
def test_a_heartbeat_timeout_longer_than_any_look_back_window_is_refused(timeout):
    assert problems(heartbeat_timeout_s=timeout)["heartbeat_timeout_s"] == (
        f"{timeout:g} s is longer than the longest look-back window (a week), so no pool would ever count as lost; "
        "give at most 604800 (default 300)")


@pytest.mark.parametrize("timeout", [math.inf, -math.inf, math.nan, None, "300", True])
def test_a_heartbeat_timeout_that_is_no_number_is_refused(timeout):
    message = problems(heartbeat_timeout_s=timeout)["heartbeat_timeout_s"]
    assert message.startswith(f"{timeout!r} is not a timeout") and message.endswith("give at least 90 (default 300)")


@pytest.mark.parametrize("hours", [0, -5, 168.5, 1e308, math.inf, math.nan, None])
def test_a_look_back_window_that_looks_at_nothing_or_forever_is_refused(hours):
    assert problems(lookback_hours=hours)["lookback_hours"] == (
        f"{hours!r} is not a window to look back over; give the hours, > 0 and at most 168 (a week; default 24)")


@pytest.mark.parametrize("name", ["", "training_lifecycle", "hyperparameter-sweep", "recover-runs", None])
def test_a_flow_name_that_is_not_a_lifecycle_flow_is_refused(name):
    assert problems(flow_name=name)["flow_name"] == (
        f"{name!r} is not a lifecycle flow; recover-runs resubmits runs of training-lifecycle (the default)")


def test_every_problem_of_one_call_is_reported_together():
    assert list(problems(flow_name="", heartbeat_timeout_s=0, lookback_hours=-5)) == [
        "flow_name", "heartbeat_timeout_s", "lookback_hours"]


@pytest.mark.parametrize("interval", [0, 0.0, -5, 86400.5, 1e308, math.inf, math.nan, None, True])
def test_a_burst_interval_that_is_no_pause_or_longer_than_a_day_is_refused(interval):
    [problem] = interval_problems(interval)
    assert problem.path == "interval_s"
    assert problem.message == (f"{interval!r} is not an interval; give the seconds between passes, > 0 and at most "
                               "86400 (a day; default 120)")


@pytest.mark.parametrize("interval", [120, 120.0, 0.5, 86400])
def test_a_burst_interval_within_a_day_is_accepted(interval):
    assert interval_problems(interval) == []


@pytest.mark.parametrize("margin", [-1.0, math.inf, math.nan])
def test_plan_bursts_refuses_a_margin_that_would_call_every_run_on_time_or_late(margin):
    engine = Placement([ONPREM, CLOUD_EU], Policy.load(ROOT / "deployments" / "policy.yaml"))
    with pytest.raises(ValueError) as exc:
        plan_bursts(engine, "onprem-dc1", [], now=NOW, gpu_slots=8, running=[], margin_s=margin)
    assert "margin_s" in str(exc.value)
