"""Dispatch latency: from the flow deciding a site to training code running in that pool's worker.

A real Prefect server and two process work pools on it, each with a real process worker:
``bench-cloud`` starts flow runs the stock way (``python -m prefect.engine`` per run) and
``bench-warm`` has the ``command`` job variable ``python -m workers.warm_client``, with a warm-pool
daemon (``workers.warm_pool``) beside its worker. The same probe flow is deployed to both; its first
statement records the wall clock after importing the training stage's modules (the import cost a
real train-stage run pays). The lifecycle side calls ``run_deployment`` exactly as
``orchestration.dispatch.run_stage`` does. Baseline in the same run: the probe called in-process.

Each round runs the probe in-process, then through each pool, waiting before each dispatched run
until the previous run's processes have exited and the daemon has all its spares ready (an idle
gateway; the replacement spare a warm run starts does import while that run starts, as it would in
production). The first round warms the workers and is not counted. Per path the medians of three
phases come from the run's state history: dispatch -> Pending (poll wait and the worker's
submission), Pending -> Running (process start until the engine proposes Running), Running -> the
probe's first line (flow set-up and imports).

Settings (printed): PREFECT_WORKER_QUERY_SECONDS — how often each worker asks the server for due
runs; a run waits for the next poll, U(0, q) s. 1 s keeps that wait under a third of the 3 s
budget at one cheap API call (``get_scheduled_flow_runs``) per worker per second; 0.5 s would
save ~0.25 s on average for twice the calls from every worker of every site.
PREFECT_WORKER_PREFETCH_SECONDS only matters for runs scheduled in the future (``run_deployment``
creates them due now). ``--spares`` spares, each having preloaded ``--preload``.

Usage: .venv/bin/python benchmarks/dispatch_latency.py [--runs 5] [--query-seconds 1] [--spares 2]
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
PLAIN, WARM = "bench-cloud", "bench-warm"
PREFETCH_S = 10
START_TIMEOUT_S = 120.0


@flow(name="dispatch-probe")
def probe(stamp_file: str) -> None:
    import flows.training  # noqa: F401 - pay the same imports as the real train stage

    Path(stamp_file).write_text(json.dumps({"started": time.time(), "pid": os.getpid(), "ppid": os.getppid(),
                                            "warm": bool(os.environ.get("HYBRIDTRAIN_WARM_SPARE"))}))


def wait_for(what: str, check, timeout_s: float, procs: dict[str, subprocess.Popen], logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited with {proc.returncode}; logs in {logs}:\n"
                                 + (logs / f"{name}.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--query-seconds", type=float, default=1.0)
    ap.add_argument("--spares", type=int, default=2)
    ap.add_argument("--preload", default="flows.training,flows.data")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))

    with tempfile.TemporaryDirectory(prefix="ht-dispatch-") as tmp:
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness
        from prefect.workers.process import ProcessWorker

        from workers.warm_protocol import query_status

        logs = Path(tmp)
        sock = Path(tmp) / "run" / "warm.sock"
        with prefect_test_harness(server_startup_timeout=120):
            api = PREFECT_API_URL.value()
            with get_client(sync_client=True) as client:
                for pool in (PLAIN, WARM):
                    client.create_work_pool(WorkPoolCreate(
                        name=pool, type="process", base_job_template=ProcessWorker.get_default_base_job_template()))
            for pool, job_variables in ((PLAIN, None), (WARM, {"command": f"{sys.executable} -m workers.warm_client"})):
                probe.from_source(source=str(ROOT), entrypoint="benchmarks/dispatch_latency.py:probe").deploy(
                    name=pool, work_pool_name=pool, job_variables=job_variables, print_next_steps=False,
                    ignore_warnings=True)
            env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": str(args.query_seconds),
                   "PREFECT_WORKER_PREFETCH_SECONDS": str(PREFETCH_S), "PYTHONPATH": str(ROOT),
                   "HYBRIDTRAIN_WARM_SOCKET": str(sock)}
            commands = {
                "daemon": [sys.executable, "-m", "workers.warm_pool", "--spares", str(args.spares),
                           "--preload", args.preload],
                f"worker-{PLAIN}": [sys.executable, "-m", "prefect", "worker", "start", "--pool", PLAIN],
                f"worker-{WARM}": [sys.executable, "-m", "prefect", "worker", "start", "--pool", WARM],
            }
            procs: dict[str, subprocess.Popen] = {}
            for name, cmd in commands.items():
                with open(logs / f"{name}.log", "wb") as fh:
                    procs[name] = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=fh,
                                                   stderr=subprocess.STDOUT)

            def children(pid: int) -> list[int]:
                out = []
                for entry in Path("/proc").iterdir():
                    try:
                        if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                            out.append(int(entry.name))
                    except OSError:
                        continue  # exited while we looked
                return out

            def idle() -> bool:
                """The previous run is over everywhere: no flow-run process under either worker, and the
                daemon has all its spares ready and none busy."""
                if any(children(procs[f"worker-{pool}"].pid) for pool in (PLAIN, WARM)):
                    return False
                try:
                    status = query_status(sock, timeout_s=2.0)
                except OSError:
                    return False
                return [s["state"] for s in status["spares"]] == ["ready"] * args.spares

            def workers_online() -> bool:
                with get_client(sync_client=True) as client:
                    return all(client.read_workers_for_work_pool(
                        pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])))
                        for pool in (PLAIN, WARM))

            try:
                wait_for("workers online", workers_online, START_TIMEOUT_S, procs, logs)
                results: dict[str, list[float]] = {"inline": [], PLAIN: [], WARM: []}
                phases: dict[str, list[tuple[float, float, float]]] = {PLAIN: [], WARM: []}

                def phase_times(run_id, t0: float, code_at: float) -> tuple[float, float, float]:
                    """Dispatch -> Pending (poll wait + worker), Pending -> Running (process start to the
                    engine's Running proposal), Running -> probe's first line (load flow, imports)."""
                    with get_client(sync_client=True) as client:
                        states = client.read_flow_run_states(run_id)
                    at = {s.type.value: s.timestamp.timestamp() for s in states}
                    return at["PENDING"] - t0, at["RUNNING"] - at["PENDING"], code_at - at["RUNNING"]
                for i in range(args.runs + 1):  # round 0 warms the workers; not counted
                    stamp = Path(tmp) / f"stamp-{i}-inline.json"
                    t0 = time.time()
                    probe.fn(str(stamp))
                    took = {"inline": json.loads(stamp.read_text())["started"] - t0}
                    for pool in (PLAIN, WARM):
                        wait_for("an idle gateway", idle, START_TIMEOUT_S, procs, logs)
                        stamp = Path(tmp) / f"stamp-{i}-{pool}.json"
                        t0 = time.time()
                        run = run_deployment(f"dispatch-probe/{pool}", parameters={"stamp_file": str(stamp)},
                                             timeout=120, poll_interval=0.5)
                        if not (run.state and run.state.is_completed()):
                            raise SystemExit(f"probe run on {pool} did not complete: {run.state}; logs in {logs}")
                        report = json.loads(stamp.read_text())
                        if report["warm"] != (pool == WARM):
                            raise SystemExit(f"probe on {pool} ran {'in' if report['warm'] else 'outside'} a warm "
                                             f"spare; see {logs / 'daemon.log'}")
                        took[pool] = report["started"] - t0
                        if i:
                            phases[pool].append(phase_times(run.id, t0, report["started"]))
                    for key, value in took.items():
                        if i:
                            results[key].append(value)
                    print(f"run {i}: code running after dispatch: plain process worker {took[PLAIN]:.2f} s, "
                          f"warm launcher {took[WARM]:.2f} s" + (" (warm-up, not counted)" if i == 0 else ""),
                          flush=True)
            finally:
                for proc in procs.values():
                    proc.terminate()
                for proc in procs.values():
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)

    def summary(key: str) -> str:
        values = results[key]
        split = [statistics.median(p[k] for p in phases[key]) for k in range(3)]
        return (f"median {statistics.median(values):.2f} s, min {min(values):.2f} s, max {max(values):.2f} s "
                f"over {len(values)} runs (medians: dispatch->Pending {split[0]:.2f} s, Pending->Running "
                f"{split[1]:.2f} s, Running->code {split[2]:.2f} s)")

    print(f"settings: PREFECT_WORKER_QUERY_SECONDS={args.query_seconds:g} (poll interval, both workers), "
          f"PREFECT_WORKER_PREFETCH_SECONDS={PREFETCH_S}, warm spares={args.spares}, preload={args.preload}")
    print(f"in-process baseline median {statistics.median(results['inline']) * 1000:.1f} ms")
    print(f"plain process worker (python -m prefect.engine per run): {summary(PLAIN)}")
    print(f"warm launcher (workers.warm_client -> pre-warmed spare): {summary(WARM)}")
    print(f"dispatch_latency_s: {statistics.median(results[WARM]):.2f} s (target <= 3)")


if __name__ == "__main__":
    main()
