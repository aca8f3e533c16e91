"""Moving a run's checkpoint to another store (copy_latest) and large states going up as files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from tests.fixtures.training_data import flip_byte, state


def run_store(root: Path, keep_last: int = 3, **kw) -> CheckpointStore:
    return CheckpointStore.for_run(LocalObjectStore(root), "churn", "run-1", keep_last=keep_last, **kw)


def test_copies_only_the_newest_valid_checkpoint_data_then_manifest(tmp_path):
    here, there = run_store(tmp_path / "a"), run_store(tmp_path / "b")
    for step in (10, 20, 30):
        here.save(state(step), step)
    copy = here.copy_latest(there)
    assert copy is not None and copy.source.step == 30 and copy.copied.step == 30
    assert copy.copied.sha256 == copy.source.sha256 and copy.copied.size == copy.source.size
    assert copy.copied.key == copy.source.key  # same layout, same name
    manifest = there.store.get_bytes(copy.copied.manifest_key)
    assert copy.bytes == copy.source.size + len(manifest) and copy.files == 2 and copy.seconds >= 0
    assert [c.step for c in there.list()] == [30]  # one checkpoint moved, not the history
    loaded, info = there.latest_valid()
    assert info == copy.copied and torch.equal(loaded["weights"], state(30)["weights"])
    assert copy.copied.created == copy.source.created  # when the state was made, not when it moved


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_previous_one_moves(tmp_path, caplog):
    here, there = run_store(tmp_path / "a"), run_store(tmp_path / "b")
    here.save(state(10), 10)
    newest = here.save(state(20), 20)
    flip_byte(here.store, newest.key)
    with caplog.at_level(logging.WARNING, logger="hybridtrain.training.checkpoint"):
        copy = here.copy_latest(there)
    assert newest.key in caplog.text
    assert copy.source.step == 10 and [c.step for c in there.list()] == [10]


def test_copying_again_moves_nothing_and_an_empty_run_copies_nothing(tmp_path):
    here, there = run_store(tmp_path / "a"), run_store(tmp_path / "b")
    assert here.copy_latest(there) is None
    here.save(state(5), 5)
    first = here.copy_latest(there)
    again = here.copy_latest(there)
    assert again.bytes == 0 and again.files == 0 and again.copied == first.copied
    assert len(there.list()) == 1


def test_destination_revisions_and_retention_are_respected(tmp_path):
    here, there = run_store(tmp_path / "a"), run_store(tmp_path / "b", keep_last=2)
    there.save(state(1), 1)
    there.save(state(99), 40)  # a different state at the same step: the copy takes the next revision
    here.save(state(40), 40)
    copy = here.copy_latest(there)
    assert copy.copied.revision == 1 and copy.bytes > 0
    assert [(c.step, c.revision) for c in there.list()] == [(40, 0), (40, 1)]  # keep_last=2 dropped step 1
    loaded, info = there.latest_valid()
    assert info == copy.copied and torch.equal(loaded["weights"], state(40)["weights"])


def test_a_copy_cut_off_before_its_manifest_is_invisible_at_the_destination(tmp_path):
    class ManifestRefused(LocalObjectStore):
        def put_bytes(self, key: str, data: bytes):
            if key.endswith(".json"):
                raise ConnectionError("destination went away")
            return super().put_bytes(key, data)

    here = run_store(tmp_path / "a")
    here.save(state(10), 10)
    there = CheckpointStore.for_run(ManifestRefused(tmp_path / "b"), "churn", "run-1")
    with pytest.raises(ConnectionError):
        here.copy_latest(there)
    assert [o.key.endswith(".pt") for o in there.store.list()] == [True]  # data only
    assert there.list() == [] and there.latest_valid() is None


def test_large_states_go_up_through_put_file(tmp_path):
    calls: list[str] = []

    class Recording(LocalObjectStore):
        def put_file(self, key: str, path: Path):
            calls.append(key)
            return super().put_file(key, path)

    big = CheckpointStore.for_run(Recording(tmp_path), "churn", "run-1", file_upload_bytes=4096)
    small_info = big.save({"w": torch.zeros(4)}, 1)
    big_info = big.save({"w": torch.zeros(4096)}, 2)
    assert calls == [big_info.key] and small_info.key not in calls
    loaded, info = big.latest_valid()
    assert info == big_info and torch.equal(loaded["w"], torch.zeros(4096))
    with pytest.raises(ValueError):
        CheckpointStore.for_run(Recording(tmp_path), "churn", "run-1", file_upload_bytes=0)


def test_move_checkpoint_between_sites_of_a_workspace_is_a_recorded_crossing(workspace):
    import yaml

    from hybridtrain import stages
    from hybridtrain.specs.job import parse_spec
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(workspace)
    spec = parse_spec(yaml.safe_load((workspace / "jobs" / "churn.yaml").read_text()))
    sites = ws.load_sites()
    cloud, onprem = sites.get("cloud-eu"), sites.get("onprem-dc1")

    def run_at(site):
        return CheckpointStore.for_run(stages.checkpoint_store(ws, site), spec.name, "run-7")

    assert stages.move_checkpoint(ws, spec, "run-7", "cloud-eu", "onprem-dc1") is None  # nothing to move yet
    saved = run_at(cloud).save(state(300), 300)
    record = stages.move_checkpoint(ws, spec, "run-7", "cloud-eu", "onprem-dc1")
    assert (record.source, record.destination, record.files) == ("cloud-eu", "onprem-dc1", 2)
    assert record.bytes > saved.size and "step 300" in record.what and saved.key in record.what
    assert record.egress_per_gb == cloud.egress_per_gb > 0
    assert record.cost_usd == pytest.approx(record.bytes / 1e9 * cloud.egress_per_gb)
    assert run_at(onprem).latest_valid()[1].sha256 == saved.sha256
    again = stages.move_checkpoint(ws, spec, "run-7", "cloud-eu", "onprem-dc1")
    assert again.bytes == 0 and again.cost_usd == 0
    assert stages.move_checkpoint(ws, spec, "run-7", "onprem-dc1", "onprem-dc1") is None
    assert onprem.egress_per_gb == 0.0
