"""MotoS3Server: a moto S3 server on loopback that a test can stop hard and start again on the same port.

``ThreadedMotoServer.stop()`` only stops accepting: live keep-alive connections keep being
served and the listening socket stays open. ``stop()`` here also closes the listener and cuts
every live connection, which is what a crashed or stopped S3 server looks like to a client
(connection reset mid-request, then connection refused). moto keeps its state in process, so
after ``start()`` the buckets are still there — like a real server with durable storage.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class _TrackingHandler(MotoRequestHandler):
    """Remembers its connection while it serves it, so ``stop()`` can cut it."""

    def setup(self) -> None:
        super().setup()
        self.server.live.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self.server.live.discard(self.connection)  # type: ignore[attr-defined]
        super().finish()


class MotoS3Server(ThreadedMotoServer):
    def __init__(self, port: int = 0):
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=_TrackingHandler)
        self._server.live = set()  # type: ignore[attr-defined]
        self._port = self._server.server_address[1]  # a restart binds the same port
        self._server_ready_event.set()
        self._server.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        server = self._server
        self._server_ready_event.clear()
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for conn in list(server.live):  # type: ignore[attr-defined]
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:  # the handler closed it in the meantime: already cut
                continue
        assert self._thread is not None
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

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
