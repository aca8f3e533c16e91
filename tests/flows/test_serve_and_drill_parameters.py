"""serve-model and failover-drill called with parameters a Prefect UI user gets wrong: one ``SpecError`` from the
flow naming each parameter as the form names it, before anything is loaded, listened on or created.

A number outside its bounds never reaches a deployment's run (the server refuses it: tests/flows/
test_parameter_bounds.py), and a direct call's Prefect validation refuses it before the flow's body runs; the flow's
own check, tested here with ``validate_parameters=False``, covers calls that skip that validation."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hybridtrain.errors import SpecError


def made(root: Path) -> set[str]:
    state = root / ".hybridtrain"
    return {str(p.relative_to(root)) for p in state.rglob("*")} if state.exists() else set()


@pytest.mark.parametrize("params, named", [
    ({"port": 70000}, {"port": "70000 is not a port; give 1-65535 (0: any free one)"}),
    ({"port": -1, "host": "no-such-host.invalid", "poll_s": 0.0},
     {"port": "-1 is not a port", "host": "'no-such-host.invalid' is not an address or a name that resolves",
      "poll_s": "0.0 is not a polling interval"}),
    ({"target": ""}, {"target": "empty; give the name of one of the model's release targets"}),
], ids=["port-out-of-range", "port-host-poll", "empty-target"])
def test_serve_model_names_each_bad_parameter(prefect_server, workspace, params, named):
    from flows.serving import serve_model

    kwargs = {"target": "onprem-serving", "host": "127.0.0.1", "port": 0, **params}
    with pytest.raises(SpecError) as raised:
        serve_model.with_options(validate_parameters=False)(**kwargs, workspace=str(workspace))
    assert raised.value.source == "serve-model"
    found = {p.path: p.message for p in raised.value.problems}
    assert set(found) == set(named)
    for name, text in named.items():
        assert found[name].startswith(text), found[name]
    assert made(workspace) == set()


def test_serve_model_names_a_port_in_use(prefect_server, workspace):
    from flows.serving import serve_model

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(SpecError) as raised:
            serve_model(target="onprem-serving", host="127.0.0.1", port=port, workspace=str(workspace))
    (problem,) = raised.value.problems
    assert problem.path == "port"
    assert problem.message == f"127.0.0.1:{port} is in use; choose another port (0: any free one)"
    assert made(workspace) == set()  # no serving status, no audit record


def test_failover_drill_names_the_forms_fields_and_bounds_steps(prefect_server, workspace):
    from flows.drill import failover_drill

    with pytest.raises(SpecError) as raised:
        failover_drill.with_options(validate_parameters=False)(scenarios=["nope"], steps=10**12, interval=0,
                                                               workspace=str(workspace))
    assert raised.value.source == "failover-drill"
    found = {p.path: p.message for p in raised.value.problems}
    assert list(found) == ["scenarios", "steps", "interval"]
    assert found["scenarios"].startswith("unknown drill scenario 'nope'; choose one of: kill-9")
    assert found["steps"] == "1000000000000 is too many; give at most 10000 (default 300)"
    assert found["interval"] == "must be at least 2 steps, got 0"
    assert "--" not in str(raised.value)
    assert made(workspace) == set()  # no drills directory


@pytest.mark.parametrize("call, named", [
    ("serve", ["port", "poll_s"]),
    ("drill", ["steps", "interval"]),
])
def test_a_direct_call_with_numbers_out_of_range_is_refused_by_prefect_naming_them(prefect_server, workspace, call,
                                                                                   named):
    """As called from Python (validation on), the numbers' bounds are checked by Prefect before the flow's body."""
    from prefect.exceptions import ParameterTypeError

    from flows.drill import failover_drill
    from flows.serving import serve_model

    with pytest.raises(ParameterTypeError) as raised:
        if call == "serve":
            serve_model(target="onprem-serving", host="127.0.0.1", port=70000, poll_s=0.0, workspace=str(workspace))
        else:
            failover_drill(scenarios=["kill-9"], steps=10**12, interval=0, workspace=str(workspace))
    assert [line.split(":")[0] for line in str(raised.value).splitlines()[1:]] == [f" - {name}" for name in named]
    assert made(workspace) == set()
