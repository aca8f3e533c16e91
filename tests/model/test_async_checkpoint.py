"""Asynchronous checkpoints: snapshots isolate training from the write, one write at a time, errors surface, kills leave nothing partial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hybridtrain.errors import Preempted
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import TMP_PREFIX
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.checkpoint_writer import CheckpointWriter, snapshot
from tests.fixtures.training_data import TOTAL_STEPS, TRAIN, VAL, ckpt_store, stop_after, trainer

ROOT = Path(__file__).resolve().parents[2]


class GatedStore(LocalObjectStore):
    """A real local store whose data writes wait until the test opens the gate (a slow store)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.gate = threading.Event()
        self.writing = threading.Event()

    def put_bytes(self, key, data):
        if key.endswith(".pt"):
            self.writing.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().put_bytes(key, data)


class FailingStore(LocalObjectStore):
    """A real local store whose disk fills up after ``ok`` data writes."""

    def __init__(self, root: Path, ok: int):
        super().__init__(root)
        self.ok = ok

    def put_bytes(self, key, data):
        if key.endswith(".pt"):
            if self.ok == 0:
                raise OSError(28, "No space left on device")
            self.ok -= 1
        return super().put_bytes(key, data)


def test_snapshot_shares_no_tensor_or_container_with_the_state():
    state = {"w": torch.ones(3), "opt": {"state": {0: {"m": torch.zeros(2)}}, "lr": [0.1]}, "step": 4}
    copied = snapshot(state)
    state["w"].add_(1)
    state["opt"]["state"][0]["m"].add_(5)
    state["opt"]["lr"].append(9)
    assert torch.equal(copied["w"], torch.ones(3)) and torch.equal(copied["opt"]["state"][0]["m"], torch.zeros(2))
    assert copied["opt"]["lr"] == [0.1] and copied["step"] == 4


def test_a_snapshot_into_an_earlier_one_reuses_its_buffers_and_still_copies():
    state = {"w": torch.arange(6.0).reshape(2, 3), "opt": [torch.ones(2), {"m": torch.zeros(4)}], "step": 1}
    first = snapshot(state)
    buffers = [first["w"].data_ptr(), first["opt"][0].data_ptr(), first["opt"][1]["m"].data_ptr()]
    state["w"].add_(10)
    state["opt"][1]["m"] = torch.zeros(5)  # a shape change: that tensor is allocated anew
    second = snapshot(state, first)
    assert [second["w"].data_ptr(), second["opt"][0].data_ptr()] == buffers[:2]
    assert second["opt"][1]["m"].data_ptr() != buffers[2] and second["opt"][1]["m"].shape == (5,)
    assert torch.equal(second["w"], torch.arange(6.0).reshape(2, 3) + 10)
    state["w"].add_(1)  # the reused buffer is still a copy, not the state's tensor
    assert torch.equal(second["w"], torch.arange(6.0).reshape(2, 3) + 10)


def test_consecutive_background_checkpoints_each_store_their_own_values(tmp_path):
    """The writer reuses the previous snapshot's buffers only after its write ended: every checkpoint keeps its values."""
    store = CheckpointStore(LocalObjectStore(tmp_path), "run", keep_last=5, file_upload_bytes=64)
    weights = torch.zeros(64)  # 256 bytes: over file_upload_bytes, so the file path serializes it
    with CheckpointWriter(store) as writer:
        for step in (1, 2, 3):
            weights.fill_(step)
            writer.submit({"w": weights}, step)
        writer.wait()
    stored = {c.step: store._load(c)["w"] for c in store.list()}
    assert {s: float(w[0]) for s, w in stored.items()} == {1: 1.0, 2: 2.0, 3: 3.0}


def test_training_goes_on_while_a_write_is_in_flight_and_the_stored_state_is_the_snapshot(tmp_path):
    objects = GatedStore(tmp_path)
    store = CheckpointStore(objects, "run")
    weights = torch.zeros(4)
    with CheckpointWriter(store) as writer:
        writer.submit({"w": weights}, 1)  # returns while the store is still blocked
        assert objects.writing.wait(10)
        weights.add_(7)  # "training" changes the tensor during the write
        assert store.list() == []  # nothing is visible before the write completes
        objects.gate.set()
        info = writer.wait()
    state, latest = store.latest_valid()
    assert latest == info and info.step == 1
    assert torch.equal(state["w"], torch.zeros(4))


