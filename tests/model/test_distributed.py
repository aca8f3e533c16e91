"""DDP training under torchrun on the CPU (gloo): sharding, rank-0 checkpoints, resume, agreement with one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridtrain.specs.job import CheckpointSpec
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.distributed import Distributed
from hybridtrain.training.trainer import Trainer
from tests.fixtures.training_data import LABEL, TOTAL_STEPS, TRAIN, VAL, assert_same_weights
from tests.model.ddp_worker import NODROP, STOP_AT

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "tests.model.ddp_worker", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return out, ranks, torch.load(out / "weights.pt", weights_only=True)


def test_from_env_reads_torchruns_variables():
    assert Distributed.from_env({}) is None
    assert Distributed.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    d = Distributed.from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (d.rank, d.world_size, d.local_rank, d.is_main) == (3, 4, 1, False)
    with pytest.raises(ValueError):
        Distributed(rank=2, world_size=2)


def test_each_rank_takes_a_contiguous_share_of_the_global_batch():
    batch = torch.arange(7)
    parts = [Distributed(rank=r, world_size=3).shard(batch).tolist() for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
    assert Distributed(rank=1, world_size=2).shard(torch.arange(1)).numel() == 0  # a rank may get nothing


def test_ranks_agree_and_only_rank_0_writes_checkpoints_and_reports(ddp_run):
    out, (r0, r1), _ = ddp_run
    assert r0["full"]["global_step"] == r1["full"]["global_step"] == TOTAL_STEPS  # steps count global batches
    assert r0["full"]["history"] == r1["full"]["history"]  # the loss is summed over ranks: same numbers
    assert r0["full"]["checkpoints_written"] == 5 and r1["full"]["checkpoints_written"] == 0
    assert r0["full"]["on_epoch_calls"] == [0, 1, 2] and r1["full"]["on_epoch_calls"] == []
    steps = [c.step for c in CheckpointStore.for_run(LocalObjectStore(out / "store-full"), "churn", "run").list()]
    assert steps == [30, 40, 48]


def test_resume_under_ddp_is_bit_identical_to_an_uninterrupted_ddp_run(ddp_run):
    _, (r0, r1), weights = ddp_run
    assert r0["preempted_at"] == r1["preempted_at"] == STOP_AT
    assert r0["resumed"]["resumed_from_step"] == r1["resumed"]["resumed_from_step"] == STOP_AT
    assert r0["resumed"]["global_step"] == TOTAL_STEPS
    for name, tensor in weights["full"].items():
        assert torch.equal(tensor, weights["resumed"][name]), name
    assert r0["resumed"]["history"] == r0["full"]["history"]


def test_ddp_follows_single_process_training_up_to_rounding(ddp_run, tmp_path):
    _, (r0, _), weights = ddp_run
    store = CheckpointStore.for_run(LocalObjectStore(tmp_path), "churn", "single")
    single = Trainer(NODROP, CheckpointSpec(interval_steps=10, max_overhead=None), store, LABEL, device="cpu", threads=1,
                     job="churn").fit(TRAIN, VAL)
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(weights["nodrop"][name], tensor, rtol=1e-4, atol=1e-5)
    for ddp_epoch, one_epoch in zip(r0["nodrop"]["history"], single.history, strict=True):
        assert ddp_epoch["train_loss"] == pytest.approx(one_epoch["train_loss"], rel=1e-5)
        assert ddp_epoch["val_auc"] == pytest.approx(one_epoch["val_auc"], abs=1e-4)


def test_a_stop_seen_by_one_rank_stops_every_rank_after_the_same_step(ddp_run):
    out, (r0, r1), _ = ddp_run
    assert r0["disagree"]["step"] == r1["disagree"]["step"] == STOP_AT
    assert r1["disagree"]["checkpoint"] is None  # only rank 0 writes
    newest = CheckpointStore.for_run(LocalObjectStore(out / "store-disagree"), "churn", "run").list()[-1]
    assert (newest.step, newest.key) == (STOP_AT, r0["disagree"]["checkpoint"])


def test_a_world_of_one_is_plain_single_process_training(tmp_path):
    a = Trainer(NODROP, CheckpointSpec(interval_steps=None), CheckpointStore(LocalObjectStore(tmp_path), "a"),
                LABEL, device="cpu", threads=1, distributed=Distributed(rank=0, world_size=1)).fit(TRAIN, VAL)
    b = Trainer(NODROP, CheckpointSpec(interval_steps=None), CheckpointStore(LocalObjectStore(tmp_path), "b"),
                LABEL, device="cpu", threads=1).fit(TRAIN, VAL)
    assert_same_weights(a.model, b.model)
