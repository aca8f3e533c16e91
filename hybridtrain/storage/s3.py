"""S3ObjectStore: a site's object store on an S3-compatible bucket (AWS, MinIO, Ceph, moto), verified end to end.

The same ``ObjectStore`` interface as ``LocalObjectStore``, over boto3, for any endpoint URL and
the credentials of the site's block (``S3Store``). What it guarantees:

- **Visible only when complete.** A small object is one ``PutObject``; a file above
  ``multipart_threshold`` goes up as a multipart upload (s3transfer), which S3 makes visible only
  when ``CompleteMultipartUpload`` succeeds. A failed multipart upload is aborted — by s3transfer
  at once, or, when the endpoint was down at that moment, by this store before its next attempt
  (and before the next write of that key if every attempt failed), so no part lingers.
- **Checksums end to end.** Every write sends a SHA-256 the server checks (``ChecksumSHA256`` for
  one-part objects, per-part SHA-256 for multipart) and stores the object's own SHA-256 in its
  metadata (``x-amz-meta-sha256``). Every read recomputes it; a mismatch is read once more (in
  case the bytes changed in flight), then raises ``ChecksumMismatch`` (not retried further). Files are downloaded to
  a temporary name next to the destination and renamed into place only once verified.
- **Bounded retries.** botocore retries single requests (standard mode, ``request_attempts``)
  under explicit connect/read timeouts; around that, each whole-object operation is retried up to
  ``attempts`` times with exponential backoff on connection failures, timeouts, throttling and
  5xx. Then ``SiteUnavailable`` (endpoint unreachable) or ``TransientError`` (server errors),
  both naming the endpoint and bucket.
- **Config errors are not retried.** Refused credentials (``InvalidAccessKeyId``,
  ``SignatureDoesNotMatch``, ``AccessDenied``) and a missing bucket raise ``SpecError`` at once,
  pointing at the ``store.*`` field of the site to fix.

Example: a 40 MiB checkpoint with ``multipart_threshold=8 MiB`` is sent as 5 parts; the endpoint
stops after 12 MiB; s3transfer fails and its abort cannot reach the server; the store waits
``backoff_s``, aborts the dangling upload (the endpoint is back), uploads again and succeeds.
Listing the bucket at any moment shows either no object or the whole, verified one.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError as BotoHTTPClientError
from s3transfer.exceptions import RetriesExceededError
from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber

from hybridtrain.errors import ChecksumMismatch, Problem, SiteUnavailable, SpecError, TransientError
from hybridtrain.specs.sites import S3Store
from hybridtrain.storage.object_store import TMP_PREFIX, ObjectInfo, check_key

log = logging.getLogger(__name__)

T = TypeVar("T")
MiB = 1024 * 1024
SHA256_META = "sha256"

#: Error codes meaning "these credentials were refused": fix the site block, do not retry.
AUTH_CODES = {
    "InvalidAccessKeyId": "store.access_key_id",
    "SignatureDoesNotMatch": "store.secret_access_key",
    "InvalidToken": "store.access_key_id",
    "ExpiredToken": "store.access_key_id",
    "AccessDenied": "store.access_key_id",
    "AllAccessDisabled": "store.access_key_id",
    "403": "store.access_key_id",  # HEAD responses carry no error body, only the status
}
#: Error codes a retry may cure.
TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "ServiceUnavailable", "503", "500", "502", "504",
}  # fmt: skip


@dataclass(frozen=True)
class S3Options:
    """Timeouts, retries and multipart sizes of an ``S3ObjectStore`` (defaults suit a WAN link)."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    #: botocore's attempts per HTTP request (standard retry mode), first try included.
    request_attempts: int = 3
    #: Our attempts per whole-object operation, first try included.
    attempts: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    multipart_threshold: int = 64 * MiB
    multipart_chunksize: int = 16 * MiB
    max_concurrency: int = 8

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.request_attempts < 1:
            raise ValueError("attempts and request_attempts must be at least 1")
        if self.multipart_chunksize < 5 * MiB:
            raise ValueError("S3 requires multipart parts of at least 5 MiB (multipart_chunksize)")

    def delay(self, attempt: int) -> float:
        """Backoff before attempt ``attempt + 1``: backoff_s, 2×, 4×... capped at backoff_max_s."""
        return min(self.backoff_max_s, self.backoff_s * (2 ** (attempt - 1)))


