"""Loopback servers: a throwaway S3-compatible server (moto) and OpenSSH server on 127.0.0.1, for drills and tests."""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.drill.timeline import DrillFailed
from hybridtrain.specs.sites import SshHost

log = logging.getLogger(__name__)

# -- loopback servers the drill starts ------------------------------------------------------------


class LoopbackS3:
    """moto's S3 served over HTTP on 127.0.0.1 from this process; ``stop()`` is hard, ``start()`` brings it back.

    Stopping closes the listener and cuts every live connection (what a crashed server looks
    like to a client: connection reset, then refused). moto keeps its state in process, so after
    ``start()`` (same port) the buckets are still there, like a server with durable storage.

    The port stays this server's while it is stopped: a socket bound to it (``SO_REUSEPORT``, never
    listening) holds it from the first ``start()`` to ``close()``, so no other process can take it
    in between and a restart cannot fail with "Address already in use". Connecting while stopped is
    refused, as it should be: only a listening socket accepts.
    """

    def __init__(self) -> None:
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._reserved: socket.socket | None = None

    def _reserve(self) -> None:
        if self._reserved is None:
            reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # SO_REUSEPORT only: our listener (same option, same user) may share the port; a process binding it
            # with SO_REUSEADDR, or choosing a free port, may not.
            reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                reserved.bind(("127.0.0.1", self.port))
            except OSError:
                reserved.close()
                raise
            self._reserved = reserved
            self.port = reserved.getsockname()[1]

    def _listener(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the cut connections' TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("127.0.0.1", self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        return sock

    def start(self) -> None:
        from moto.moto_server.werkzeug_app import (  # lazy: heavy (moto)
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server  # lazy: heavy (werkzeug)

        logging.getLogger("werkzeug").setLevel(logging.ERROR)

        class Tracking(MotoRequestHandler):
            def setup(self) -> None:
                super().setup()
                self.server.live.add(self.connection)  # type: ignore[attr-defined]

            def finish(self) -> None:
                self.server.live.discard(self.connection)  # type: ignore[attr-defined]
                super().finish()

        self._reserve()
        listener = self._listener()
        try:  # werkzeug serves a duplicate of the listener's descriptor
            server = make_server("127.0.0.1", self.port, DomainDispatcherApplication(create_backend_app), True,
                                 request_handler=Tracking, fd=listener.fileno())
        finally:
            listener.close()
        server.live = set()  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="drill s3", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop hard: the listener closes and live connections are cut; the port stays reserved for ``start()``."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for conn in list(server.live):
            with suppress(OSError):  # closed by its handler meanwhile: already cut
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def close(self) -> None:
        """Stop, and give the port back."""
        self.stop()
        reserved, self._reserved = self._reserved, None
        if reserved is not None:
            reserved.close()


SSHD = "/usr/sbin/sshd"


@dataclasses.dataclass
class LoopbackSshd:
    """A throwaway OpenSSH server on 127.0.0.1 (key auth only) and what a site block holds to reach it."""

    proc: subprocess.Popen
    host: SshHost
    private_key: str
    known_hosts: str

    @staticmethod
    def missing() -> str | None:
        """Why no loopback sshd can be started here (None: it can)."""
        if not Path(shutil.which("sshd") or SSHD).exists():
            return "skipped: openssh-server not installed (apt-get install -y openssh-server)"
        if shutil.which("ssh-keygen") is None:
            return "skipped: ssh-keygen not installed (apt-get install -y openssh-client)"
        return None

    @classmethod
    def start(cls, d: Path, timeout: float = 15.0, port: int | None = None,
              addresses: Sequence[str] = ("127.0.0.1",)) -> LoopbackSshd:
        """Start sshd with the keys in ``d`` (made on first use) on ``port`` (default: a free loopback port).

        Starting again with the same ``d`` and port brings "the same host" back: same host key,
        authorized key and working directory. The login user is whoever runs the drill.
        ``addresses``: the loopback addresses it listens on (at most 16; the first is ``host``'s),
        so one server can stand for several machines, each at its own 127.x address.
        """

        d.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "user_key"):
            if not (d / name).exists():
                keygen(d / name)
        (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        log_path = d / "sshd.log"
        for _ in range(3):  # a free port may be taken between choosing and binding it
            chosen = port or free_port()
            with open(log_path, "wb") as fh:
                proc = subprocess.Popen(
                    [shutil.which("sshd") or SSHD, "-D", "-e", "-f", "/dev/null", f"-oHostKey={d / 'host_key'}",
                     f"-oPidFile={d / 'sshd.pid'}", f"-oPort={chosen}",
                     *(f"-oListenAddress={a}" for a in addresses),
                     f"-oAuthorizedKeysFile={d / 'authorized_keys'}", "-oPasswordAuthentication=no",
                     "-oKbdInteractiveAuthentication=no", "-oUsePAM=no", "-oStrictModes=no",
                     "-oPermitRootLogin=prohibit-password", "-oSubsystem=sftp internal-sftp"],
                    stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if listening(chosen, proc, timeout, addresses[0]):
                break
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if "Address already in use" not in log_path.read_text() or port is not None:
                raise DrillFailed(f"sshd did not start on port {chosen}: {log_path.read_text()[-2000:]}")
        else:
            raise DrillFailed(f"sshd found no free port: {log_path.read_text()[-2000:]}")
        workdir = d / "work"
        workdir.mkdir(exist_ok=True)
        host = SshHost(hostname=addresses[0], port=chosen, username=pwd.getpwuid(os.getuid()).pw_name, gpus=0,
                       workdir=str(workdir), python=sys.executable)
        return cls(proc=proc, host=host, private_key=(d / "user_key").read_text(),
                   known_hosts="".join(known_host_line(d / "host_key.pub", chosen, a) for a in addresses))

    def stop(self) -> None:
        """Stop the listener, then every connection it was serving (a stopped host has none)."""
        stop_with_children(self.proc)


def keygen(path: Path) -> None:
    """A passphrase-less ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hybridtrain-loopback", "-f", str(path)],
                   check=True, timeout=30, capture_output=True)


def known_host_line(pub: Path, port: int, address: str = "127.0.0.1") -> str:
    """The known_hosts line for a loopback host at ``address`` on ``port`` whose host key is ``pub``."""
    kind, b64 = pub.read_text().split()[:2]
    return f"[{address}]:{port} {kind} {b64}\n"


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def free_port() -> int:
    """A loopback port nobody holds now, chosen below the kernel's ephemeral range where that leaves room.

    A server that is stopped and started again on its port (the drill's hosts, the tests' "same host,
    back") must find it free: ports the kernel hands out itself — to outgoing connections and to
    ``bind(port 0)`` — come from the ephemeral range, so a port from below it is taken in between only
    by another program asking for that very number.
    """
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - LOWEST_PORT >= 1000:
        for _ in range(50):
            port = random.randrange(LOWEST_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, proc: subprocess.Popen, timeout: float, address: str = "127.0.0.1") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False
