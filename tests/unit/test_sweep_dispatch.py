"""A trial's attempt and a Prefect API that does not answer for now: asked again, the trial is not failed."""

from __future__ import annotations

import logging

import httpx
import pytest

import flows.sweep as sweep_flows


def busy(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/api/flow_runs/")
    return httpx.HTTPStatusError("busy", request=request, response=httpx.Response(status, request=request))


@pytest.fixture
def calls(monkeypatch):
    """Each attempt's answers in turn; records the calls."""
    made: list[tuple] = []
    answers: list[object] = []

    def once(*args):
        made.append(args)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(sweep_flows, "_dispatch_once", once)
    monkeypatch.setattr(sweep_flows, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr("orchestration.dispatch.time.sleep", lambda s: None)
    return made, answers


def dispatch():
    return sweep_flows.dispatch_trial(None, {"attempt": 1}, "onprem", "inline", 60.0, "run", None)


def test_a_busy_api_is_asked_again_and_the_attempt_goes_on(calls):
    made, answers = calls
    answers += [busy(503), httpx.ConnectError("refused"), "outcome"]
    assert dispatch() == "outcome"
    assert len(made) == 3 and made[0] == made[2]  # the same attempt each time


def test_an_error_that_is_not_the_api_being_busy_ends_the_attempt_at_once(calls):
    made, answers = calls
    answers += [busy(422), "never"]
    with pytest.raises(httpx.HTTPStatusError):
        dispatch()
    assert len(made) == 1
