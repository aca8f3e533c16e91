"""Warm-launch protocol: where the daemon's socket lives and the messages client, daemon and spares exchange.

Standard library only — the warm client imports this module and must start in milliseconds.

Wire format (Unix stream sockets, Linux):

* **request** (client → daemon, daemon → spare): an 8-byte header ``b"HTW1" + uint32 length``
  sent in one ``sendmsg`` together with three file descriptors (the client's stdin, stdout,
  stderr, as ``SCM_RIGHTS``), then ``length`` bytes of JSON:
  ``{"op": "run", "flow_run_id", "argv", "env", "cwd", "python", "client_pid"}``. ``env`` is the
  complete environment the process worker gave the flow-run command (``PREFECT__FLOW_RUN_ID``,
  the job variables' ``env``, the worker's settings, the control-channel port/token); ``python``
  is the client's executable, prefix and version (the daemon declines a run for another
  environment). ``{"op": "status"}`` (no descriptors) asks the daemon for one
  ``{"event": "status", ...}`` line instead.
* **events** (everything else): one JSON object per line. Daemon → client:
  ``{"event": "accepted", "spare_pid"}`` (the run is in a spare; from here on the client never
  falls back), ``{"event": "rejected", "reason"}`` (nothing started; the client falls back),
  ``{"event": "exited", "returncode"}`` (negative = killed by that signal, as in ``subprocess``).
  Client → daemon: ``{"signal": N}`` (forward signal N to the spare). Spare → daemon:
  ``{"event": "ready", "pid"}``, ``{"event": "stale", "path"}``.

Security: the socket sits in a directory only its owner can enter (``0700``), the socket itself
is ``0600``, and both sides check the peer's uid with ``SO_PEERCRED`` — the request carries the
run's environment, which may hold credentials.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

SOCKET_ENV = "HYBRIDTRAIN_WARM_SOCKET"
SPARE_MARKER_ENV = "HYBRIDTRAIN_WARM_SPARE"
MAGIC = b"HTW1"
HEADER = struct.Struct("!4sI")
MAX_REQUEST_BYTES = 4 * 1024 * 1024
STDIO_FDS = 3
# How long a client waits for "accepted"/"rejected" before starting a cold engine itself; the daemon
# keeps its --wait-for-spare well below it, so it never starts a run the client has given up on.
CLIENT_ACCEPT_TIMEOUT_S = 60.0
# Linux: sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
_UCRED = struct.Struct("3i")  # pid, uid, gid


class WarmLaunchError(Exception):
    """A warm-launch problem; the message says what to change."""


class ChannelClosed(WarmLaunchError):
    """The peer closed the connection before sending a request (a normal shutdown)."""


def default_socket_path() -> Path:
    """``$HYBRIDTRAIN_WARM_SOCKET``, else ``$XDG_RUNTIME_DIR/hybridtrain/warm.sock``, else
    ``/tmp/hybridtrain-<uid>/warm.sock``."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "hybridtrain" / "warm.sock"
    return Path("/tmp") / f"hybridtrain-{os.getuid()}" / "warm.sock"


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH_BYTES:
        raise WarmLaunchError(f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes (the Unix "
                              f"socket limit): choose a shorter --socket / {SOCKET_ENV}")


def ensure_private_dir(directory: Path) -> None:
    """Create ``directory`` with mode 0700, or check that an existing one is ours and private."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise WarmLaunchError(f"cannot create socket directory {directory}: {exc}; choose another --socket") from exc
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise WarmLaunchError(f"socket directory {directory} is not a directory (a symlink?): choose another --socket")
    if st.st_uid != os.getuid():
        raise WarmLaunchError(f"socket directory {directory} belongs to uid {st.st_uid}, not to you "
                              f"(uid {os.getuid()}): choose a --socket in a directory you own")
    if st.st_mode & 0o077:
        raise WarmLaunchError(f"socket directory {directory} has mode {stat.S_IMODE(st.st_mode):04o}: other users "
                              f"could reach the socket; run `chmod 700 {directory}` or choose another --socket")


def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def send_request(sock: socket.socket, payload: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(payload).encode()
    socket.send_fds(sock, [HEADER.pack(MAGIC, len(data))], fds)
    sock.sendall(data)


def recv_request(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Read one request; returns (payload, fds). Raises ``WarmLaunchError`` on a malformed one
    (closing any descriptors that came with it), ``ChannelClosed`` at end of stream."""
    header, fds, flags, _ = socket.recv_fds(sock, HEADER.size, STDIO_FDS)
    try:
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            raise WarmLaunchError("request carried more file descriptors than stdin/stdout/stderr")
        if not header:
            raise ChannelClosed("connection closed before a request arrived")
        header += _recv_exactly(sock, HEADER.size - len(header))
        magic, length = HEADER.unpack(header)
        if magic != MAGIC:
            raise WarmLaunchError(f"not a warm-launch request (magic {magic!r}); is the client the same version?")
        if length > MAX_REQUEST_BYTES:
            raise WarmLaunchError(f"request of {length} bytes exceeds {MAX_REQUEST_BYTES}")
        payload = json.loads(_recv_exactly(sock, length))
        if not isinstance(payload, dict):
            raise WarmLaunchError("request is not a JSON object")
        if payload.get("op", "run") == "run":
            if not isinstance(payload.get("env"), dict):
                raise WarmLaunchError("run request has no 'env' mapping")
            if len(fds) != STDIO_FDS:
                raise WarmLaunchError(f"run request carried {len(fds)} file descriptors, expected {STDIO_FDS}")
        return payload, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise WarmLaunchError("connection closed in the middle of a request")
        chunks.extend(chunk)
    return bytes(chunks)


def send_event(sock: socket.socket, event: dict[str, Any]) -> None:
    sock.sendall(json.dumps(event).encode() + b"\n")


class EventReader:
    """Reads newline-delimited JSON events from a socket; ``read()`` returns None at end of stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def pending(self) -> dict[str, Any] | None:
        """The next complete event already received, without reading the socket."""
        line, sep, rest = bytes(self._buf).partition(b"\n")
        if not sep:
            return None
        self._buf = bytearray(rest)
        return json.loads(line)

    def feed(self) -> bool:
        """Receive once; False at end of stream."""
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self._buf.extend(chunk)
        return True

    def read(self) -> dict[str, Any] | None:
        while True:
            event = self.pending()
            if event is not None:
                return event
            if not self.feed():
                return None


def query_status(path: Path | str, timeout_s: float = 5.0) -> dict[str, Any]:
    """Ask the daemon at ``path`` for its spares; raises ``OSError`` when nothing listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        send_request(sock, {"op": "status"}, [])
        event = EventReader(sock).read()
    if event is None or event.get("event") != "status":
        raise WarmLaunchError(f"daemon at {path} sent no status (got {event!r})")
    return event
