"""Integration fixtures: real servers on loopback, started once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.fixtures.processes import SshServer, start_sshd, stop_sshd


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

    server: object  # tests.fixtures.s3_server.MotoS3Server
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

    from tests.fixtures.s3_server import MotoS3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = MotoS3Server()
    server.start()
    yield server
    server.close()


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


@pytest.fixture
def ec2(s3_server):
    """Fresh EC2 state on the session's moto server (it serves every AWS API): a VPC whose subnet's addresses
    are loopback ones (``tests.fixtures.cloud_fleet``)."""
    from tests.fixtures.cloud_fleet import ec2_env

    return ec2_env(s3_server)
