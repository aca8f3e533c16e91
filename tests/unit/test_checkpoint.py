import hashlib
import logging

import numpy as np
import pytest
import torch

from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import TMP_PREFIX
from hybridtrain.training.checkpoint import CheckpointStore
from tests.fixtures.training_data import flip_byte, state


@pytest.fixture
def objects(tmp_path):
    return LocalObjectStore(tmp_path / "store")


@pytest.fixture
def ckpts(objects):
    return CheckpointStore.for_run(objects, "churn", "run-1", keep_last=10)


def test_round_trip(ckpts, objects):
    info = ckpts.save(state(7), step=7)
    assert info.key == "checkpoints/churn/run-1/ckpt-000000000007-000.pt"
    assert info.uri.endswith(info.key)
    assert info.step == 7
    raw = objects.get_bytes(info.key)
    assert info.size == len(raw)
    assert info.sha256 == hashlib.sha256(raw).hexdigest()

    found = ckpts.latest_valid()
    assert found is not None
    loaded, latest = found
    assert latest == info
    assert torch.equal(loaded["weights"], state(7)["weights"])
    assert loaded["meta"] == {"rng": [1, 2, 3], "none": None}
    assert ckpts.list() == [info]


def test_a_large_state_is_serialized_to_a_file_with_the_same_manifest(objects):
    """States of file_upload_bytes or more go through a temporary file: same bytes, hash and size in the manifest."""
    big = CheckpointStore.for_run(objects, "churn", "run-2", file_upload_bytes=16)
    info = big.save(state(3), step=3)
    raw = objects.get_bytes(info.key)
    assert info.size == len(raw) and info.sha256 == hashlib.sha256(raw).hexdigest()
    loaded, latest = big.latest_valid()
    assert latest == info and torch.equal(loaded["weights"], state(3)["weights"])
    with pytest.raises(TypeError, match="weights_only"):
        big.save({"w": torch.zeros(8), "numpy_rng": np.arange(3)}, 4)
    assert big.list() == [info]


def test_empty_store_has_no_checkpoint(ckpts):
    assert ckpts.latest_valid() is None
    assert ckpts.list() == []


def test_newest_is_highest_step_not_last_written(ckpts):
    ckpts.save(state(20), 20)
    ckpts.save(state(10), 10)
    assert ckpts.latest_valid()[1].step == 20
    assert [c.step for c in ckpts.list()] == [10, 20]


def test_same_step_saved_twice_keeps_both_and_the_later_wins(ckpts):
    first = ckpts.save(state(5), 5)
    second = ckpts.save({"weights": torch.zeros(1), "step": 5}, 5)
    assert (first.revision, second.revision) == (0, 1)
    loaded, info = ckpts.latest_valid()
    assert info == second
    assert torch.equal(loaded["weights"], torch.zeros(1))


def test_checksum_mismatch_is_skipped_with_a_warning(ckpts, objects, caplog):
    ckpts.save(state(1), 1)
    bad = ckpts.save(state(2), 2)
    flip_byte(objects, bad.key)
    with caplog.at_level(logging.WARNING, logger="hybridtrain.training.checkpoint"):
        loaded, info = ckpts.latest_valid()
    assert info.step == 1
    assert torch.equal(loaded["weights"], state(1)["weights"])
    assert bad.key in caplog.text
    assert "SHA-256" in caplog.text


def test_truncated_data_is_skipped(ckpts, objects):
    ckpts.save(state(1), 1)
    bad = ckpts.save(state(2), 2)
    path = objects.root / bad.key
    path.write_bytes(path.read_bytes()[:50])
    assert ckpts.latest_valid()[1].step == 1


def test_garbled_manifest_is_ignored(ckpts, objects, caplog):
    ckpts.save(state(1), 1)
    bad = ckpts.save(state(2), 2)
    objects.put_bytes(bad.manifest_key, b"{not json")
    with caplog.at_level(logging.WARNING, logger="hybridtrain.training.checkpoint"):
        assert [c.step for c in ckpts.list()] == [1]
    assert bad.manifest_key in caplog.text


def test_manifest_without_data_is_ignored(ckpts, objects):
    good = ckpts.save(state(1), 1)
    orphan = ckpts.save(state(2), 2)
    objects.delete(orphan.key)
    assert ckpts.list() == [good]
    assert ckpts.latest_valid()[1] == good


