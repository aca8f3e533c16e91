"""Dispatch latency: from the flow deciding a site to training code running in that pool's worker.

A real Prefect server, a real process worker on pool ``bench-cloud``, and a probe flow deployed
there whose first statement records the wall clock, after importing the training stage's modules
(the import cost a real train-stage run pays). The lifecycle side calls ``run_deployment`` exactly
as ``flows.dispatch.run_stage`` does. Baseline in the same run: the same probe called in-process.
Worker settings used (the knobs that matter): PREFECT_WORKER_QUERY_SECONDS (poll interval) and
PREFECT_WORKER_PREFETCH_SECONDS.

Usage: .venv/bin/python benchmarks/dispatch_latency.py [--runs 5] [--query-seconds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefect import flow

ROOT = Path(__file__).resolve().parents[1]
POOL = "bench-cloud"


@flow(name="dispatch-probe")
def probe(stamp_file: str) -> None:
    import flows.training  # noqa: F401 - pay the same imports as the real train stage

    Path(stamp_file).write_text(json.dumps({"started": time.time()}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--query-seconds", type=float, default=1.0)
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))

    with tempfile.TemporaryDirectory(prefix="ht-dispatch-") as tmp:
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness
        from prefect.workers.process import ProcessWorker

        with prefect_test_harness(server_startup_timeout=120):
            api = PREFECT_API_URL.value()
            with get_client(sync_client=True) as client:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                                       base_job_template=ProcessWorker.get_default_base_job_template()))
            probe.from_source(source=str(ROOT), entrypoint="benchmarks/dispatch_latency.py:probe").deploy(
                name=POOL, work_pool_name=POOL, print_next_steps=False, ignore_warnings=True)
            env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": str(args.query_seconds),
                   "PREFECT_WORKER_PREFETCH_SECONDS": "10", "PYTHONPATH": str(ROOT)}
            worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
                                      env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                inline, remote = [], []
                for i in range(args.runs + 1):  # the first remote run warms the worker; not counted
                    stamp = Path(tmp) / f"stamp-{i}.json"
                    t0 = time.time()
                    probe.fn(str(stamp))
                    inline.append(json.loads(stamp.read_text())["started"] - t0)
                    stamp.unlink()
                    t0 = time.time()
                    run = run_deployment(f"dispatch-probe/{POOL}", parameters={"stamp_file": str(stamp)},
                                         timeout=120, poll_interval=0.5)
                    if not (run.state and run.state.is_completed()):
                        raise SystemExit(f"probe run did not complete: {run.state}")
                    started = json.loads(stamp.read_text())["started"]
                    if i:
                        remote.append(started - t0)
                    print(f"run {i}: code running {started - t0:.2f} s after dispatch"
                          + (" (warm-up, not counted)" if i == 0 else ""))
            finally:
                worker.terminate()
                worker.wait(timeout=30)

    med = statistics.median(remote)
    print(f"in-process baseline median {statistics.median(inline) * 1000:.1f} ms; dispatched median {med:.2f} s, "
          f"min {min(remote):.2f} s, max {max(remote):.2f} s over {len(remote)} runs; "
          f"PREFECT_WORKER_QUERY_SECONDS={args.query_seconds}")
    print(f"dispatch_latency_s: {med:.2f} s (target <= 3)")


if __name__ == "__main__":
    main()