class _Failure(Exception):
    """Internal: an attempt failed in a way worth retrying; carries what the final error should say."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind  # "unreachable" | "transient" | "corrupt"
        self.detail = detail


class _Progress(BaseSubscriber):
    def __init__(self, callback: Callable[[int], None]):
        self._callback = callback

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self._callback(bytes_transferred)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(4 * MiB), b""):
            h.update(block)
    return h.hexdigest()


class S3ObjectStore:
    """Objects under ``s3://bucket/prefix/subdir/`` of one S3-compatible endpoint."""

    def __init__(
        self,
        store: S3Store,
        subdir: str = "",
        *,
        site: str | None = None,
        options: S3Options | None = None,
        on_retry: Callable[[int, BaseException], None] | None = None,
    ):
        self.config = store
        self.options = options or S3Options()
        self.bucket = store.bucket
        self.endpoint = store.endpoint_url or f"https://s3.{store.region}.amazonaws.com"
        self.site = site or f"{self.endpoint}/{self.bucket}"
        self.prefix = "/".join(p for p in (store.prefix.strip("/"), subdir.strip("/")) if p)
        #: Called with (failed attempt number, its error) before each retry — for logs and tests.
        self.on_retry = on_retry
        # key -> moment of the last failed multipart write: parts of it may still sit on the server.
        self._dangling: dict[str, datetime] = {}
        self._bucket_checked = False
        secret = store.secret_access_key.get_secret_value() if store.secret_access_key else None
        session = boto3.session.Session(
            aws_access_key_id=store.access_key_id, aws_secret_access_key=secret, region_name=store.region
        )
        o = self.options
        self._client = session.client(
            "s3",
            endpoint_url=store.endpoint_url,
            config=Config(
                connect_timeout=o.connect_timeout_s,
                read_timeout=o.read_timeout_s,
                retries={"mode": "standard", "total_max_attempts": o.request_attempts},
                max_pool_connections=max(10, o.max_concurrency + 2),
                # MinIO, Ceph and moto serve buckets by path; AWS by virtual host.
                s3={"addressing_style": "path" if store.endpoint_url else "auto"},
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=o.multipart_threshold,
            multipart_chunksize=o.multipart_chunksize,
            max_request_concurrency=o.max_concurrency,
            num_download_attempts=o.request_attempts,
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r}, endpoint={self.endpoint!r})"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> Any:
        """The boto3 S3 client (configured timeouts and retries)."""
        return self._client

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- interface -----------------------------------------------------------------------------

    def check(self) -> None:
        """Fail fast when the bucket is missing or the credentials are refused (one HEAD request)."""
        self._run("check bucket", "", self._head_bucket)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        full = self._full(key)
        digest = hashlib.sha256(data).digest()

        def put() -> None:
            self._client.put_object(
                Bucket=self.bucket, Key=full, Body=data, ChecksumAlgorithm="SHA256",
                ChecksumSHA256=base64.b64encode(digest).decode(), Metadata={SHA256_META: digest.hex()},
            )

        self._run("upload", key, put)
        return ObjectInfo(key, len(data), datetime.now(UTC))

    def create(self, key: str, data: bytes) -> bool:
        """Write-if-absent: a PutObject with ``If-None-Match: *`` (S3 conditional writes); 412 -> False."""
        full = self._full(key)
        digest = hashlib.sha256(data).digest()

        def put() -> bool:
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*", ChecksumAlgorithm="SHA256",
                    ChecksumSHA256=base64.b64encode(digest).decode(), Metadata={SHA256_META: digest.hex()},
                )
            except ClientError as exc:
                if _code(exc) in ("PreconditionFailed", "412") or exc.response.get(
                        "ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                    return False
                if _code(exc) == "ConditionalRequestConflict":  # another conditional write in flight: ask again
                    raise _Failure("transient", f"ConditionalRequestConflict: {exc}") from None
                raise
            return True

        return self._run("upload", key, put)

    def put_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> ObjectInfo:
        """Upload a file; above ``multipart_threshold`` as a multipart upload. ``progress`` gets byte deltas."""
        full = self._full(key)
        path = Path(path)
        size = path.stat().st_size
        sha = _sha256_file(path)
        extra: dict[str, Any] = {"ChecksumAlgorithm": "SHA256", "Metadata": {SHA256_META: sha}}
        if size < self.options.multipart_threshold:
            # One request: the server checks the whole object's SHA-256 (multipart: each part's).
            extra["ChecksumSHA256"] = base64.b64encode(bytes.fromhex(sha)).decode()
        subscribers = [_Progress(progress)] if progress else None

        def upload() -> None:
            self._abort_dangling(full)
            try:
                with TransferManager(self._client, self._transfer) as tm:
                    tm.upload(str(path), self.bucket, full, extra_args=extra, subscribers=subscribers).result()
            except (BotoCoreError, ClientError, RetriesExceededError):
                if size >= self.options.multipart_threshold:
                    # s3transfer aborts a failed multipart upload, but not if the endpoint is gone.
                    self._dangling[full] = datetime.now(UTC)
                raise
            self._dangling.pop(full, None)

        self._run("upload", key, upload)
        return ObjectInfo(key, size, datetime.now(UTC))

    def get_bytes(self, key: str) -> bytes:
        full = self._full(key)

        def get() -> bytes:
            resp = self._client.get_object(Bucket=self.bucket, Key=full, ChecksumMode="ENABLED")
            data = resp["Body"].read()
            self._verify(key, resp.get("Metadata", {}), hashlib.sha256(data).hexdigest())
            return data

        return self._run("download", key, get)

    def get_file(self, key: str, dest: Path) -> Path:
        full = self._full(key)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)

        def get() -> Path:
            head = self._client.head_object(Bucket=self.bucket, Key=full)
            fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, dir=dest.parent)
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                with TransferManager(self._client, self._transfer) as tm:
                    tm.download(self.bucket, full, str(tmp)).result()
                self._verify(key, head.get("Metadata", {}), _sha256_file(tmp))
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            return dest

        return self._run("download", key, get)

    def exists(self, key: str) -> bool:
        full = self._full(key)

        def head() -> bool:
            try:
                self._client.head_object(Bucket=self.bucket, Key=full)
                return True
            except ClientError as exc:
                if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise
            # A HEAD 404 does not say whether the key or the bucket is missing: ask once.
            if not self._bucket_checked:
                self._head_bucket()
            return False

        return self._run("look up", key, head)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""

        def scan() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(obj["Key"][len(base):], int(obj["Size"]), obj["LastModified"]))
            return sorted(out, key=lambda o: o.key)

        return self._run("list", prefix or "(all)", scan)

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._run("delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=full))

    # -- internals ------------------------------------------------------------------------------

    def _head_bucket(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise self._missing_bucket() from None
            raise
        self._bucket_checked = True

    def _verify(self, key: str, metadata: dict[str, str], actual: str) -> None:
        expected = metadata.get(SHA256_META)
        if expected is None:
            # Written by another tool: nothing recorded to compare with (botocore still checks
            # a stored full-object checksum when there is one).
            log.debug("object %s/%s has no sha256 metadata; not verified", self.url, key)
            return
        if expected != actual:
            raise _Failure("corrupt", f"{expected}|{actual}")

    def _abort_dangling(self, full: str) -> None:
        """Abort multipart uploads of ``full`` left by an earlier failed write of this store."""
        since = self._dangling.get(full)
        if since is None:
            return
        try:
            resp = self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=full)
            for up in resp.get("Uploads", []):
                if up["Key"] == full and up["Initiated"] <= since:
                    self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=up["UploadId"])
                    log.info("aborted the incomplete multipart upload %s of %s/%s", up["UploadId"], self.url, full)
        except (BotoCoreError, ClientError) as exc:
            # The write that follows meets the same endpoint and reports its state; the record
            # stays so that a later write cleans up.
            log.warning("could not abort incomplete uploads of %s/%s yet: %s", self.url, full, exc)
            return
        self._dangling.pop(full, None)

    def _run(self, action: str, key: str, fn: Callable[[], T]) -> T:
        """Run one whole-object operation with our retries; map errors to what the caller should do."""
        o = self.options
        what = f"{action} of {key!r} at {self.url} (endpoint {self.endpoint}, bucket {self.bucket!r})"
        last: _Failure | None = None
        for attempt in range(1, o.attempts + 1):
            try:
                return fn()
            except _Failure as exc:
                last = exc
            except ClientError as exc:
                last = self._classify_client_error(exc, key)
            except NoCredentialsError:
                raise SpecError(f"site {self.site} store", [Problem(
                    "store.access_key_id",
                    f"no credentials for {self.endpoint}: set access_key_id and secret_access_key in the site's "
                    "block (or provide AWS credentials in the environment)")]) from None
            except FlexibleChecksumError as exc:
                last = _Failure("corrupt", f"|{exc}")
            except RetriesExceededError as exc:
                last = _Failure("unreachable", str(exc.last_exception))
            except (BotoConnectionError, BotoHTTPClientError) as exc:
                last = _Failure("unreachable", str(exc))
            if last.kind == "corrupt" and attempt >= 2:
                break  # read twice, hashed wrong twice: the stored bytes are bad, not the transfer
            if attempt < o.attempts:
                log.warning("S3 %s failed (attempt %d of %d): %s; retrying in %.2f s",
                            what, attempt, o.attempts, last.detail, o.delay(attempt))
                if self.on_retry is not None:
                    self.on_retry(attempt, last)
                time.sleep(o.delay(attempt))
        assert last is not None
        if last.kind == "corrupt":
            expected, _, actual = last.detail.partition("|")
            raise ChecksumMismatch(f"{self.url}/{key}", expected or "(server checksum)", actual)
        if last.kind == "unreachable":
            raise SiteUnavailable(
                self.site,
                f"S3 endpoint {self.endpoint} (bucket {self.bucket!r}) did not answer the {action} of {key!r} "
                f"after {o.attempts} attempts: {last.detail}. Check that the endpoint is up and reachable"
                + ("; no partial object was left visible" if action == "upload" else ""),
            )
        raise TransientError(
            f"S3 {what} kept failing after {o.attempts} attempts: {last.detail}; retry later"
        )

    def _classify_client_error(self, exc: ClientError, key: str) -> _Failure:
        code = _code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("NoSuchKey", "404", "NotFound"):
            raise FileNotFoundError(f"no object {key!r} in {self.url}") from None
        if code == "NoSuchBucket":
            raise self._missing_bucket() from None
        if code in AUTH_CODES:
            field = AUTH_CODES[code]
            if code == "SignatureDoesNotMatch":
                why = "the secret access key does not match the access key id"
            elif code in ("InvalidAccessKeyId", "InvalidToken", "ExpiredToken"):
                why = "the access key id is unknown or expired"
            else:
                why = "the credentials were refused or lack permission on the bucket"
            raise SpecError(f"site {self.site} store", [Problem(
                field,
                f"S3 endpoint {self.endpoint} refused the site's credentials for bucket {self.bucket!r} "
                f"({code}: {why}); fix access_key_id / secret_access_key in the site's block")]) from None
        if code in TRANSIENT_CODES or status >= 500:
            return _Failure("transient", f"{code}: {exc}")
        raise exc

    def _missing_bucket(self) -> SpecError:
        return SpecError(f"site {self.site} store", [Problem(
            "store.bucket",
            f"bucket {self.bucket!r} does not exist at S3 endpoint {self.endpoint}; create it or fix store.bucket")])


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