def test_a_second_snapshot_waits_for_the_write_in_flight(tmp_path):
    objects = GatedStore(tmp_path)
    store = CheckpointStore(objects, "run", keep_last=5)
    with CheckpointWriter(store) as writer:
        writer.submit({"step": 1}, 1)
        assert objects.writing.wait(10)
        second = threading.Thread(target=writer.submit, args=({"step": 2}, 2))
        second.start()
        second.join(0.3)
        assert second.is_alive(), "a second submit must wait while the first write is in flight"
        objects.gate.set()
        second.join(10)
        assert not second.is_alive()
        writer.wait()
    assert [c.step for c in store.list()] == [1, 2]  # none dropped, in order


def test_a_failed_write_is_raised_on_the_next_call(tmp_path):
    store = CheckpointStore(FailingStore(tmp_path, ok=0), "run")
    with CheckpointWriter(store) as writer:
        writer.submit({"w": torch.ones(2)}, 1)
        with pytest.raises(OSError, match="No space left"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                writer.check()  # raises once the background write has failed
                time.sleep(0.01)
        writer.submit({"w": torch.ones(2)}, 2)  # the writer goes on: a later write may succeed
        with pytest.raises(OSError, match="No space left"):
            writer.wait()
    assert store.list() == []


def test_the_trainer_stops_on_a_failed_background_write(tmp_path):
    store = CheckpointStore.for_run(FailingStore(tmp_path, ok=1), "churn", "run-1")
    with pytest.raises(OSError, match="No space left"):
        trainer(store).fit(TRAIN, VAL)
    assert [c.step for c in store.list()] == [10]  # the checkpoint before the failure stays valid


def test_async_checkpoints_resume_bit_identically_and_preemption_waits_for_the_write(tmp_path):
    full = trainer(ckpt_store(tmp_path / "a")).fit(TRAIN, VAL)
    store = ckpt_store(tmp_path / "b")
    with pytest.raises(Preempted) as stopped:
        trainer(store).fit(TRAIN, VAL, should_stop=stop_after(23))
    newest = store.list()[-1]  # durable by the time Preempted is raised
    assert (stopped.value.step, stopped.value.checkpoint) == (23, newest.key)
    resumed = trainer(store).fit(TRAIN, VAL)
    assert resumed.resumed_from_step == 23 and resumed.global_step == TOTAL_STEPS
    for name, tensor in full.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    assert resumed.history == full.history
    assert full.checkpoints_written == 5 and full.last_checkpoint == ckpt_store(tmp_path / "a").list()[-1]


SIZE = 12 * 1024 * 1024  # 48 MiB of float32: a write long enough to be killed in the middle of
WRITER_LOOP = """
import sys, torch
SIZE = int(sys.argv[2])
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.checkpoint_writer import CheckpointWriter
store = CheckpointStore(LocalObjectStore(sys.argv[1]), "run", keep_last=2, file_upload_bytes=1 << 40)
w = torch.empty(SIZE)
with CheckpointWriter(store) as writer:
    for step in range(1, 10_000):
        w.fill_(float(step))
        writer.submit({"w": w, "step": step}, step)
"""


def test_a_process_killed_mid_write_leaves_no_partial_checkpoint_visible(tmp_path):
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", WRITER_LOOP, str(root), str(SIZE)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run_dir = root / "run"
    try:
        deadline = time.monotonic() + 120
        killed_mid_write = False
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(run_dir) if run_dir.is_dir() else []
            complete = [n for n in names if n.endswith(".json")]
            if complete and any(n.startswith(TMP_PREFIX) for n in names):
                os.kill(proc.pid, signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.005)
        assert killed_mid_write, f"never saw a write in progress: {proc.poll()} {proc.stdout.read()[-2000:]!r}"
    finally:
        proc.kill()
        proc.wait(30)
    store = CheckpointStore(LocalObjectStore(root), "run")
    listed = store.list()
    assert listed, "the checkpoints completed before the kill must stay visible"
    for info in listed:  # every visible checkpoint is whole: its bytes match its manifest
        assert store._verified_blob(info) is not None, info.key
    state, newest = store.latest_valid()
    assert newest == listed[-1] and state["step"] == newest.step
    assert torch.equal(state["w"], torch.full((SIZE,), float(newest.step)))  # the state as it was at that step
