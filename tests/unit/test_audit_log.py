"""AuditLog: a verified hash chain; an edited, removed, reordered or cut-off record is detected; concurrent appends."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hybridtrain.errors import AuditLogInvalid
from hybridtrain.governance.audit_log import GENESIS_HASH, AuditHead, AuditLog, canonical_json, record_hash
from hybridtrain.governance.signing_key import SigningKey

KEY = SigningKey.generate()
ACTIONS = ["placement", "sync", "tier_promotion", "gate", "release"]


def filled(tmp_path: Path, n: int = 5, **kwargs) -> AuditLog:
    log = AuditLog(tmp_path / "audit" / "audit.jsonl", **kwargs)
    for i in range(n):
        log.append(actor="flow-run/1", action=ACTIONS[i % len(ACTIONS)], subject=f"model churn v{i + 1}",
                   inputs={"i": i, "cost_usd": 0.1 * i, "sites": ["onprem-dc1", "cloud-eu"]}, outcome="passed")
    return log


def lines(log: AuditLog) -> list[str]:
    return log.path.read_text().splitlines(keepends=True)


def write_lines(log: AuditLog, new: list[str]) -> None:
    log.path.write_text("".join(new))


def problems(log: AuditLog, **kwargs) -> list[str]:
    report = log.verify(**kwargs)
    assert report.ok is (not report.problems)
    return [str(p) for p in report.problems]


def test_appends_form_a_verified_chain_anchored_by_the_head(tmp_path):
    log = filled(tmp_path)
    report = log.verify()
    assert report.ok and report.records == 5 and not report.warnings
    records = list(log.records())
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[0].prev_hash == GENESIS_HASH
    assert all(b.prev_hash == a.hash for a, b in zip(records, records[1:]))
    assert all(r.hash == record_hash(r.model_dump()) for r in records)
    assert log.head() == AuditHead(seq=5, hash=records[-1].hash)
    assert lines(log)[2] == canonical_json(records[2].model_dump()).decode() + "\n"  # one canonical line each
    assert records[4].at.endswith("Z") and records[4].inputs["sites"] == ["onprem-dc1", "cloud-eu"]


def test_nothing_is_created_until_the_first_append(tmp_path):
    log = AuditLog(tmp_path / "a" / "audit.jsonl")
    assert log.head() is None and list(log.records()) == [] and not (tmp_path / "a").exists()


def test_an_edited_record_is_detected(tmp_path):
    log = filled(tmp_path)
    rows = lines(log)
    record = json.loads(rows[2])
    record["outcome"] = "failed: cost"  # the editor keeps the old hash
    rows[2] = canonical_json(record).decode() + "\n"
    write_lines(log, rows)
    assert problems(log) == [f"seq 3 (line 3): edited: its content hashes to {record_hash(record)[:16]}… but the "
                             f"record says {record['hash'][:16]}…"]


def test_an_edited_record_with_a_recomputed_hash_breaks_the_chain(tmp_path):
    log = filled(tmp_path)
    rows = lines(log)
    record = json.loads(rows[2])
    record["actor"] = "someone-else"
    record["hash"] = record_hash(record)
    rows[2] = canonical_json(record).decode() + "\n"
    write_lines(log, rows)
    # seq 3 hashes correctly now, but seq 4 still points at its old hash.
    assert problems(log) == ["seq 4 (line 4): chain broken: prev_hash does not match the hash of the record before "
                             "it (seq 3, line 3); a record before it was removed, inserted, reordered or rewritten"]


def test_a_type_changing_edit_is_not_coerced_back(tmp_path):
    log = filled(tmp_path)
    rows = lines(log)
    rows[1] = rows[1].replace('"seq":2', '"seq":"2"')
    write_lines(log, rows)
    assert problems(log) == ["record (line 2): not a valid audit record (fields: seq): edited"]


def test_a_record_removed_from_the_middle_is_detected(tmp_path):
    log = filled(tmp_path)
    write_lines(log, lines(log)[:2] + lines(log)[3:])
    assert problems(log) == [
        "seq 4 (line 3): expected seq 3 here; seq 3 missing: records were removed (or reordered)",
        "seq 4 (line 3): chain broken: prev_hash does not match the hash of the record before it (seq 2, line 2); a "
        "record before it was removed, inserted, reordered or rewritten",
    ]


def test_the_first_record_removed_is_detected(tmp_path):
    log = filled(tmp_path)
    write_lines(log, lines(log)[1:])
    found = problems(log)
    assert found[0] == "seq 2 (line 1): expected seq 1 here; seq 1 missing: records were removed (or reordered)"
    assert "prev_hash does not match the hash of the start of the log" in found[1]


def test_reordered_records_are_detected(tmp_path):
    log = filled(tmp_path)
    rows = lines(log)
    rows[1], rows[2] = rows[2], rows[1]
    write_lines(log, rows)
    found = problems(log)
    assert "seq 3 (line 2): expected seq 2 here" in found[0]
    assert any(p.startswith("seq 2 (line 3): expected seq 4 here; out of order") for p in found)
    assert sum("chain broken" in p for p in found) == 3  # seq 3, seq 2 and seq 4 no longer link up


def test_a_truncated_tail_is_detected_against_the_head_and_appending_is_refused(tmp_path):
    log = filled(tmp_path)
    write_lines(log, lines(log)[:3])
    assert problems(log) == ["head: anchored at seq 5, but the log ends at seq 3: records 4..5 were cut off the "
                             "end (truncated)"]
    with pytest.raises(AuditLogInvalid) as exc:
        log.append(actor="x", action="gate", subject="s", outcome="passed")
    assert "cut off the end" in str(exc.value) and "hybridtrain audit verify" in str(exc.value)
    assert len(lines(log)) == 3  # nothing appended


def test_a_record_cut_in_half_is_detected(tmp_path):
    log = filled(tmp_path)
    data = log.path.read_bytes()
    log.path.write_bytes(data[: len(data) - 20])
    assert problems(log) == [
        "record (line 5): incomplete (no newline at the end): a write was cut off or the file was truncated in the "
        "middle of a record",
        "record (line 5): not a JSON record: edited or damaged",
        "head: anchored at seq 5, but the log ends at seq 4: record 5 was cut off the end (truncated)",
    ]
    with pytest.raises(AuditLogInvalid):
        log.append(actor="x", action="gate", subject="s", outcome="passed")


def test_a_deleted_head_is_reported(tmp_path):
    log = filled(tmp_path)
    log.head_path.unlink()
    assert problems(log) == ["head: the head anchor audit.jsonl.head is missing, so a cut tail cannot be ruled out"]


def test_truncation_with_a_rewritten_head_is_caught_by_the_signature_or_a_published_anchor(tmp_path):
    log = filled(tmp_path, signing_key=KEY)
    published = log.head()
    assert log.verify(public_key=KEY.public).ok and published.signature is not None
    # The attacker cuts two records and writes a matching (unsigned) head.
    records = list(log.records())
    write_lines(log, lines(log)[:3])
    log.head_path.write_text(AuditHead(seq=3, hash=records[2].hash).model_dump_json())
    assert log.verify().ok  # without a key or an anchor, a consistent cut is invisible: the documented limit
    assert problems(log, public_key=KEY.public) == [
        f"head: the head is not signed, but a signature by {KEY.key_id} is required"]
    assert problems(log, anchors=[published]) == [
        "anchors[0]: anchored at seq 5, but the log ends at seq 3: records 4..5 were cut off the end (truncated)"]


def test_an_edited_signed_head_is_refused(tmp_path):
    log = filled(tmp_path, signing_key=KEY)
    head = json.loads(log.head_path.read_text())
    head["seq"] = 4
    log.head_path.write_text(json.dumps(head))
    found = problems(log, public_key=KEY.public)
    assert "head: the record at seq 4 has hash" in found[0]
    assert found[-1] == "head: the head's signature does not match its seq and hash: the head was edited"
    other = SigningKey.generate()
    assert problems(filled(tmp_path / "b", signing_key=KEY), public_key=other.public) == [
        f"head: the head is signed by {KEY.key_id}, not by the trusted key {other.key_id}"]


def test_a_head_left_behind_by_a_crash_is_a_warning_and_the_next_append_re_anchors(tmp_path):
    log = filled(tmp_path, n=3)
    stale = log.head_path.read_bytes()
    log.append(actor="x", action="sync", subject="data", outcome="ok")
    log.head_path.write_bytes(stale)  # as if the process died between the record's fsync and the head update
    report = log.verify()
    assert report.ok and report.warnings == [
        "records after seq 3 (up to 4) are not covered by the head anchor: a crash between an append and the head "
        "update, or records appended by something other than AuditLog"]
    log.append(actor="x", action="sync", subject="data", outcome="ok")
    assert log.verify().warnings == [] and log.head().seq == 5


def test_unknown_actions_and_non_json_inputs_are_refused(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ValueError, match="unknown audit action 'deploy'; use one of: placement, sync"):
        log.append(actor="x", action="deploy", subject="s", outcome="ok")
    with pytest.raises(ValueError):
        log.append(actor="x", action="gate", subject="s", inputs={"auc": float("nan")}, outcome="ok")
    assert not log.path.exists() or log.path.read_text() == ""
    record = log.append(actor="x", action="gate", subject="s", outcome="ok", inputs={"when": datetime(2026, 5, 1,
                                                                                              tzinfo=UTC)},
                        at=datetime(2026, 5, 1, 12, tzinfo=UTC))
    assert record.at == "2026-05-01T12:00:00.000000Z" and record.inputs == {"when": "2026-05-01T00:00:00Z"}


def append_many(path: str, worker: int, count: int) -> list[int]:
    log = AuditLog(path)
    return [log.append(actor=f"worker-{worker}", action="sync", subject=f"item {i}", inputs={"worker": worker, "i": i},
                       outcome="ok").seq for i in range(count)]


def test_concurrent_appends_from_several_processes_keep_a_valid_chain(tmp_path):
    path = str(tmp_path / "audit" / "audit.jsonl")
    workers, each = 4, 25
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(append_many, [path] * workers, range(workers), [each] * workers))
    log = AuditLog(path)
    report = log.verify()
    assert report.ok and report.records == workers * each, [str(p) for p in report.problems]
    assert sorted(seq for r in results for seq in r) == list(range(1, workers * each + 1))
    by_worker = {}
    for record in log.records():
        by_worker.setdefault(record.inputs["worker"], []).append(record.inputs["i"])
    assert by_worker == {w: list(range(each)) for w in range(workers)}  # each process's records, in its order
    assert log.head().seq == workers * each
