"""A trial's attempt and a Prefect API that does not answer for now: asked again, the trial is not failed."""

from __future__ import annotations

import logging

import httpx
import pytest

import flows.sweep as sweep_flows


def busy(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/api/flow_runs/")
    return httpx.HTTPStatusError("busy", request=request, response=httpx.Response(status, request=request))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(monkeypatch):
    """The attempt's answers in turn, each as (seconds the call takes, what it returns or raises); the calls made."""
    clock = Clock()
    made: list[tuple] = []
    answers: list[tuple[float, object]] = []

    def once(*args):
        made.append(args)
        took, answer = answers.pop(0)
        clock.now += took
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(sweep_flows, "_dispatch_once", once)
    monkeypatch.setattr(sweep_flows, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(sweep_flows.time, "sleep", lambda s: setattr(clock, "now", clock.now + s))
    return clock, made, answers


def dispatch(clock):
    return sweep_flows.dispatch_trial(None, {"attempt": 1}, "onprem", "inline", 60.0, "run", None, clock=clock)


def test_a_busy_api_is_asked_again_and_the_attempt_goes_on(api):
    clock, made, answers = api
    answers += [(0.1, busy(503)), (0.1, httpx.ConnectError("refused")), (5.0, "outcome")]
    assert dispatch(clock) == "outcome"
    assert len(made) == 3 and made[0] == made[2]  # the same attempt each time


def test_an_api_down_for_longer_than_the_retry_window_ends_the_attempt(api):
    clock, made, answers = api
    answers += [(0.1, busy(503))] * 40
    with pytest.raises(httpx.HTTPStatusError):
        dispatch(clock)
    assert clock.now <= sweep_flows.API_RETRY_S + 1 and len(made) < 40


def test_a_failure_after_a_long_stretch_of_work_gets_a_new_window(api):
    # Down for a while at the start, then an hour of training, then a 503 again: asked again, not counted with the first.
    clock, made, answers = api
    answers += [(0.1, busy(503))] * 5 + [(3600.0, busy(503)), (0.1, "outcome")]
    assert dispatch(clock) == "outcome" and len(made) == 7


def test_an_error_that_is_not_the_api_being_busy_ends_the_attempt_at_once(api):
    clock, made, answers = api
    answers += [(0.1, busy(422)), (0.1, "never")]
    with pytest.raises(httpx.HTTPStatusError):
        dispatch(clock)
    assert len(made) == 1
