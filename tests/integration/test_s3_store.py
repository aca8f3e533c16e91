"""S3ObjectStore against a real S3 HTTP server (moto, loopback): round trips, checksums, faults."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridtrain import stages
from hybridtrain.errors import ChecksumMismatch, SiteUnavailable, SpecError
from hybridtrain.specs.sites import LocalStore, Site
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import ObjectStore
from hybridtrain.storage.s3 import MiB, S3ObjectStore, S3Options
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.workspace import Workspace

# Short timeouts and no botocore-level retries: every fault surfaces within seconds.
FAST = S3Options(connect_timeout_s=1, read_timeout_s=5, request_attempts=1, attempts=3, backoff_s=0.05,
                 backoff_max_s=0.2, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=2)


def store(s3, prefix: str = "", subdir: str = "", *, bucket: str | None = None, key: str = "testing",
          secret: str = "testing", on_retry=None) -> S3ObjectStore:
    return S3ObjectStore(s3.store(prefix, bucket=bucket, key=key, secret=secret), subdir, site="cloud-test",
                         options=FAST, on_retry=on_retry)


def big_file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(size))
    return path


def uploads_in_progress(s3) -> list[dict]:
    return s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])


def test_is_an_object_store_and_open_store_picks_the_backend(s3, tmp_path):
    st = open_store(s3.store("team"), tmp_path, "objects", site="cloud-test")
    assert isinstance(st, S3ObjectStore) and isinstance(st, ObjectStore)
    assert st.url == f"s3://{s3.bucket}/team/objects"
    local = open_store(LocalStore(path="stores/x"), tmp_path, "objects")
    assert isinstance(local, LocalObjectStore) and local.url == str(tmp_path / "stores" / "x" / "objects")
    site = Site.model_validate({"name": "cloud-x", "kind": "cloud", "region": "eu-west-1", "jurisdiction": "EU",
                                "price_per_gpu_hour": 1.0, "work_pool": "cloud",
                                "store": s3.store("sites/x").model_dump()})
    ckpt = stages.checkpoint_store(Workspace.resolve(tmp_path), site)  # where training writes checkpoints
    assert isinstance(ckpt, S3ObjectStore) and ckpt.url == f"s3://{s3.bucket}/sites/x/objects"
    assert ckpt.site == "cloud-x"


def test_small_object_round_trip_carries_its_sha256(s3, tmp_path):
    st = store(s3)
    data = os.urandom(1000)
    info = st.put_bytes("a/b.bin", data)
    assert info.key == "a/b.bin" and info.size == 1000
    assert st.get_bytes("a/b.bin") == data
    head = s3.client.head_object(Bucket=s3.bucket, Key="a/b.bin", ChecksumMode="ENABLED")
    assert head["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    src = tmp_path / "small.txt"
    src.write_text("hello")
    st.put_file("f/small.txt", src)
    assert st.get_file("f/small.txt", tmp_path / "out" / "small.txt").read_text() == "hello"


def test_large_file_goes_up_in_parts_and_comes_back_verified(s3, tmp_path):
    st = store(s3)
    src = big_file(tmp_path, 12 * MiB)
    seen: list[int] = []
    info = st.put_file("ckpt/big.bin", src, progress=seen.append)
    assert info.size == 12 * MiB and sum(seen) == 12 * MiB
    head = s3.client.head_object(Bucket=s3.bucket, Key="ckpt/big.bin", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3")  # three 5 MiB parts (the last one shorter)
    assert head["ChecksumSHA256"]  # per-part SHA-256s, checked by the server part by part
    assert head["Metadata"]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    out = st.get_file("ckpt/big.bin", tmp_path / "dl" / "big.bin")
    assert out.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["big.bin"]  # no temporary left behind
    assert uploads_in_progress(s3) == []


def test_an_object_changed_behind_our_back_fails_verification(s3, tmp_path):
    st = store(s3, "p")
    st.put_bytes("x.bin", b"original bytes")
    meta = s3.client.head_object(Bucket=s3.bucket, Key="p/x.bin")["Metadata"]
    # Overwrite with raw boto3 keeping our metadata: same recorded SHA-256, other bytes.
    s3.client.put_object(Bucket=s3.bucket, Key="p/x.bin", Body=b"tampered bytes", Metadata=meta)
    with pytest.raises(ChecksumMismatch) as exc:
        st.get_bytes("x.bin")
    assert exc.value.expected == meta["sha256"]
    assert exc.value.actual == hashlib.sha256(b"tampered bytes").hexdigest()
    assert f"s3://{s3.bucket}/p/x.bin" in str(exc.value) and "re-write it" in str(exc.value)
    dest = tmp_path / "dl" / "x.bin"
    with pytest.raises(ChecksumMismatch):
        st.get_file("x.bin", dest)
    assert list(dest.parent.iterdir()) == []  # nothing unverified lands at the destination


def test_checkpoints_on_s3_skip_a_corrupt_one(s3, tmp_path):
    import torch

    ckpts = CheckpointStore.for_run(store(s3, "site"), "churn", "run-1", keep_last=3)
    ckpts.save({"w": torch.ones(3)}, step=1)
    newest = ckpts.save({"w": torch.full((3,), 2.0)}, step=2)
    s3.client.put_object(Bucket=s3.bucket, Key=f"site/{newest.key}", Body=b"junk",
                         Metadata=s3.client.head_object(Bucket=s3.bucket, Key=f"site/{newest.key}")["Metadata"])
    state, info = ckpts.latest_valid()
    assert info.step == 1 and float(state["w"][0]) == 1.0


def test_keys_live_under_the_prefix_and_list_exists_delete_work(s3):
    a = store(s3, "team/a", "objects")
    b = store(s3, "team/b", "objects")
    for key in ("ckpt/1.pt", "ckpt/2.pt", "bundles/m.tar"):
        a.put_bytes(key, key.encode())
    b.put_bytes("ckpt/1.pt", b"other")
    raw = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"])
    assert raw == ["team/a/objects/bundles/m.tar", "team/a/objects/ckpt/1.pt", "team/a/objects/ckpt/2.pt",
                   "team/b/objects/ckpt/1.pt"]
    assert [o.key for o in a.list()] == ["bundles/m.tar", "ckpt/1.pt", "ckpt/2.pt"]
    assert [(o.key, o.size) for o in a.list("ckpt/")] == [("ckpt/1.pt", 9), ("ckpt/2.pt", 9)]
    assert a.exists("ckpt/1.pt") and not a.exists("ckpt/3.pt")
    a.delete("ckpt/1.pt")
    a.delete("ckpt/never-there.pt")  # deleting what is gone is not an error
    assert not a.exists("ckpt/1.pt") and b.exists("ckpt/1.pt")
    with pytest.raises(FileNotFoundError, match="ckpt/1.pt"):
        a.get_bytes("ckpt/1.pt")
    with pytest.raises(ValueError, match="invalid object key"):
        a.put_bytes("../escape", b"x")


def test_refused_credentials_are_a_config_error_without_retries(s3, s3_server):
    retries: list[int] = []
    with s3_server.enforce_auth() as (key_id, secret):
        good = store(s3, key=key_id, secret=secret)
        good.put_bytes("ok.txt", b"ok")
        assert good.get_bytes("ok.txt") == b"ok"

        started = time.monotonic()
        with pytest.raises(SpecError) as wrong_secret:
            store(s3, key=key_id, secret="not-the-secret", on_retry=lambda n, e: retries.append(n)).put_bytes(
                "x.txt", b"x")
        with pytest.raises(SpecError) as unknown_key:
            store(s3, key="AKIAUNKNOWN000000000", secret=secret).put_bytes("x.txt", b"x")
        with pytest.raises(SpecError) as on_head:
            store(s3, key=key_id, secret="not-the-secret").exists("ok.txt")
        elapsed = time.monotonic() - started
    assert retries == [] and elapsed < 5
    p = wrong_secret.value.problems[0]
    assert p.path == "store.secret_access_key"
    assert "refused the site's credentials" in p.message and "SignatureDoesNotMatch" in p.message
    assert s3.endpoint in p.message and "fix access_key_id / secret_access_key in the site's block" in p.message
    assert unknown_key.value.problems[0].path == "store.access_key_id"
    assert "InvalidAccessKeyId" in unknown_key.value.problems[0].message
    assert "refused the site's credentials" in on_head.value.problems[0].message
    assert "site cloud-test store" in str(wrong_secret.value)


def test_a_missing_bucket_is_a_config_error_naming_bucket_and_endpoint(s3, tmp_path):
    retries: list[int] = []
    st = store(s3, bucket="no-such-bucket-here", on_retry=lambda n, e: retries.append(n))
    for call in (lambda: st.put_bytes("a", b"1"), lambda: st.get_bytes("a"), lambda: st.exists("a"),
                 lambda: st.list(), lambda: st.put_file("a", big_file(tmp_path, 6 * MiB)), st.check):
        with pytest.raises(SpecError) as exc:
            call()
        p = exc.value.problems[0]
        assert p.path == "store.bucket"
        assert "'no-such-bucket-here' does not exist" in p.message and s3.endpoint in p.message
        assert "create it or fix store.bucket" in p.message
    assert retries == []


@pytest.fixture
def flaky_s3(s3):
    """A second moto endpoint (same in-process state as ``s3``) that a test may stop and start."""
    from tests.fixtures.s3_server import MotoS3Server

    server = MotoS3Server()
    server.start()
    yield server
    server.close()


def stop_after(server, nbytes: int) -> tuple[threading.Event, Callable[[int], None]]:
    """A progress callback that stops ``server`` once ``nbytes`` have been sent."""
    stopped = threading.Event()
    sent = 0
    lock = threading.Lock()

    def progress(n: int) -> None:
        nonlocal sent
        with lock:
            sent += n
            if sent >= nbytes and not stopped.is_set():
                stopped.set()
                server.stop()

    return stopped, progress


def test_server_stopped_mid_upload_then_back_the_retry_completes(s3, flaky_s3, tmp_path):
    src = big_file(tmp_path, 20 * MiB)
    seen_before_retry: list[list[str]] = []

    def on_retry(attempt: int, exc: BaseException) -> None:
        flaky_s3.start()  # the server comes back as the first retry begins
        listing = s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])
        seen_before_retry.append([o["Key"] for o in listing])

    st = S3ObjectStore(s3.store().model_copy(update={"endpoint_url": flaky_s3.url}), site="cloud-test",
                       options=FAST, on_retry=on_retry)
    stopped, progress = stop_after(flaky_s3, 6 * MiB)
    started = time.monotonic()
    st.put_file("ckpt/big.bin", src, progress=progress)
    assert stopped.is_set() and time.monotonic() - started < 20
    assert seen_before_retry == [[]]  # after the failed attempt: nothing visible, not even a part
    got = s3.client.get_object(Bucket=s3.bucket, Key="ckpt/big.bin")["Body"].read()
    assert got == src.read_bytes()
    assert uploads_in_progress(s3) == []  # the first attempt's parts were aborted


def test_server_stopped_mid_upload_for_good_fails_clearly_with_nothing_visible(s3, flaky_s3, tmp_path):
    src = big_file(tmp_path, 20 * MiB)
    retries: list[int] = []
    st = S3ObjectStore(s3.store().model_copy(update={"endpoint_url": flaky_s3.url}), site="cloud-test",
                       options=FAST, on_retry=lambda n, e: retries.append(n))
    stopped, progress = stop_after(flaky_s3, 6 * MiB)
    started = time.monotonic()
    with pytest.raises(SiteUnavailable) as exc:
        st.put_file("ckpt/big.bin", src, progress=progress)
    assert time.monotonic() - started < 20 and retries == [1, 2]
    msg = str(exc.value)
    assert exc.value.site == "cloud-test" and flaky_s3.url in msg and f"bucket '{s3.bucket}'" in msg
    assert "after 3 attempts" in msg and "no partial object was left visible" in msg
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount", 0) == 0
    # The endpoint comes back: the next write of the key completes and clears what the failed one left.
    flaky_s3.start()
    st.put_file("ckpt/big.bin", src)
    assert st.get_bytes("ckpt/big.bin") == src.read_bytes()
    assert uploads_in_progress(s3) == []


def test_an_unreachable_endpoint_fails_within_the_timeouts(tmp_path, s3):
    import socket

    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    st = S3ObjectStore(s3.store().model_copy(update={"endpoint_url": f"http://127.0.0.1:{port}"}),
                       site="cloud-test", options=FAST)
    started = time.monotonic()
    with pytest.raises(SiteUnavailable, match=f"127.0.0.1:{port}"):
        st.get_bytes("anything")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("backend", ["s3", "local"])
def test_create_writes_only_where_nothing_is_and_one_of_several_racing_writers_wins(s3, tmp_path, backend):
    st = store(s3, "create") if backend == "s3" else LocalObjectStore(tmp_path / "objects")
    assert st.create("a/slot", b"first") is True
    assert st.create("a/slot", b"second") is False and st.get_bytes("a/slot") == b"first"
    results: dict[int, bool] = {}
    barrier = threading.Barrier(4)

    def race(i: int) -> None:
        barrier.wait()
        results[i] = st.create("a/raced", f"writer {i}".encode())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    winners = [i for i, won in results.items() if won]
    assert len(results) == 4 and len(winners) == 1
    assert st.get_bytes("a/raced") == f"writer {winners[0]}".encode()
    assert [o.key for o in st.list("a/")] == ["a/raced", "a/slot"]  # no temp file left behind


def test_a_stopped_server_keeps_its_port_until_closed(s3):
    """Between ``stop()`` and ``start()`` nobody else can take the port (CI once lost a restart to that race)."""
    import socket

    from tests.fixtures.s3_server import MotoS3Server

    server = MotoS3Server()
    server.start()
    port = server.port
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    for reuse in (False, True):  # a plain bind, and one with SO_REUSEADDR as most servers bind
        other = socket.socket()
        if reuse:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))
        other.close()
    server.start()
    assert server.port == port
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    server.close()
    free = socket.socket()
    free.bind(("127.0.0.1", port))  # given back
    free.close()
