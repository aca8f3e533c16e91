"""Tamper evidence of a workspace's audit log: every kind of tampering fails `hybridtrain audit verify --public-key`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridtrain.errors import AuditLogInvalid
from hybridtrain.governance import audit_key
from hybridtrain.governance.audit_log import AuditHead, AuditLog, canonical_json, record_hash
from hybridtrain.governance.signing_key import SigningKey
from tests.fixtures.workspaces import ROOT


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv(audit_key.ENV_KEY_FILE, raising=False)
    root = tmp_path / "ws"
    log = audit_key.workspace_log(root)
    for i in range(1, 7):
        log.append(actor="test", action="gate", subject=f"model m v{i}", inputs={"i": i}, outcome="passed")
    return root


def log_path(root: Path) -> Path:
    return root / ".hybridtrain" / "audit" / "audit.jsonl"


def verify(root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    env.pop(audit_key.ENV_KEY_FILE, None)
    return subprocess.run([sys.executable, "-m", "orchestration.cli", "audit", "verify", "--home", str(root),
                           "--public-key", str(audit_key.public_key_path(root)), *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def lines(root: Path) -> list[bytes]:
    return log_path(root).read_bytes().splitlines(keepends=True)


def write(root: Path, new: list[bytes]) -> None:
    log_path(root).write_bytes(b"".join(new))


def rechain(records: list[dict], start: int) -> list[bytes]:
    """Recompute hashes and links from ``start`` on: a consistent rewrite of the chain."""
    for i in range(start, len(records)):
        records[i]["prev_hash"] = records[i - 1]["hash"] if i else "0" * 64
        records[i]["hash"] = record_hash(records[i])
    return [canonical_json(r) + b"\n" for r in records]


def test_key_is_kept_apart_from_the_log_and_the_head_is_signed(ws):
    key = audit_key.key_path(ws)
    assert key.parent != log_path(ws).parent
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    head = json.loads((log_path(ws).parent / "audit.jsonl.head").read_text())
    assert head["key_id"] == audit_key.verify_key(ws).key_id and head["signature"]


def test_an_untouched_log_verifies_with_its_public_key(ws):
    result = verify(ws)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 records verified" in result.stdout and "signature verified" in result.stdout


def test_edit(ws):
    rows = lines(ws)
    rows[2] = rows[2].replace(b"passed", b"failed")
    write(ws, rows)
    result = verify(ws)
    assert result.returncode == 8 and "seq 3" in result.stderr and "edited" in result.stderr


def test_delete(ws):
    rows = lines(ws)
    del rows[3]
    write(ws, rows)
    result = verify(ws)
    assert result.returncode == 8 and "seq 4 missing" in result.stderr


def test_swap(ws):
    rows = lines(ws)
    rows[1], rows[2] = rows[2], rows[1]
    write(ws, rows)
    result = verify(ws)
    assert result.returncode == 8 and "out of order" in result.stderr


def test_truncate(ws):
    write(ws, lines(ws)[:4])
    result = verify(ws)
    assert result.returncode == 8 and "cut off the end" in result.stderr


def test_truncate_and_rewrite_the_head_to_match(ws):
    rows = lines(ws)[:4]
    write(ws, rows)
    last = json.loads(rows[-1])
    head = AuditHead(seq=last["seq"], hash=last["hash"])
    (log_path(ws).parent / "audit.jsonl.head").write_bytes(canonical_json(head.model_dump(mode="json")) + b"\n")
    result = verify(ws)
    assert result.returncode == 8 and "not signed" in result.stderr


@pytest.mark.parametrize("head_key", ["unsigned", "another key"])
def test_consistent_rewrite_of_the_chain_and_its_head(ws, head_key):
    records = [json.loads(r) for r in lines(ws)]
    records[2]["outcome"] = "failed: cost"  # history rewritten from seq 3, every later link recomputed
    write(ws, rechain(records, 2))
    head = AuditHead(seq=records[-1]["seq"], hash=records[-1]["hash"])
    if head_key == "another key":
        head = head.signed_by(SigningKey.generate())
    (log_path(ws).parent / "audit.jsonl.head").write_bytes(canonical_json(head.model_dump(mode="json")) + b"\n")
    assert AuditLog(log_path(ws)).verify().ok  # without the key such a rewrite is undetectable...
    result = verify(ws)  # ...with it, it is not
    assert result.returncode == 8
    assert ("not signed" if head_key == "unsigned" else "not by the trusted key") in result.stderr


def test_writers_without_the_key_or_with_another_cannot_re_anchor_a_signed_log(ws):
    with pytest.raises(AuditLogInvalid) as exc:
        AuditLog(log_path(ws)).append(actor="x", action="gate", subject="s", outcome="o")
    assert "append with that signing key" in str(exc.value)
    with pytest.raises(AuditLogInvalid) as exc:
        AuditLog(log_path(ws), signing_key=SigningKey.generate()).append(actor="x", action="gate", subject="s",
                                                                         outcome="o")
    assert "not by the trusted key" in str(exc.value)
    assert len(lines(ws)) == 6


def test_a_signing_writer_does_not_adopt_an_unsigned_rewritten_head(ws):
    records = [json.loads(r) for r in lines(ws)]
    records[0]["actor"] = "someone else"
    write(ws, rechain(records, 0))
    head = AuditHead(seq=records[-1]["seq"], hash=records[-1]["hash"])
    (log_path(ws).parent / "audit.jsonl.head").write_bytes(canonical_json(head.model_dump(mode="json")) + b"\n")
    with pytest.raises(AuditLogInvalid) as exc:
        audit_key.workspace_log(ws).append(actor="x", action="gate", subject="s", outcome="o")
    assert "not signed" in str(exc.value)
