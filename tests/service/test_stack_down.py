"""`make down` keeps what it cannot save: the S3 stand-in (real moto server) stays up when its bucket cannot be
copied out, the other parts stop anyway, and the last snapshot is left as it was."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from botocore.exceptions import ClientError

from hybridtrain.drill.loopback import free_port
from hybridtrain.service.stack import Stack
from tests.fixtures.workspaces import ROOT


@pytest.fixture(scope="module")
def stackmod():
    spec = importlib.util.spec_from_file_location("stack_script", ROOT / "scripts" / "stack.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["stack_script"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def s3_only(tmp_path, stackmod):
    """A stack of which only the S3 stand-in runs (no PostgreSQL, no servers, no workers)."""
    ports = {"prefect": free_port(), "mlflow": free_port(), "postgres": free_port(), "s3": free_port()}
    stack = Stack.create(tmp_path, ports, is_root=False, pg_bin="/nonexistent")
    stack.save()
    yield stack
    stackmod.stop(stack, "s3", grace_s=5)


def put(stackmod, stack, key: str, body: bytes) -> None:
    client = stackmod.s3_client(stack)
    client.put_object(Bucket=stack.bucket, Key=key, Body=body)
    client.close()


def keys_in(stackmod, stack) -> set[str]:
    client = stackmod.s3_client(stack)
    listing = client.list_objects_v2(Bucket=stack.bucket)
    client.close()
    return {o["Key"] for o in listing.get("Contents", [])}


def snapshot(stack) -> dict[str, bytes]:
    return {p.relative_to(stack.s3_snapshot).as_posix(): p.read_bytes()
            for p in stack.s3_snapshot.rglob("*") if p.is_file()} if stack.s3_snapshot.is_dir() else {}


class BrokenDownloads:
    """The real client, except that every object download fails the way a busy moto did (HeadObject 500)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def download_file(self, bucket, key, filename):
        raise ClientError({"Error": {"Code": "500", "Message": "Internal Server Error"}}, "HeadObject")


def test_down_leaves_s3_running_with_its_objects_when_they_cannot_be_saved(stackmod, s3_only, monkeypatch, capsys):
    stack = s3_only
    stackmod.start_s3(stack)
    put(stackmod, stack, "mlflow/1/model.pt", b"first")
    assert stackmod.down(stack) == 0
    assert snapshot(stack) == {"mlflow/1/model.pt": b"first"}
    assert not stackmod.port_open(stack.host, stack.s3_port)

    stackmod.start_s3(stack)  # the saved objects come back
    assert keys_in(stackmod, stack) == {"mlflow/1/model.pt"}
    put(stackmod, stack, "mlflow/2/model.pt", b"second")
    capsys.readouterr()
    real_client = stackmod.s3_client
    monkeypatch.setattr(stackmod, "s3_client", lambda s: BrokenDownloads(real_client(s)))
    assert stackmod.down(stack) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "s3 NOT stopped" in ln)
    assert "HeadObject" in line and "run `make down` again" in line and "Traceback" not in out
    # Nothing lost: the objects are still served, the old snapshot is intact, no half-written copy is left.
    assert stackmod.port_open(stack.host, stack.s3_port)
    monkeypatch.setattr(stackmod, "s3_client", real_client)
    assert keys_in(stackmod, stack) == {"mlflow/1/model.pt", "mlflow/2/model.pt"}
    assert snapshot(stack) == {"mlflow/1/model.pt": b"first"}
    assert not stack.s3_snapshot.with_name("s3.saving").exists()

    # The retry the line asks for saves both and stops it.
    assert stackmod.down(stack) == 0
    assert snapshot(stack) == {"mlflow/1/model.pt": b"first", "mlflow/2/model.pt": b"second"}
    assert not stackmod.port_open(stack.host, stack.s3_port)


def test_down_stops_the_other_parts_when_one_fails_to_stop(stackmod, s3_only, monkeypatch, capsys):
    stack = s3_only
    stackmod.start_s3(stack)
    real_stop = stackmod.stop

    def stop(s, name, grace_s=15.0):
        if name == "prefect-server":
            raise PermissionError(1, "Operation not permitted")
        return real_stop(s, name, grace_s)

    monkeypatch.setattr(stackmod, "stop", stop)
    stack.pg_data.mkdir(parents=True)
    (stack.pg_data / "postmaster.pid").write_text("99999999\n")  # a cluster pg_ctl cannot stop (no binaries here)
    assert stackmod.down(stack) == 1
    out = capsys.readouterr().out
    assert "prefect-server: could not stop it cleanly (PermissionError" in out
    assert "postgres: could not stop it cleanly" in out and "Traceback" not in out
    assert "stopped s3 (saved 0 objects" in out and not stackmod.port_open(stack.host, stack.s3_port)
