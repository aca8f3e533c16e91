"""One rank of the DDP tests, run as ``torchrun --nproc_per_node=2 -m tests.model.ddp_worker OUT``.

Trains three ways on the synthetic frames of ``test_trainer`` and writes, per rank,
``rank<r>.json`` (what each fit reported) and, on rank 0, ``weights.pt``:

- ``full``: an uninterrupted 3-epoch run (dropout 0.1; every shard of every batch has equal size);
- ``resumed``: the same run stopped after step 21 (mid-epoch) and resumed from its checkpoint;
- ``nodrop``: a run without dropout, to compare with single-process training;
- ``disagree``: a run where only rank 1's ``should_stop`` says stop (the ranks must still agree).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from hybridtrain.errors import Preempted
from hybridtrain.specs.job import CheckpointSpec
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.distributed import Distributed
from hybridtrain.training.trainer import Trainer
from tests.fixtures.training_data import LABEL, SPEC, TRAIN, VAL

STOP_AT = 21
NODROP = SPEC.model_copy(update={"dropout": 0.0})


def main(out: Path) -> None:
    ddp = Distributed.from_env()
    assert ddp is not None and ddp.world_size == 2, "run under torchrun with 2 processes"
    report: dict = {"rank": ddp.rank}
    weights = {}
    with ddp.process_group():
        def trainer(name: str, spec=SPEC) -> Trainer:
            store = CheckpointStore.for_run(LocalObjectStore(out / f"store-{name}"), "churn", "run", keep_last=3)
            return Trainer(spec, CheckpointSpec(interval_steps=10, keep_last=3, max_overhead=None), store, LABEL, device="cpu",
                           threads=1, job="churn", distributed=ddp)

        epochs: list[int] = []
        full = trainer("full").fit(TRAIN, VAL, on_epoch=lambda e, m: epochs.append(e))
        report["full"] = {"history": full.history, "global_step": full.global_step,
                          "checkpoints_written": full.checkpoints_written, "on_epoch_calls": epochs}

        calls = itertools.count(1)
        try:
            trainer("resumed").fit(TRAIN, VAL, should_stop=lambda: next(calls) >= STOP_AT)
            raise AssertionError("should have stopped")
        except Preempted as exc:
            report["preempted_at"] = exc.step
        ddp.barrier()  # rank 0's checkpoint is written before anyone resumes
        resumed = trainer("resumed").fit(TRAIN, VAL)
        report["resumed"] = {"resumed_from_step": resumed.resumed_from_step, "global_step": resumed.global_step,
                             "history": resumed.history}

        nodrop = trainer("nodrop", NODROP).fit(TRAIN, VAL)
        report["nodrop"] = {"history": nodrop.history}

        # Only rank 1 gets the notice (a signal reaches the ranks at different moments): both stop together.
        steps = itertools.count(1)
        try:
            trainer("disagree").fit(TRAIN, VAL, should_stop=lambda: ddp.rank == 1 and next(steps) >= STOP_AT)
            raise AssertionError("should have stopped")
        except Preempted as exc:
            report["disagree"] = {"step": exc.step, "checkpoint": exc.checkpoint}
        weights = {"full": full.model.state_dict(), "resumed": resumed.model.state_dict(),
                   "nodrop": nodrop.model.state_dict()}
    (out / f"rank{ddp.rank}.json").write_text(json.dumps(report))
    if ddp.is_main:
        torch.save(weights, out / "weights.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
