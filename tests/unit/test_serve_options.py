"""ServeOptions: the serve checks the CLI and the serve-model flow share, each naming the option as its caller does.

``hybridtrain serve``'s own messages are tested in tests/integration/test_serving_cli.py; these check the names the
serve-model flow's form uses (``port``, ``host``, ``poll_s``, ``target``) and that a refusal leaves no socket open.
"""

from __future__ import annotations

import socket

import pytest

from hybridtrain.errors import SpecError
from hybridtrain.serving.options import CLI_NAMES, FLOW_NAMES, check_options, listen, option_problems


def messages(problems) -> dict[str, str]:
    return {p.path: p.message for p in problems}


@pytest.mark.parametrize("port", [70000, -1])
def test_a_port_out_of_range_names_the_port_parameter(port):
    found = messages(option_problems("127.0.0.1", port, 2.0, target="onprem-serving", names=FLOW_NAMES))
    assert found == {"port": f"{port} is not a port; give 1-65535 (0: any free one)"}


def test_every_bad_flow_parameter_is_named_as_the_form_names_it():
    with pytest.raises(SpecError) as raised:
        check_options("no-such-host.invalid", 70000, 0.0, target="", names=FLOW_NAMES)
    assert raised.value.source == "serve-model"
    found = messages(raised.value.problems)
    assert set(found) == {"target", "host", "port", "poll_s"}
    assert found["target"].startswith("empty; give the name of one of the model's release targets")
    assert found["host"].startswith("'no-such-host.invalid' is not an address or a name that resolves")
    assert found["poll_s"].endswith("a number from 0.05 to 3600 (e.g. poll_s=2)")
    assert not any("--" in text for text in found.values())


@pytest.mark.parametrize("poll", [3600.5, 1e308])
def test_a_poll_longer_than_an_hour_is_refused(poll):
    found = messages(option_problems("127.0.0.1", 0, poll, target="onprem-serving", names=FLOW_NAMES))
    assert found == {"poll_s": f"{poll} is not a polling interval; give the seconds between checks of the target's "
                               "pointers, a number from 0.05 to 3600 (e.g. poll_s=2)"}
    assert option_problems("127.0.0.1", 0, 3600.0, target="onprem-serving", names=FLOW_NAMES) == []


def test_the_cli_names_stay_the_cli_flags():
    found = messages(option_problems("", 70000, 0.0, threads=0, target=" ", names=CLI_NAMES))
    assert set(found) == {"TARGET", "--host", "--port", "--poll", "--threads"}
    assert found["--poll"].endswith("(e.g. --poll 2)")
    assert found["--threads"] == "0 is not a thread count; give 1 or more (1 is fastest for this model's requests)"


def test_a_port_in_use_names_the_port_and_leaves_no_socket_open(monkeypatch):
    made: list[socket.socket] = []

    class Recorded(socket.socket):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        monkeypatch.setattr(socket, "socket", Recorded)
        with pytest.raises(SpecError) as raised:
            listen("127.0.0.1", port, names=FLOW_NAMES)
    assert raised.value.source == "serve-model"
    (problem,) = raised.value.problems
    assert problem.path == "port"
    assert problem.message == f"127.0.0.1:{port} is in use; choose another port (0: any free one)"
    assert len(made) == 1 and made[0].fileno() == -1  # the refused socket was closed (a worker runs many runs)


def test_an_address_of_another_machine_names_the_host():
    with pytest.raises(SpecError) as raised:
        listen("8.8.8.8", 0, names=FLOW_NAMES)
    (problem,) = raised.value.problems
    assert problem.path == "host" and problem.message.startswith("8.8.8.8 is not an address of this machine")


def test_a_port_bind_refuses_is_named_even_when_the_checks_were_skipped():
    with pytest.raises(SpecError) as raised:
        listen("127.0.0.1", 70000, names=FLOW_NAMES)
    assert [p.path for p in raised.value.problems] == ["port"]
