"""Checkpoint overhead: a run with over 100 MB of state, checkpointed asynchronously every 30 s and at the Young/Daly interval, vs the same run without; and the trainer vs a bare torch loop.

Part 1 — checkpoints. The demo spec's features (``jobs/churn.yaml``) on ``generate_churn`` rows,
with a wide MLP (``--hidden`` × ``--hidden``, default 3000: about 9 M parameters, so model plus
Adam's two moments are over 100 MB of state — the checkpoint size is printed and checked). One
``Trainer.fit`` of about ``--seconds`` (epochs calibrated from a short warm-up), four times:

- **without**: ``interval_steps: null`` (only the final checkpoint every fit writes);
- **fixed 30 s**: ``interval_minutes: 0.5``;
- **Young/Daly**: ``auto_interval: true`` at ``--rate`` preemptions an hour — the trainer derives
  the interval from the time training waited for each checkpoint
  (``hybridtrain.training.checkpoint_interval``; at least 60 s).

The three run back to back ``--repeat`` times (order rotated); overhead is the median over repeats
of ``seconds with / seconds without (same repeat) - 1`` over the whole ``fit``, with its range. Also printed: what
training waited for (the in-memory snapshot, ``TrainResult.checkpoint_seconds``) and what the
background writer spent serializing, hashing and storing (``checkpoint_write_seconds``) — the
cost a synchronous checkpoint would have put on the step — and the CPU time of the training
thread with vs without (``time.thread_time``; the writer's thread is not in it), which other
processes' load does not move: what the snapshots and any contention cost training itself.

Part 2 — trainer vs bare loop. The demo model and checkpoint block on ``--rows`` rows for about
``--bare-seconds``: ``Trainer.fit`` against a plain torch loop doing the same work — fit the
featurizer, transform, the same seeded shuffle and batches, Adam, the epoch's summed loss, and
validation (AUC etc.) after every epoch — alternating, ``--pairs`` pairs, median of the paired ratios.

The machine is shared: other processes' load moves single runs by a few percent, more than the
effect measured; read the spread of the runs without checkpoints before the headline.

Run: .venv/bin/python benchmarks/checkpoint_overhead.py [--seconds 75] [--repeat 3] [--bare-seconds 60] [--pairs 3]
[--only checkpoints|trainer]
The last line is ``checkpoint_overhead: X % (target <= 1)``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PCT = 1.0
BARE_TARGET_PCT = 5.0
MIN_STATE_BYTES = 100 * 1000 * 1000


def frames(rows: int, label: str):
    import pandas as pd

    from hybridtrain.datasets.sample_data import generate_churn

    df = generate_churn(rows)
    df = df[df[label].notna()].copy()
    df[label] = df[label].astype(int)
    df["date_of_birth"] = pd.to_datetime(df["date_of_birth"]).dt.year
    val = np.random.default_rng(0).random(len(df)) < 0.1
    return df[~val].reset_index(drop=True), df[val].reset_index(drop=True)


def fit(model_spec, checkpoint, train, val, store_dir: Path, label: str, threads: int, rate: float | None = None):
    from hybridtrain.storage.local import LocalObjectStore
    from hybridtrain.training.checkpoint import CheckpointStore
    from hybridtrain.training.trainer import Trainer

    store = CheckpointStore.for_run(LocalObjectStore(store_dir), "bench", "run", keep_last=checkpoint.keep_last)
    trainer = Trainer(model_spec, checkpoint, store, label, device="cpu", threads=threads, job="bench",
                      preemptions_per_hour=rate)
    cpu = time.thread_time()
    result = trainer.fit(train, val)
    result.training_thread_cpu_s = time.thread_time() - cpu  # the writer's own thread is not in it
    return result


def bare_loop(model_spec, train, val, label: str, threads: int) -> float:
    """The same featurizing, training and per-epoch validation as ``Trainer.fit``, in plain torch; seconds."""
    import torch
    from torch import nn

    from hybridtrain.datasets.label import binary_labels
    from hybridtrain.training.evaluation import binary_metrics, model_probabilities
    from hybridtrain.training.featurizer import Featurizer
    from hybridtrain.training.model import TabularMLP
    from hybridtrain.training.trainer import epoch_permutation

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        started = time.perf_counter()
        torch.manual_seed(model_spec.seed)
        np.random.seed(model_spec.seed)
        random.seed(model_spec.seed)
        y_train = torch.from_numpy(binary_labels(train, label, dataset="train"))
        y_val = binary_labels(val, label, dataset="val")
        featurizer = Featurizer.fit(train, model_spec.features, dataset="train")
        x_train = torch.from_numpy(featurizer.transform(train, dataset="train"))
        x_val = featurizer.transform(val, dataset="val")
        model = TabularMLP.from_spec(model_spec, featurizer.n_features)
        optimizer = torch.optim.Adam(model.parameters(), lr=model_spec.learning_rate,
                                     weight_decay=model_spec.weight_decay)
        loss_fn = nn.BCEWithLogitsLoss()
        n, batch = len(x_train), model_spec.batch_size
        for epoch in range(model_spec.epochs):
            order = epoch_permutation(n, model_spec.seed, epoch)
            model.train()
            loss_sum = 0.0
            for b in range(math.ceil(n / batch)):
                idx = order[b * batch:(b + 1) * batch]
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                loss_sum += float(loss.item()) * len(idx)
            binary_metrics(y_val, model_probabilities(model, x_val), dataset="val", label=label)
        return time.perf_counter() - started
    finally:
        torch.set_num_threads(previous)


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """Median of paired ratios with the order-statistic interval around it (min..max below 6 pairs)."""
    v = sorted(values)
    n = len(v)
    k = max(0, int(n / 2 - 0.98 * math.sqrt(n)))  # ~95 % distribution-free interval for n >= 6
    lo, hi = (v[0], v[-1]) if n < 6 else (v[k], v[n - 1 - k])
    return float(np.median(v)), lo, hi


def calibrated_epochs(model_spec, train, val, label, threads, tmp: Path, target_s: float) -> int:
    """Epochs that make one fit last about ``target_s`` (from the faster of two one-epoch warm-ups, which also warm
    caches: one that met another process's burst would make every run shorter than asked)."""
    from hybridtrain.specs.job import CheckpointSpec

    one = min(fit(model_spec.model_copy(update={"epochs": 1}), CheckpointSpec(interval_steps=None), train, val,
                  tmp / f"calibrate-{i}", label, threads).seconds for i in range(2))
    return max(2, math.ceil(target_s / one))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=75.0, help="length of each checkpoint-overhead run")
    parser.add_argument("--hidden", type=int, default=3000, help="width of the two hidden layers (state size)")
    parser.add_argument("--big-rows", type=int, default=12_000, help="rows for the wide model")
    parser.add_argument("--rate", type=float, default=0.5, help="preemptions per hour for the Young/Daly interval")
    parser.add_argument("--bare-seconds", type=float, default=60.0, help="length of each trainer / bare-loop run")
    parser.add_argument("--rows", type=int, default=200_000, help="rows for the trainer vs bare-loop comparison")
    parser.add_argument("--pairs", type=int, default=3, help="trainer / bare-loop pairs (alternating)")
    parser.add_argument("--repeat", type=int, default=3, help="paired repeats of without / fixed / Young-Daly")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for training (default 1: leaves a core of this 2-core VM for the "
                             "writer, as a GPU host's CPUs would be)")
    parser.add_argument("--only", choices=("checkpoints", "trainer"),
                        help="run one part (the headline needs the checkpoints part)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from hybridtrain.specs.job import CheckpointSpec, parse_spec

    spec = parse_spec(yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text()), source="jobs/churn.yaml")
    label = spec.data_schema.label
    print(f"cpu: {platform.processor() or platform.machine()} ({os.cpu_count()} visible), python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} (shared VM: expect a few % noise)")

    with tempfile.TemporaryDirectory(prefix="hybridtrain-ckpt-bench-") as tmp_name:
        tmp = Path(tmp_name)
        overheads: dict[str, float] = {}
        if args.only != "trainer":
            # -- part 1: asynchronous checkpoints of a >100 MB state ------------------------------------
            big = spec.model.model_copy(update={"hidden_layers": [args.hidden, args.hidden], "dropout": 0.0,
                                                "batch_size": 256})
            train, val = frames(args.big_rows, label)
            epochs = calibrated_epochs(big, train, val, label, args.threads, tmp, args.seconds)
            big = big.model_copy(update={"epochs": epochs})
            variants = [
                ("fixed 30 s", CheckpointSpec(interval_steps=None, interval_minutes=0.5, keep_last=2), None),
                ("Young/Daly", CheckpointSpec(interval_steps=None, auto_interval=True, keep_last=2), args.rate),
            ]
            without_cp = CheckpointSpec(interval_steps=None, keep_last=2)
            # Paired runs: each repeat runs without, fixed and Young/Daly back to back (order rotated, so no variant
            # always follows another), and each variant is compared with the run without of its own repeat.
            ratios: dict[str, list[float]] = {name: [] for name, _, _ in variants}
            cpu_ratios: dict[str, list[float]] = {name: [] for name, _, _ in variants}
            runs = []
            for rep in range(args.repeat):
                order = [("without", without_cp, None), *variants]
                order = order[rep % 3:] + order[:rep % 3]
                got = {}
                for name, cp, rate in order:
                    r = fit(big, cp, train, val, tmp / f"run-{rep}-{len(runs)}", label, args.threads, rate)
                    got[name] = r
                    runs.append((name, r))
                    print(f"  [{rep + 1}/{args.repeat}] {name:<11} {r.seconds:7.2f} s, {r.checkpoints_written} checkpoints "
                          f"(incl. the final one), training waited {r.checkpoint_seconds:.3f} s, writer "
                          f"{r.checkpoint_write_seconds:.2f} s"
                          + (f", interval {r.checkpoint_interval_s:.0f} s" if r.checkpoint_interval_s else ""), flush=True)
                for name, _, _ in variants:
                    ratios[name].append(got[name].seconds / got["without"].seconds)
                    cpu_ratios[name].append(got[name].training_thread_cpu_s / got["without"].training_thread_cpu_s)
            withouts = [r for name, r in runs if name == "without"]
            noise = (max(r.seconds for r in withouts) / min(r.seconds for r in withouts) - 1) * 100
            fixed = [r for name, r in runs if name == "fixed 30 s"]
            size = fixed[0].last_checkpoint.size
            per_write = sum(r.checkpoint_write_seconds for r in fixed) / sum(r.checkpoints_written for r in fixed)
            small = "" if size >= MIN_STATE_BYTES else " (UNDER 100 MB: raise --hidden)"
            print(f"checkpoints: {args.hidden}x{args.hidden} MLP + Adam = {size / 1e6:.0f} MB a checkpoint{small}; "
                  f"{len(train):,} train rows, {epochs} epochs (~{args.seconds:.0f} s), {args.threads} training thread(s), "
                  f"{args.repeat} paired repeats, load average {os.getloadavg()[0]:.1f}")
            print(f"  one write in the background: {per_write:.2f} s (serialize, SHA-256, fsync'd atomic store) — "
                  f"synchronous, every 30 s that alone would be {per_write / 30 * 100:.1f} % of the run")
            print(f"  noise: the {len(withouts)} runs without checkpoints span {noise:.1f} %")
            for name, vals in ratios.items():
                med, lo, hi = median_interval(vals)
                cmed, clo, chi = median_interval(cpu_ratios[name])
                overheads[name] = (med - 1) * 100
                rs = [r for n, r in runs if n == name]
                waited = sum(r.checkpoint_seconds for r in rs) / sum(r.seconds - r.checkpoint_seconds for r in rs) * 100
                print(f"  {name}: {(med - 1) * 100:+.2f} % end to end, median of {len(vals)} paired ratios "
                      f"(range {(lo - 1) * 100:+.2f} .. {(hi - 1) * 100:+.2f} %); training itself waited {waited:.2f} % "
                      f"of its time; CPU of the training thread {(cmed - 1) * 100:+.2f} % "
                      f"({(clo - 1) * 100:+.2f} .. {(chi - 1) * 100:+.2f} %; not moved by other processes' load)")

        if args.only != "checkpoints":
            # -- part 2: the trainer vs a bare loop ----------------------------------------------------
            train, val = frames(args.rows, label)
            demo = spec.model.model_copy(update={"epochs": 1})
            threads = spec.model.threads or spec.resources.cpus
            # Warm-up and calibration: a run's fixed part (featurizing 180k rows) is about one epoch here, so the
            # epochs come from two lengths: the faster of two one-epoch runs (a first run, or one that met another
            # process's burst, can take several times as long) and a three-epoch run.
            one = min(bare_loop(demo, train, val, label, threads) for _ in range(2))
            three = bare_loop(demo.model_copy(update={"epochs": 3}), train, val, label, threads)
            per_epoch = max((three - one) / 2, 1e-3)
            fixed = max(one - per_epoch, 0.0)
            demo = demo.model_copy(update={"epochs": max(2, math.ceil((args.bare_seconds - fixed) / per_epoch))})
            trainer_s, bare_s, pair_ratios = [], [], []
            for p in range(args.pairs):
                order = ["bare", "trainer"] if p % 2 == 0 else ["trainer", "bare"]
                for which in order:
                    if which == "bare":
                        bare_s.append(bare_loop(demo, train, val, label, threads))
                    else:
                        run = fit(demo, spec.checkpoint, train, val, tmp / f"demo-{p}", label, threads)
                        trainer_s.append(run.seconds)
                pair_ratios.append(trainer_s[-1] / bare_s[-1])
                print(f"  pair {p + 1}: trainer {trainer_s[-1]:.2f} s ({run.checkpoints_written} checkpoints, "
                      f"{run.checkpoints_skipped} step checkpoints left out under max_overhead), bare {bare_s[-1]:.2f} s",
                      flush=True)
            med, lo, hi = median_interval(pair_ratios)
            print(f"trainer vs bare loop: jobs/churn.yaml model, {len(train):,} rows, {demo.epochs} epochs, {threads} "
                  f"threads, checkpoint {spec.checkpoint.model_dump(exclude_defaults=True)}: {(med - 1) * 100:+.1f} % "
                  f"median of {len(pair_ratios)} paired ratios (range {(lo - 1) * 100:+.1f} .. {(hi - 1) * 100:+.1f} %; "
                  f"target <= {BARE_TARGET_PCT:g})")
    if not overheads:
        return  # --only trainer: its line above is the last
    worst = max(overheads.values())
    print(f"checkpoint_overhead: {worst:.2f} % (target <= {TARGET_PCT:g})")


if __name__ == "__main__":
    main()
