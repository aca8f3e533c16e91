"""Warm client: the process work pool's flow-run ``command``; hands the run to a warm-pool daemon's spare.

Set it as the pool's ``command`` job variable (``deployments/prefect.yaml`` does)::

    python -m workers.warm_client

The process worker starts this command exactly where it would start ``python -m prefect.engine``
(same environment, working directory and pipes), supervises it and kills it to cancel. The client:

1. connects to the daemon's socket (``$HYBRIDTRAIN_WARM_SOCKET``, default
   ``workers.warm_protocol.default_socket_path()``) and checks that the daemon runs as our uid;
2. sends the run's request — flow run id, its whole environment, the working directory — together
   with its own stdin/stdout/stderr descriptors, so the spare writes straight into the worker's
   pipes (``stream_output`` and the worker's log streaming behave as with a fresh engine);
3. once the daemon answers ``accepted``, forwards SIGTERM/SIGINT/SIGHUP to the spare (the worker
   cancels by sending SIGTERM to this process, after telling the engine over Prefect's control
   channel, which the spare connects to itself);
4. exits with the spare's exit code; a spare killed by signal N makes the client kill itself with
   N, so the worker sees the same status (``-9`` → Prefect's "likely out of memory" message) as
   for a direct child.

If the daemon is not reachable, not ours, or rejects the request before starting it, the client
says so on stderr and ``exec``s ``python -m prefect.engine`` itself: the run still happens, just
cold (~4-5 s slower). Once ``accepted`` arrived it never falls back, so a run is never started
twice. Standard library only: no Prefect import, it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from types import FrameType
from typing import NoReturn

from workers.warm_protocol import (
    CLIENT_ACCEPT_TIMEOUT_S,
    SOCKET_ENV,
    EventReader,
    WarmLaunchError,
    default_socket_path,
    peer_uid,
    send_event,
    send_request,
)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CONNECT_TIMEOUT_S = 2.0
LOST_DAEMON_EXIT_CODE = 1


class _Unavailable(Exception):
    """The daemon cannot take this run; nothing was started."""


class _SignalForwarder:
    """Queues SIGTERM/SIGINT/SIGHUP until the run is in a spare, then forwards each to the daemon."""

    def __init__(self) -> None:
        self.queued: list[int] = []
        self.sock: socket.socket | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in FORWARDED_SIGNALS}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.sock is None:
            self.queued.append(signum)
            return
        try:
            send_event(self.sock, {"signal": signum})
        except OSError:
            pass  # the daemon is gone; the main loop reports it

    def attach(self, sock: socket.socket) -> None:
        self.sock = sock
        queued, self.queued = self.queued, []
        for signum in queued:
            self._handle(signum, None)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def _connect(path: str) -> tuple[socket.socket, EventReader]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise _Unavailable(f"no daemon listening at {path} ({exc.strerror})") from exc
        except OSError as exc:
            raise _Unavailable(f"cannot connect to {path}: {exc}") from exc
        daemon_pid, daemon_uid = peer_uid(sock)
        if daemon_uid != os.getuid():
            raise _Unavailable(f"the process listening at {path} (pid {daemon_pid}) runs as uid {daemon_uid}, "
                               f"not as uid {os.getuid()}; refusing to send it the run's environment")
        return sock, EventReader(sock)
    except BaseException:
        sock.close()
        raise


def _flow_run_id(argv: list[str]) -> str | None:
    return argv[0] if argv else os.environ.get("PREFECT__FLOW_RUN_ID")


def _request(argv: list[str]) -> dict:
    return {
        "op": "run",
        "flow_run_id": _flow_run_id(argv),
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "python": {"executable": sys.executable, "prefix": sys.prefix, "version": sys.version},
        "client_pid": os.getpid(),
    }


def _fallback(reason: str, argv: list[str], queued: list[int]) -> NoReturn:
    for signum in queued:  # the worker asked us to stop before anything started: do as an engine would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    print(f"warm launcher: {reason}; starting `python -m prefect.engine` directly (cold start, a few seconds "
          f"slower). Start a daemon with `python -m workers.warm_pool --socket PATH` and point {SOCKET_ENV} "
          f"at PATH to start runs warm.", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "prefect.engine", *argv])


def _exit_like(returncode: int) -> NoReturn:
    if returncode < 0:  # the spare died from a signal: die from the same one
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be caught anyway
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
        os._exit(128 - returncode)  # only reached for a signal whose default action is not to terminate
    os._exit(returncode)


def main(argv: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if argv is None else argv
    path = str(default_socket_path())
    forwarder = _SignalForwarder()
    try:
        sock, reader = _connect(path)
        try:
            stdio = [sys.stdin.fileno(), sys.stdout.fileno(), sys.stderr.fileno()]
        except (AttributeError, ValueError, OSError):
            stdio = [os.open(os.devnull, os.O_RDWR)] * 3  # started without stdio: give the spare /dev/null
        sock.settimeout(CLIENT_ACCEPT_TIMEOUT_S)  # the daemon answers within its --wait-for-spare
        try:
            send_request(sock, _request(argv), stdio)
            answer = reader.read()
        except (OSError, ValueError) as exc:
            raise _Unavailable(f"daemon at {path} did not take the request ({exc})") from exc
        if answer is None:
            raise _Unavailable(f"daemon at {path} closed the connection before starting the run")
        if answer.get("event") != "accepted":
            raise _Unavailable(f"daemon at {path} declined the run: {answer.get('reason', answer)}")
    except Exception as exc:  # noqa: BLE001 - nothing started yet: any failure means "run it cold", said on stderr
        forwarder.restore()
        reason = str(exc) if isinstance(exc, (_Unavailable, WarmLaunchError)) else f"{type(exc).__name__}: {exc}"
        _fallback(reason, argv, forwarder.queued)

    sock.settimeout(None)
    forwarder.attach(sock)
    spare_pid = answer.get("spare_pid")
    while True:
        try:
            event = reader.read()
        except OSError:
            event = None
        if event is None:
            print(f"warm launcher: lost the daemon at {path} while flow run "
                  f"{_flow_run_id(argv)} ran in its process {spare_pid}; the daemon stops its runs "
                  f"when it dies. Exiting with {LOST_DAEMON_EXIT_CODE}.", file=sys.stderr, flush=True)
            os._exit(LOST_DAEMON_EXIT_CODE)
        if event.get("event") == "exited":
            _exit_like(int(event["returncode"]))


if __name__ == "__main__":
    main()