def test_data_without_manifest_is_ignored(ckpts, objects):
    good = ckpts.save(state(1), 1)
    # What a crash between the data put and the manifest put leaves behind.
    partial = ckpts.save(state(2), 2)
    objects.delete(partial.manifest_key)
    assert ckpts.list() == [good]
    assert ckpts.latest_valid()[1] == good


def test_temporary_and_foreign_objects_are_not_listed(ckpts, objects):
    good = ckpts.save(state(1), 1)
    run_dir = objects.root / "checkpoints/churn/run-1"
    (run_dir / f"{TMP_PREFIX}ckpt-000000000002-000.pt").write_bytes(b"half a checkpoint")
    (run_dir / f"{TMP_PREFIX}abc").write_bytes(b"junk")
    objects.put_bytes("checkpoints/churn/run-1/notes.txt", b"hello")
    # Another run's checkpoints share the store but not the prefix.
    CheckpointStore.for_run(objects, "churn", "run-2").save(state(9), 9)
    assert ckpts.list() == [good]
    assert ckpts.latest_valid()[1] == good


def test_keep_last_n_deletes_older_checkpoints_after_a_save(objects):
    ckpts = CheckpointStore(objects, "checkpoints/j/r", keep_last=2)
    for step in (10, 20, 30, 40):
        ckpts.save(state(step), step)
    assert [c.step for c in ckpts.list()] == [30, 40]
    keys = [o.key for o in objects.list("checkpoints/j/r/")]
    assert keys == [
        "checkpoints/j/r/ckpt-000000000030-000.json",
        "checkpoints/j/r/ckpt-000000000030-000.pt",
        "checkpoints/j/r/ckpt-000000000040-000.json",
        "checkpoints/j/r/ckpt-000000000040-000.pt",
    ]
    # A per-call keep_last overrides the store's default.
    ckpts.save(state(50), 50, keep_last=1)
    assert [c.step for c in ckpts.list()] == [50]


def test_retention_never_deletes_the_checkpoint_just_written(objects):
    ckpts = CheckpointStore(objects, "checkpoints/j/r", keep_last=1)
    ckpts.save(state(100), 100)
    # A lower step written later (e.g. a resume from an older checkpoint) must survive.
    just_written = ckpts.save(state(50), 50)
    assert ckpts.list() == [just_written]


def test_orphans_of_interrupted_saves_are_cleaned_by_a_newer_save(ckpts, objects):
    partial = ckpts.save(state(2), 2)
    objects.delete(partial.manifest_key)
    again = ckpts.save(state(2), 2)
    assert again.revision == 1  # does not overwrite the orphan in place
    assert not objects.exists(partial.key)
    assert ckpts.list() == [again]


def test_state_that_needs_pickled_code_is_refused_at_save(ckpts):
    # A numpy array (e.g. np.random.get_state()'s keys) would need pickled numpy code to load.
    with pytest.raises(TypeError) as err:
        ckpts.save({"numpy_rng": np.arange(3)}, 1)
    assert "weights_only" in str(err.value)
    assert ckpts.list() == []


def test_invalid_arguments(objects):
    with pytest.raises(ValueError):
        CheckpointStore(objects, "/", keep_last=1)
    with pytest.raises(ValueError):
        CheckpointStore(objects, "p", keep_last=0)


def test_listing_while_the_writer_prunes_skips_what_it_deleted(tmp_path):
    class PrunedMidListing(LocalObjectStore):
        """The writer deletes a checkpoint between this reader's directory walk and its stat()."""

        listing = False

        def _info(self, key, path):
            if self.listing and key.endswith("ckpt-000000000010-000.pt"):
                path.unlink()
            return super()._info(key, path)

    objects = PrunedMidListing(tmp_path / "store")
    ckpts = CheckpointStore.for_run(objects, "churn", "run-1", keep_last=10)
    for step in (10, 20):
        ckpts.save(state(step), step)
    objects.listing = True
    assert [c.step for c in ckpts.list()] == [20]  # no FileNotFoundError; the pruned one is simply gone
    assert ckpts.latest_valid()[1].step == 20
