"""Orchestration overhead: the lifecycle as Prefect flows vs the same core stage calls in plain Python.

Same data, same process, one run. The Prefect server is started (and warmed up) before timing,
and one untimed lifecycle establishes a champion so both timed variants do identical work
(including the champion comparison). Each variant runs ``--repeat`` times, alternating; the
best time of each is compared. A second measurement times trivial tasks to give the per-task
overhead once the server is up.

Usage: .venv/bin/python benchmarks/orchestration_overhead.py [--rows 200000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def make_workspace(base: Path, rows: int) -> Path:
    from hybridtrain.cli import ensure_sample_data
    from hybridtrain.workspace import Workspace

    ws_root = base / "ws"
    ws_root.mkdir()
    for rel in ("deployments", "jobs"):
        shutil.copytree(ROOT / rel, ws_root / rel, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    subprocess.run(["git", "init", "-q", str(ws_root)], check=True)
    ensure_sample_data(Workspace.resolve(ws_root), rows, 20261121, Path("jobs/churn.yaml"))
    return ws_root


def plain_lifecycle(ws, spec, key: bytes, run_key: str) -> None:
    """The flow's stage sequence, as direct calls of the same core functions."""
    from hybridtrain import stages

    started = time.perf_counter()
    run_id = stages.open_run(ws, spec, None)
    prep = stages.preprocess(ws, spec)
    anon = stages.anonymize(ws, spec, prep.curated, key)
    decision = stages.place(ws, spec, anon.approved.size, None, datetime.now(UTC))
    stages.record_placement(ws, run_id, decision)
    site = decision.site
    synced = stages.sync(ws, anon.approved, site)
    stages.record_data(ws, spec, run_id, prep, anon, synced)
    trained = stages.train(ws, spec, synced.dataset, site, run_id, run_key)
    evaluated = stages.evaluate(ws, spec, synced.dataset, site, trained.model_uri)
    lineage = stages.build_lineage(ws, spec, prep, anon, synced, site, started)
    promoted = stages.promote(ws, spec, run_id, trained.model_uri, lineage, evaluated)
    stages.close_run(ws, run_id, lineage, evaluated, promoted,
                     [t for t in (synced.transfer, *trained.transfers) if t is not None])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=200)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ht-bench-") as tmp:
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        from prefect import flow, task
        from prefect.testing.utilities import prefect_test_harness

        from blocks.register import ensure_pseudonym_key
        from flows.lifecycle import lifecycle
        from hybridtrain import stages
        from hybridtrain.spec import load_spec
        from hybridtrain.workspace import Workspace
        from tasks.data import pseudonym_key

        ws_root = make_workspace(Path(tmp), args.rows)
        ws = Workspace.resolve(ws_root)
        spec = load_spec(ws_root / "jobs" / "churn.yaml", stages.load_sites(ws))

        @task
        def noop(i: int) -> int:
            return i

        @flow
        def many(n: int) -> int:
            return sum(noop(i) for i in range(n))

        with prefect_test_harness(server_startup_timeout=120):
            ensure_pseudonym_key(ws.pseudonym_key_block)
            key = pseudonym_key(ws.pseudonym_key_block)
            many(2)  # warm the client and the server
            t = time.perf_counter()
            plain_lifecycle(ws, spec, key, "warmup")  # establishes the champion; not timed
            print(f"warm-up lifecycle (plain, untimed): {time.perf_counter() - t:.1f} s")

            plain, prefect = [], []
            for i in range(args.repeat):
                t = time.perf_counter()
                plain_lifecycle(ws, spec, key, f"plain-{i}")
                plain.append(time.perf_counter() - t)
                t = time.perf_counter()
                lifecycle(spec_path="jobs/churn.yaml", workspace=str(ws_root), run_key=f"prefect-{i}",
                          dispatch="inline")
                prefect.append(time.perf_counter() - t)
                print(f"repeat {i}: plain {plain[-1]:.2f} s, prefect {prefect[-1]:.2f} s")

            t = time.perf_counter()
            for i in range(args.tasks):
                noop.fn(i)
            bare = time.perf_counter() - t
            t = time.perf_counter()
            many(args.tasks)
            orchestrated = time.perf_counter() - t
            per_task_ms = (orchestrated - bare) / args.tasks * 1000

    ratio = min(prefect) / min(plain)
    print(f"rows: {args.rows}, lifecycle plain best {min(plain):.2f} s, prefect best {min(prefect):.2f} s, "
          f"difference {min(prefect) - min(plain):.2f} s")
    print(f"per_task_overhead: {per_task_ms:.1f} ms/task over {args.tasks} tasks incl. one flow run "
          f"(target <= 15)")
    print(f"overhead_ratio: {ratio:.3f} x (target <= 1.10)")


if __name__ == "__main__":
    main()
