"""One training process of the fault tests: ``python -m tests.integration.fault_worker CONFIG.json``.

What a training process on a spot instance runs, minus the data fetch: the synthetic churn
frames of ``tests.model.test_trainer`` (more rows, so a run lasts a few seconds), ``Trainer``
with checkpoints in a ``LocalObjectStore`` directory, all under a ``PreemptionNotice``.

- finished: ``OUT/result.json`` (steps, history, resumed_from_step) and ``OUT/weights.pt``; exit 0;
- a notice (SIGTERM/SIGUSR1): training stops after the step in progress, the checkpoint is
  written, then ``OUT/preempted.json``; exit ``EXIT_PREEMPTED`` (75);
- SIGKILL: nothing at all, of course — the next process resumes from the newest valid checkpoint.

CONFIG: ``{"store": dir, "out": dir, "rows": int, "epochs": int, "batch_size": int,
"interval_steps": int, "grace_s": float}``. ``OUT/started`` appears once the trap is set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from hybridtrain.errors import EXIT_PREEMPTED, Preempted
from hybridtrain.specs.job import CheckpointSpec
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.preemption import PreemptionNotice
from hybridtrain.training.trainer import Trainer
from tests.fixtures.training_data import LABEL, SPEC, make_frame


def setup(config: dict[str, Any]) -> tuple[Trainer, pd.DataFrame, pd.DataFrame]:
    """The trainer and frames a worker with ``config`` uses (the tests build their reference run with it)."""
    spec = SPEC.model_copy(update={"epochs": config["epochs"], "batch_size": config["batch_size"]})
    checkpoint = CheckpointSpec(interval_steps=config["interval_steps"], keep_last=3, max_overhead=None,
                                preemption_grace_s=config["grace_s"])
    store = CheckpointStore.for_run(LocalObjectStore(config["store"]), "churn", "run", keep_last=3)
    trainer = Trainer(spec, checkpoint, store, LABEL, device="cpu", threads=1, job="churn")
    return trainer, make_frame(config["rows"], seed=1), make_frame(500, seed=2)


def main(config_path: Path) -> int:
    config = json.loads(config_path.read_text())
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    trainer, train, val = setup(config)
    with PreemptionNotice(grace_s=config["grace_s"]) as notice:
        (out / "started").touch()
        try:
            result = trainer.fit(train, val, should_stop=notice)
        except Preempted as exc:
            uri = f"{trainer.store.store.url}/{exc.checkpoint}" if exc.checkpoint else None
            notice.report(exc, checkpoint_uri=uri).write(out)
            print(f"preempted at step {exc.step}; checkpoint {exc.checkpoint}", flush=True)
            return EXIT_PREEMPTED
    (out / "result.json").write_text(json.dumps({
        "global_step": result.global_step, "resumed_from_step": result.resumed_from_step,
        "history": result.history, "checkpoints_written": result.checkpoints_written,
    }))
    torch.save(result.model.state_dict(), out / "weights.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
