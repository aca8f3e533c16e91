"""MotoS3Server: a moto S3 server on loopback that a test can stop hard and start again on the same port.

It is the drill's ``hybridtrain.drill.loopback.LoopbackS3`` (``stop()`` closes the listener and cuts every
live connection, which is what a crashed or stopped S3 server looks like to a client: connection
reset mid-request, then connection refused; moto keeps its state in process, so after ``start()``
the buckets are still there) plus what tests need: ``reset()`` and ``enforce_auth()``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from hybridtrain.drill.loopback import LoopbackS3

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class MotoS3Server(LoopbackS3):
    def __init__(self, port: int = 0):
        super().__init__()
        self.port = port

    def _post(self, path: str, body: bytes = b"") -> dict:
        req = urllib.request.Request(f"{self.url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")

    def reset(self) -> None:
        """Drop every bucket, object and IAM entity (moto's reset API)."""
        self._post("/moto-api/reset")

    @contextmanager
    def enforce_auth(self) -> Iterator[tuple[str, str]]:
        """Make the server check signatures and IAM permissions; yields a valid (key id, secret).

        moto accepts any credentials unless ``INITIAL_NO_AUTH_ACTION_COUNT`` requests have been
        served; its ``/moto-api/reset-auth`` endpoint sets that count at run time. An IAM user
        with an ``s3:*`` policy is created first (while auth is still off), then the count is set
        to 0, so from then on a wrong key id gives ``InvalidAccessKeyId`` and a wrong secret
        ``SignatureDoesNotMatch``. The count goes back to infinity on exit.
        """
        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
                           aws_secret_access_key=SECRET_KEY, region_name=REGION)
        iam.create_user(UserName="hybridtrain-site")
        iam.put_user_policy(UserName="hybridtrain-site", PolicyName="s3-all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="hybridtrain-site")["AccessKey"]
        self._post("/moto-api/reset-auth", b"0")
        try:
            yield key["AccessKeyId"], key["SecretAccessKey"]
        finally:
            self._post("/moto-api/reset-auth", b"inf")
