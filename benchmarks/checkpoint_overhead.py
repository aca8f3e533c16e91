"""Checkpoint overhead: training throughput with checkpoints at the spec's interval vs without, same run.

The data is the generated churn sample (``hybridtrain.datasets.sample_data.generate_churn``, ``--rows``),
labelled rows only, ``date_of_birth`` as its year (what anonymization makes of it), split 90/10
into train and validation. The model, its features, the checkpoint block and the CPU threads
(``resources.cpus``, as the train stage sets them) are the demo spec's (``jobs/churn.yaml``).

Two variants of the same ``Trainer.fit`` on the same frames, alternating (which goes first
alternates too), best of ``--repeats`` each, every trial into a fresh ``LocalObjectStore``:

- **with**: the spec's ``checkpoint`` block (``interval_steps``, ``keep_last``);
- **without**: ``interval_steps: null`` — no periodic checkpoints (the final one, written by
  every fit, stays in both).

Throughput is training samples per second over the whole ``fit`` (featurizer, epochs, validation,
final checkpoint); the overhead is ``without / with - 1``. As a cross-check that does not depend
on other processes' noise, the time the fastest "with" run itself spent in its periodic
checkpoints (``TrainResult.checkpoint_seconds``: gathering the state, serializing, checking,
hashing, two fsync'd atomic writes, retention) over the rest of that run is printed too. Also
reported: the checkpoint's size, the mean write time into the ``LocalObjectStore`` and, with
``--s3``, into an S3 bucket on a moto server this script starts (a local process, so it shows
the client-side cost, not a WAN's), and the Young/Daly interval those write times give at a spot
preemption rate of 0.5 per hour.

Run: .venv/bin/python benchmarks/checkpoint_overhead.py [--rows 200000] [--repeats 5] [--s3]
The last line is ``checkpoint_overhead: X % (target <= 3)``.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

TARGET_PCT = 3.0
SPOT_RATE_PER_H = 0.5


def frames(rows: int, label: str):
    import pandas as pd

    from hybridtrain.datasets.sample_data import generate_churn

    df = generate_churn(rows)
    df = df[df[label].notna()].copy()
    df[label] = df[label].astype(int)
    df["date_of_birth"] = pd.to_datetime(df["date_of_birth"]).dt.year
    val = np.random.default_rng(0).random(len(df)) < 0.1
    return df[~val].reset_index(drop=True), df[val].reset_index(drop=True)


def fit_once(spec, checkpoint, train, val, store_dir: Path, threads: int):
    from hybridtrain.storage.local import LocalObjectStore
    from hybridtrain.training.checkpoint import CheckpointStore
    from hybridtrain.training.trainer import Trainer

    store = CheckpointStore.for_run(LocalObjectStore(store_dir), spec.name, "bench", keep_last=checkpoint.keep_last)
    trainer = Trainer(spec.model, checkpoint, store, spec.data_schema.label, device="cpu",
                      threads=threads, job=spec.name)
    return trainer.fit(train, val), store


def start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process, on 127.0.0.1 and a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fh = open(log, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"moto server did not start: {log.read_text()}")


def s3_write_seconds(state: dict, saves: int, tmp: Path) -> float:
    """Mean seconds of ``CheckpointStore.save`` of ``state`` into a bucket on a local moto server."""
    import boto3

    from hybridtrain.specs.sites import S3Store
    from hybridtrain.storage.s3 import S3ObjectStore
    from hybridtrain.training.checkpoint import CheckpointStore

    proc, url = start_moto(tmp / "moto.log")
    try:
        boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        store = CheckpointStore.for_run(S3ObjectStore(S3Store(bucket="bench", endpoint_url=url, access_key_id="bench",
                                                              secret_access_key="bench")), "churn", "bench")
        store.save(state, 0)  # connection set up
        started = time.perf_counter()
        for step in range(1, saves + 1):
            store.save(state, step)
        return (time.perf_counter() - started) / saves
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--s3", action="store_true", help="also time checkpoint writes to a local moto S3 server")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: model.threads or resources.cpus, as the train stage)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from hybridtrain.specs.job import parse_spec
    from hybridtrain.training.checkpoint_interval import optimal_interval_s

    spec = parse_spec(yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text()), source="jobs/churn.yaml")
    with_ckpt = spec.checkpoint
    without = with_ckpt.model_copy(update={"interval_steps": None, "interval_minutes": None})
    train, val = frames(args.rows, spec.data_schema.label)
    steps_per_epoch = -(-len(train) // spec.model.batch_size)
    steps = steps_per_epoch * spec.model.epochs
    threads = args.threads or spec.model.threads or spec.resources.cpus

    best = {"with": 0.0, "without": 0.0}
    last = None
    with tempfile.TemporaryDirectory(prefix="hybridtrain-ckpt-bench-") as tmp_name:
        tmp = Path(tmp_name)
        fit_once(spec, without, train.iloc[:5000], val, tmp / "warmup", threads)  # imports, allocator, caches
        for r in range(args.repeats):
            order = [("with", with_ckpt), ("without", without)]
            for name, cp in order if r % 2 == 0 else reversed(order):
                result, store = fit_once(spec, cp, train, val, tmp / f"{name}-{r}", threads)
                if result.samples_per_second > best[name]:
                    best[name] = result.samples_per_second
                    if name == "with":
                        last = (result, store)
        result, store = last
        size = result.last_checkpoint.size
        local_write = result.checkpoint_seconds / result.checkpoints_written
        state, _ = store.latest_valid()
        s3_write = s3_write_seconds(state, 20, tmp) if args.s3 else None

    overhead = (best["without"] / best["with"] - 1) * 100
    run_s = len(train) * spec.model.epochs / best["with"]
    periodic = result.checkpoints_written - 1  # the final checkpoint is written by both variants
    periodic_s = local_write * periodic
    inside = periodic_s / (result.seconds - periodic_s) * 100
    print(f"checkpoint overhead: jobs/churn.yaml model on {len(train):,} train / {len(val):,} val rows of "
          f"generate_churn({args.rows:,}); {spec.model.epochs} epochs x {steps_per_epoch} steps (batch "
          f"{spec.model.batch_size}), CPU, {threads} threads; best of {args.repeats}, alternating")
    print(f"  cpu: {platform.processor() or platform.machine()} ({os.cpu_count()} visible), "
          f"python {platform.python_version()}")
    print(f"  with checkpoints (interval_steps={with_ckpt.interval_steps}, keep_last={with_ckpt.keep_last}): "
          f"{best['with']:,.0f} samples/s, {result.checkpoints_written} checkpoints in {steps} steps "
          f"(one run ~{run_s:.1f} s)")
    print(f"  without (final checkpoint only):        {best['without']:,.0f} samples/s")
    print(f"  checkpoint size: {size / 1024:.1f} KiB; mean write to LocalObjectStore: {local_write * 1000:.1f} ms")
    print(f"  inside the fastest run: {periodic} periodic checkpoints x {local_write * 1000:.1f} ms = "
          f"{periodic_s:.3f} s of {result.seconds:.2f} s -> {inside:.1f} % of its training time")
    if s3_write is not None:
        print(f"  mean write to S3 (moto server on loopback, 20 saves): {s3_write * 1000:.1f} ms")
    slowest = max(local_write, s3_write or 0.0)
    print(f"  Young/Daly interval at {SPOT_RATE_PER_H} preemptions/h for a {slowest * 1000:.0f} ms write: "
          f"{optimal_interval_s(slowest, SPOT_RATE_PER_H):.0f} s (clamped to 60..3600 s)")
    print(f"checkpoint_overhead: {overhead:.1f} % (target <= {TARGET_PCT:g})")


if __name__ == "__main__":
    main()
