"""ServeOptions: how a model server is asked to listen and poll, checked before anything loads, named as the caller names them.

``hybridtrain serve`` (options ``--host``, ``--port``, ``--poll``, ``--threads``, argument ``TARGET``) and
the serve-model flow (parameters ``host``, ``port``, ``poll_s``, ``target``) ask for the same server, so
they share these checks; each passes its ``OptionNames`` and every message names the field the user
typed. ``option_problems`` finds every value that cannot work without touching the network beyond a name
lookup; ``listen`` binds the socket and turns the system's refusals (port in use, not an address of this
machine, a privileged port) into one ``SpecError`` line naming the host or port and what to give instead.
Example: ``port=38415`` while something listens there -> ``port: 127.0.0.1:38415 is in use; choose another
port (0: any free one)``.
"""

from __future__ import annotations

import errno
import math
import socket
from dataclasses import dataclass

from hybridtrain.errors import Problem, SpecError, given_as
from hybridtrain.serving.service import MAX_POLL_S, MIN_POLL_S


@dataclass(frozen=True)
class OptionNames:
    """What the caller calls each option, and what a refusal names as its source."""

    source: str
    host: str
    port: str
    poll: str
    threads: str
    target: str

    def example(self, name: str, value: str) -> str:
        """How the user would give ``value`` to option ``name``: ``--poll 2`` on the command line, ``poll_s=2`` in a form."""
        return given_as(name, value)


CLI_NAMES = OptionNames(source="serve", host="--host", port="--port", poll="--poll", threads="--threads",
                        target="TARGET")
FLOW_NAMES = OptionNames(source="serve-model", host="host", port="port", poll="poll_s", threads="threads",
                         target="target")

HOST_FIX = "give 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or another address or name of this machine"


def _port_fix(names: OptionNames) -> str:
    return f"choose another {names.port} (0: any free one)"


def option_problems(host: str, port: int, poll: float, *, names: OptionNames, threads: int | None = None,
                    target: str | None = None) -> list[Problem]:
    """Every option that cannot work (``threads`` and ``target`` only when given), each named as in ``names``."""
    problems = []
    if target is not None and not target.strip():
        problems.append(Problem(names.target, "empty; give the name of one of the model's release targets "
                                              "(promotion.release_targets[].name in the job spec)"))
    if not host.strip():
        problems.append(Problem(names.host, f"empty; {HOST_FIX}"))
    else:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as exc:
            why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
            problems.append(Problem(names.host, f"{host!r} is not an address or a name that resolves ({why}); "
                                                f"{HOST_FIX}"))
    if not 0 <= port <= 65535:
        problems.append(Problem(names.port, f"{port} is not a port; give 1-65535 (0: any free one)"))
    if not (math.isfinite(poll) and MIN_POLL_S <= poll <= MAX_POLL_S):
        problems.append(Problem(names.poll, f"{poll} is not a polling interval; give the seconds between checks of "
                                            f"the target's pointers, a number from {MIN_POLL_S} to {MAX_POLL_S:.0f} "
                                            f"(e.g. {names.example(names.poll, '2')})"))
    if threads is not None and threads < 1:
        problems.append(Problem(names.threads, f"{threads} is not a thread count; give 1 or more (1 is fastest for "
                                               "this model's requests)"))
    return problems


def check_options(host: str, port: int, poll: float, *, names: OptionNames, threads: int | None = None,
                  target: str | None = None) -> None:
    """``option_problems``, all of them in one ``SpecError`` (source ``names.source``); nothing when all can work."""
    problems = option_problems(host, port, poll, names=names, threads=threads, target=target)
    if problems:
        raise SpecError(names.source, problems)


def listen(host: str, port: int, *, names: OptionNames) -> socket.socket:
    """``bind(host, port)`` (``hybridtrain.serving.server``), its refusals as one line naming the host or the port."""
    from hybridtrain.serving.server import bind

    try:
        return bind(host, port)
    except socket.gaierror as exc:
        raise SpecError(names.source, [Problem(names.host, f"{host!r} does not resolve ({exc.strerror}); "
                                                           f"{HOST_FIX}")]) from None
    except OverflowError:  # bind() checks the range itself; only when option_problems was skipped
        raise SpecError(names.source, [Problem(names.port, f"{port} is not a port; give 1-65535 "
                                                           "(0: any free one)")]) from None
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            problem = Problem(names.host, f"{host} is not an address of this machine; {HOST_FIX}")
        elif exc.errno == errno.EADDRINUSE:
            problem = Problem(names.port, f"{host}:{port} is in use; {_port_fix(names)}")
        elif exc.errno in (errno.EACCES, errno.EPERM):
            problem = Problem(names.port, f"not allowed to listen on {host}:{port} (ports below 1024 need "
                                          f"privileges); {_port_fix(names)}")
        else:
            problem = Problem(names.host, f"cannot listen on {host}:{port} ({exc.strerror or exc}); {HOST_FIX}, or "
                                          f"{_port_fix(names)}")
        raise SpecError(names.source, [problem]) from None
