"""Integration fixtures: real servers on loopback, started once per test session."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridtrain.sites import SshHost

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSHD_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SshServer:
    """A throwaway OpenSSH server on 127.0.0.1 and what a site block would hold to reach it."""

    host: SshHost
    private_key: str
    known_hosts: str
    other_private_key: str  # a key the server does not accept
    other_host_key_line: str  # a different host key for the same [host]:port
    pid: int

    def drop_connections(self) -> int:
        """Kill the server's per-connection processes (as a dropped network would); returns how many."""
        children = [int(p) for p in _children(self.pid)]
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        return len(children)


def _children(pid: int) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[1]) == pid:
            out.append(entry.name)
    return out


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hybridtrain-test", "-f", str(path)],
                   check=True, timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on port {port} within {timeout:g} s: {log.read_text()}")


def start_sshd(d: Path, port: int | None = None) -> tuple[subprocess.Popen, SshServer]:
    """Start OpenSSH with the keys in ``d`` (made on first use) on ``port`` (default: a free one).

    Starting again with the same ``d`` and port brings "the same host" back: same host key,
    same authorized key, same working directory. Stop it with ``stop_sshd``.
    """
    if not Path(SSHD).exists():
        raise RuntimeError("sshd is missing: install Debian's openssh-server (`.ci/run` does)")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "other_host_key", "user_key", "other_user_key"):
        if not (d / name).exists():
            _keygen(d / name)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    log = d / "sshd.log"
    proc = None
    for _ in range(3):  # the free port may be taken between choosing and binding it
        chosen = port or _free_port()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", "/dev/null", f"-oHostKey={d / 'host_key'}", f"-oPidFile={d / 'sshd.pid'}",
                 f"-oPort={chosen}", "-oListenAddress=127.0.0.1", f"-oAuthorizedKeysFile={d / 'authorized_keys'}",
                 "-oPasswordAuthentication=no", "-oKbdInteractiveAuthentication=no", "-oUsePAM=no",
                 "-oStrictModes=no", "-oPermitRootLogin=prohibit-password", "-oSubsystem=sftp internal-sftp"],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        try:
            _wait_for_port(chosen, proc, log, SSHD_START_TIMEOUT_S)
            break
        except RuntimeError:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if "Address already in use" not in log.read_text() or port is not None:
                raise
    assert proc is not None and proc.poll() is None, log.read_text()

    def key_line(pub: Path) -> str:
        kind, b64 = pub.read_text().split()[:2]
        return f"[127.0.0.1]:{chosen} {kind} {b64}"

    workdir = d / "work"
    workdir.mkdir(exist_ok=True)
    import pwd

    host = SshHost(hostname="127.0.0.1", port=chosen, username=pwd.getpwuid(os.getuid()).pw_name, gpus=0,
                   workdir=str(workdir), python=sys.executable)
    return proc, SshServer(
        host=host,
        private_key=(d / "user_key").read_text(),
        known_hosts=key_line(d / "host_key.pub") + "\n",
        other_private_key=(d / "other_user_key").read_text(),
        other_host_key_line=key_line(d / "other_host_key.pub") + "\n",
        pid=proc.pid,
    )


def stop_sshd(proc: subprocess.Popen) -> None:
    """Stop a server from ``start_sshd``: the listener first, then every connection it was serving."""
    children = [int(p) for p in _children(proc.pid)]
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    for pid in children:  # per-connection processes outlive the listener; a stopped host has none
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Iterator[SshServer]:
    """OpenSSH (Debian openssh-server) on an unprivileged loopback port, key auth only.

    The login user is whoever runs the tests; its jobs use this interpreter (hybridtrain is
    importable) and a temporary working directory.
    """
    proc, server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# -- S3: a moto server in server mode; boto3 and DVC (s3fs) talk to it over HTTP ------------------

# Dummy credentials in the environment, so nothing falls back to real AWS ones.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

S3_BUCKET = "hybridtrain-test"


@dataclass
class S3Env:
    """A reset moto server with one empty bucket, a raw boto3 client, and site store configs."""

    server: object  # tests.integration.s3_server.MotoS3Server
    bucket: str
    client: object  # boto3 S3 client (testing/testing)

    @property
    def endpoint(self) -> str:
        return self.server.url

    def store(self, prefix: str = "", bucket: str | None = None, key: str = "testing", secret: str = "testing"):
        from hybridtrain.sites import S3Store

        return S3Store(bucket=bucket or self.bucket, prefix=prefix, endpoint_url=self.endpoint,
                       access_key_id=key, secret_access_key=secret)


@pytest.fixture(scope="session")
def s3_server():
    """moto S3 on 127.0.0.1 and a free port for the session (stoppable: see s3_server.py)."""
    import logging

    from tests.integration.s3_server import MotoS3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = MotoS3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server) -> S3Env:
    """Fresh state on the session's S3 server (moto reset) and the bucket ``hybridtrain-test``."""
    import boto3
    from botocore.config import Config

    s3_server.reset()
    client = boto3.client("s3", endpoint_url=s3_server.url, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1",
                          config=Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 2}))
    client.create_bucket(Bucket=S3_BUCKET)
    return S3Env(server=s3_server, bucket=S3_BUCKET, client=client)
