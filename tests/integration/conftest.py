"""Integration fixtures: real servers on loopback, started once per test session."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridtrain.drill.loopback import LoopbackSshd, keygen, known_host_line
from hybridtrain.drill.processes import child_pids, stop_with_children
from hybridtrain.specs.sites import SshHost

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
        children = child_pids(self.pid)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        return len(children)


def start_sshd(d: Path, port: int | None = None) -> tuple[subprocess.Popen, SshServer]:
    """The drill's loopback sshd (``hybridtrain.drill.loopback.LoopbackSshd``) with the keys in ``d`` on ``port``
    (default: a free one), plus a key it refuses and a wrong host key for the tests that need them.

    Starting again with the same ``d`` and port brings "the same host" back. Stop it with ``stop_sshd``.
    """
    missing = LoopbackSshd.missing()
    if missing:
        raise RuntimeError(f"{missing.removeprefix('skipped: ')} (`.ci/run` installs it)")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("other_host_key", "other_user_key"):
        if not (d / name).exists():
            keygen(d / name)
    server = LoopbackSshd.start(d, SSHD_START_TIMEOUT_S, port=port)
    return server.proc, SshServer(
        host=server.host,
        private_key=server.private_key,
        known_hosts=server.known_hosts,
        other_private_key=(d / "other_user_key").read_text(),
        other_host_key_line=known_host_line(d / "other_host_key.pub", server.host.port),
        pid=server.proc.pid,
    )


def stop_sshd(proc: subprocess.Popen) -> None:
    """Stop a server from ``start_sshd``: the listener first, then every connection it was serving."""
    stop_with_children(proc)


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
        stop_sshd(proc)


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
        from hybridtrain.specs.sites import S3Store

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
