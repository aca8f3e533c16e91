"""Control-plane load: N lifecycle runs queued at once on the served stack (PostgreSQL, workers per pool).

    python benchmarks/control_plane_load.py [--runs 200] [--home WS] [--restart] [--json OUT]

Without ``--home`` it builds a throwaway workspace (sample data, test-sized job), starts the stack
with ``scripts/stack.py up`` (PostgreSQL, S3, MLflow server, Prefect server, 2 workers per pool, the
pools' concurrency limits from the sites catalog) and stops it at the end. Each run is the lifecycle
deployment ``training-lifecycle/churn-nightly-cloud-eu`` (orchestrated from the on-prem pool) of its
own small job (``load-000`` ...; 2,000 sample rows, one epoch), so runs only wait for capacity, never
for each other's training lease. Each run is a whole lifecycle (validate, preprocess, anonymize,
place, sync, train, evaluate, gates, register, promote) in ONE flow-run process: the runs are queued
with ``dispatch=inline``, so the stages run in that process instead of each being a flow run of its
own in a site pool (a deployment-dispatched lifecycle starts 4-5 processes, each importing Prefect,
MLflow and torch). The control plane sees the same lifecycle API traffic, pool limits and leases;
what is cheaper is only the number of interpreters per run. Even so a run costs tens of CPU-seconds
(imports, pandas, torch, MLflow and S3 calls), so on a 2-core host the wall time is set by the
host's CPUs, not by the control plane: 200 runs take over an hour there (see the README's numbers).

``--restart`` queues the runs while the site pools are paused (no worker takes them), then runs
``down`` and ``up`` and resumes the pools: the queue must survive the restart.

Reports: every run terminal (lost = not terminal in time or gone), duplicated trainings (a job
trained to success more than once), stuck RUNNING, registry aliases consistent, ``hybridtrain audit
verify``; runs/minute; API latency p50/p99 under load against the same calls on the idle stack
(the baseline, measured first in this run); schedule lag p99 (scheduled time -> RUNNING) of the
runs the server's scheduler created in the control pool (burst controller, recovery: a pool of their
own with no run limit, so this lag is the control plane's, never a wait for site capacity) under the
load; and, apart, each load run's queue wait (created -> RUNNING), which is a wait for pool capacity.
Lost runs are those not terminal when the wait ends (``--timeout``, or SIGINT/SIGTERM, which end the
wait early and still report); the report splits them into never started (still queued) and RUNNING.
Last line: ``control_plane_lost_runs: L of N (target 0)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
DEPLOYMENT = "training-lifecycle/churn-nightly-cloud-eu"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def stack_cmd(root: Path, *args: str) -> None:
    env = {**os.environ, "HYBRIDTRAIN_HOME": str(root)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "stack.py"), *args, "--home", str(root)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"stack {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n"
                         f"{proc.stderr[-4000:]}")


def make_workspace(runs: int) -> Path:
    from tests.fixtures.workspaces import ROOT as PROJECT
    from tests.fixtures.workspaces import build_workspace, spec_writer

    base = Path(tempfile.mkdtemp(prefix="hybridtrain-load-"))
    base.chmod(0o755)  # PostgreSQL runs as its own user when started as root: it must pass through
    root = build_workspace(base / "ws", rows=2000)
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(PROJECT / pkg, target_is_directory=True)
    write = spec_writer(root)
    for i in range(runs):
        write(f"load-{i:03d}", metadata__name=f"load-{i:03d}", model__epochs=1)
    return root


class ApiProbe:
    """Times the calls the UI and the workers make (read runs, read a pool) every ``every`` seconds.

    ``samples`` holds those two calls (the reported p50/p99). ``by_call`` keeps each call apart, plus
    ``GET /health``, which touches no database: slow while the others are slow means the server
    process itself was busy (its event loop or the CPU), not PostgreSQL. ``slow`` keeps when each call
    over 500 ms happened (seconds since the epoch), to line up with the server's logs.
    """

    CALLS = (("POST", "/flow_runs/filter", {"limit": 10}), ("GET", "/work_pools/onprem", None))

    def __init__(self, api: str, every: float = 0.5):
        import httpx

        self.client = httpx.Client(base_url=api, timeout=30)
        self.every = every
        self.samples: list[float] = []
        self.by_call: dict[str, list[float]] = {}
        self.slow: list[tuple[float, str, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def clear(self) -> None:
        self.samples.clear()
        self.by_call.clear()
        self.slow.clear()

    def once(self) -> None:
        import httpx

        for method, path, body in (*self.CALLS, ("GET", "/health", None)):
            t = time.perf_counter()
            try:
                resp = self.client.request(method, path, json=body)
                ok = resp.status_code < 500
            except httpx.HTTPError:  # a failed call is counted, the probe goes on
                ok = False
            ms = (time.perf_counter() - t) * 1000
            if not ok:
                self.errors += 1
                continue
            name = f"{method} {path}"
            self.by_call.setdefault(name, []).append(ms)
            if path != "/health":
                self.samples.append(ms)
            if ms > 500:
                self.slow.append((time.time(), name, round(ms, 1)))

    def run_for(self, seconds: float) -> list[float]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.once()
            time.sleep(self.every)
        return self.samples

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.every):
                self.once()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)


def queue_runs(n: int, stamp: str, clients: int = 8) -> list[str]:
    """Create the ``n`` runs from ``clients`` concurrent API clients (as many users submitting at once)."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        dep_id = client.read_deployment_by_name(DEPLOYMENT).id

    def submit(part: range) -> list[str]:
        with get_client(sync_client=True) as client:
            return [str(client.create_flow_run_from_deployment(
                dep_id, parameters={"spec_path": f"jobs/load-{i:03d}.yaml", "dispatch": "inline"},
                idempotency_key=f"load-{stamp}-{i}", tags=["load-benchmark"]).id) for i in part]

    with ThreadPoolExecutor(clients) as pool:
        parts = pool.map(submit, [range(k, n, clients) for k in range(clients)])
        by_index = {i: fr for k, part in enumerate(parts) for i, fr in zip(range(k, n, clients), part)}
    return [by_index[i] for i in range(n)]


def pause_pools(pools: tuple[str, ...], paused: bool) -> None:
    """Pause (or resume) the site pools: their workers take no run while paused, the runs stay queued."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate

    with get_client(sync_client=True) as client:
        for pool in pools:
            client.update_work_pool(pool, WorkPoolUpdate(is_paused=paused))


def read_runs(ids: list[str]) -> dict[str, object]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    out = {}
    with get_client(sync_client=True) as client:
        for chunk in range(0, len(ids), 200):
            part = ids[chunk:chunk + 200]
            for fr in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=part)),
                                            limit=len(part)):
                out[str(fr.id)] = fr
    return out


def scheduled_lags(since: datetime) -> list[float]:
    """Scheduled time -> RUNNING, seconds, of the scheduler-created runs in the control pool since ``since``.

    The control flows (burst controller, recovery) have a pool of their own with no run limit, so their
    lag is the control plane's own (scheduler, worker poll, process start), never a wait for site capacity.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterStartTime,
        WorkPoolFilter,
        WorkPoolFilterName,
    )

    from hybridtrain.service.stack import CONTROL_POOL

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)),
                                     work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[CONTROL_POOL])),
                                     limit=200)
    return [(r.start_time - r.expected_start_time).total_seconds() for r in runs
            if r.auto_scheduled and r.start_time and r.expected_start_time]


def peak_running(runs: list) -> int:
    """Most of ``runs`` RUNNING at one time (from their start and end times; a run not ended counts till now)."""
    now = datetime.now(UTC)
    edges = sorted([(r.start_time, 1) for r in runs if r.start_time]
                   + [(r.end_time or now, -1) for r in runs if r.start_time], key=lambda e: (e[0], e[1]))
    peak = level = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def pool_limit(pool: str) -> int | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_work_pool(pool).concurrency_limit


def trainings(root: Path, since: datetime) -> Counter:
    """Successful training attempts per load job since ``since`` (this benchmark's), from the audit log."""
    from hybridtrain.governance.audit_log import AuditLog

    after = since.strftime("%Y-%m-%dT%H:%M:%S")
    done: Counter = Counter()
    for r in AuditLog.in_workspace(root).records():
        if (r.action == "training_attempt" and str(r.outcome).startswith("succeeded")
                and r.subject.startswith("job load-") and r.at >= after):
            done[r.subject.removeprefix("job ")] += 1
    return done


def alias_problems(tracking_uri: str) -> list[str]:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    problems = []
    for model in client.search_registered_models(max_results=1000):
        for alias, version in (model.aliases or {}).items():
            try:
                mv = client.get_model_version(model.name, version)
            except MlflowException as exc:
                problems.append(f"{model.name}@{alias} -> v{version}: {exc}")
                continue
            if mv.run_id and client.get_run(mv.run_id).info.status != "FINISHED":
                problems.append(f"{model.name}@{alias} -> v{version}: its run is {client.get_run(mv.run_id).info.status}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--home", type=Path, help="Workspace of a running `make up` stack (default: a new one).")
    ap.add_argument("--restart", action="store_true", help="Queue with no worker up, then `down` and `up`.")
    ap.add_argument("--timeout", type=float, default=3600.0, help="Seconds for every run to end.")
    ap.add_argument("--json", type=Path, help="Also write the results here.")
    ap.add_argument("--keep", action="store_true", help="Leave the stack running.")
    ap.add_argument("--site-nice", type=int, choices=range(20), metavar="0-19",
                    help="Niceness of the site pools' workers and runs on the stack it starts (default: the stack's).")
    ap.add_argument("--api-workers", type=int, help="Prefect API processes of the stack it starts (default: the stack's).")
    ap.add_argument("--site-query-seconds", type=float, help="Site pools' worker poll interval (default: the stack's).")
    ap.add_argument("--site-cpus", help="CPUs of the site pools' workers and runs, e.g. 1 (default: the stack's).")
    args = ap.parse_args()

    from hybridtrain.service.stack import Stack

    own = args.home is None
    root = make_workspace(args.runs) if own else args.home.resolve()
    if not own:
        from tests.fixtures.workspaces import spec_writer

        write = spec_writer(root)
        for i in range(args.runs):
            write(f"load-{i:03d}", metadata__name=f"load-{i:03d}", model__epochs=1)
    t0 = time.monotonic()
    nice = ["--site-nice", str(args.site_nice)] if args.site_nice is not None else []
    nice += ["--api-workers", str(args.api_workers)] if args.api_workers is not None else []
    nice += ["--site-query-seconds", str(args.site_query_seconds)] if args.site_query_seconds is not None else []
    nice += ["--site-cpus", args.site_cpus] if args.site_cpus is not None else []
    if own:
        stack_cmd(root, "up", "--no-doctor", *nice, *(["--no-workers"] if args.restart else []))
    stack = Stack.load(root)
    print(f"stack up at {stack.prefect_api} in {time.monotonic() - t0:.0f} s; workspace {root}", flush=True)
    os.environ.update({"PREFECT_API_URL": stack.prefect_api, "HYBRIDTRAIN_HOME": str(root)})

    load_at_start = [round(x, 1) for x in os.getloadavg()]
    probe = ApiProbe(stack.prefect_api)
    idle = list(probe.run_for(15.0))
    idle_by_call = {k: list(v) for k, v in probe.by_call.items()}
    probe.clear()
    began = datetime.now(UTC)
    stamp = began.strftime("%Y%m%dT%H%M%S")
    t_queue = time.monotonic()
    if args.restart:
        pause_pools(stack.pools, True)  # queued, not taken: the runs must survive the restart as they are
    ids = queue_runs(args.runs, stamp)
    print(f"queued {len(ids)} runs in {time.monotonic() - t_queue:.1f} s", flush=True)
    if args.restart:
        stack_cmd(root, "down")
        stack_cmd(root, "up", "--no-deploy", "--no-doctor", *nice)
        pause_pools(stack.pools, False)
        print("stack restarted (down, up) with every run still queued; pools resumed", flush=True)
    probe.start()
    deadline = time.monotonic() + args.timeout
    stopped = threading.Event()  # SIGINT/SIGTERM: stop waiting, report what was reached, stop the stack
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    runs: dict = {}
    while time.monotonic() < deadline and not stopped.is_set():
        runs = read_runs(ids)
        states = Counter(r.state_type.value for r in runs.values())
        if len(runs) == len(ids) and all(s in TERMINAL for s in states):
            break
        print(f"  {time.monotonic() - t_queue:6.0f} s  {dict(states)}  load {os.getloadavg()[0]:.1f}", flush=True)
        stopped.wait(10)
    elapsed = time.monotonic() - t_queue
    probe.stop()
    runs = read_runs(ids)
    states = Counter(r.state_type.value for r in runs.values())
    lost = [i for i in ids if i not in runs or runs[i].state_type.value not in TERMINAL]
    stuck = [i for i in ids if i in runs and runs[i].state_type.value == "RUNNING"]
    never_started = [i for i in lost if i in runs and runs[i].start_time is None]
    done = trainings(root, began)
    dupes = {job: n for job, n in done.items() if n > 1}
    aliases = alias_problems(stack.mlflow_url)
    verify = subprocess.run([sys.executable, "-m", "orchestration.cli", "audit", "verify", "--home", str(root)],
                            capture_output=True, text=True, env={**os.environ, **stack.client_env()})
    lags = scheduled_lags(began)
    pool = next((r.work_pool_name for r in runs.values() if r.work_pool_name), None)
    limit = pool_limit(pool) if pool else None
    waits = [(r.start_time - r.expected_start_time).total_seconds() for r in runs.values()
             if r.start_time and r.expected_start_time]
    completed = states.get("COMPLETED", 0)
    result = {
        "runs": len(ids), "states": dict(states), "lost": len(lost), "stuck_running": len(stuck),
        "duplicated_trainings": sum(n - 1 for n in dupes.values()), "trained_jobs": len(done),
        "alias_problems": aliases, "audit_verify_rc": verify.returncode,
        "elapsed_s": round(elapsed, 1), "runs_per_minute": round(completed / elapsed * 60, 2),
        "api_idle_p50_ms": round(pct(idle, 50), 1), "api_idle_p99_ms": round(pct(idle, 99), 1),
        "api_load_p50_ms": round(pct(probe.samples, 50), 1), "api_load_p99_ms": round(pct(probe.samples, 99), 1),
        "api_errors": probe.errors, "api_samples": len(probe.samples),
        "api_by_call": {name: {"idle_p50_ms": round(pct(idle_by_call.get(name, []), 50), 1),
                               "idle_p99_ms": round(pct(idle_by_call.get(name, []), 99), 1),
                               "load_p50_ms": round(pct(ms, 50), 1), "load_p99_ms": round(pct(ms, 99), 1),
                               "over_500_ms": sum(1 for x in ms if x > 500), "samples": len(ms)}
                        for name, ms in probe.by_call.items()},
        "api_slow_calls": probe.slow,
        "schedule_lag_p50_s": round(pct(lags, 50), 2), "schedule_lag_p99_s": round(pct(lags, 99), 2),
        "scheduled_runs": len(lags),
        "queue_wait_p50_s": round(pct(waits, 50), 1), "queue_wait_p99_s": round(pct(waits, 99), 1),
        "peak_running": peak_running(list(runs.values())), "pool": pool, "pool_limit": limit,
        "restart": args.restart, "stopped_early": stopped.is_set() or time.monotonic() >= deadline,
        "never_started": len(never_started), "cpus": os.cpu_count(), "load_at_start": load_at_start,
        "site_nice": stack.site_nice, "api_workers": stack.api_workers, "site_query_seconds": stack.site_query_seconds,
        "site_cpus": stack.site_cpus,
        "load_at_end": [round(x, 1) for x in os.getloadavg()],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"states: {dict(states)}  (runs that did not complete: "
          f"{[(i, runs[i].state.message) for i in ids if i in runs and runs[i].state_type.value != 'COMPLETED'][:5]})")
    if lost:
        print(f"not terminal when the wait ended ({'stopped' if stopped.is_set() else 'timeout'} after "
              f"{elapsed:.0f} s): {len(lost)}, of which {len(never_started)} never started (still queued) and "
              f"{len(stuck)} RUNNING")
    for name, row in result["api_by_call"].items():
        print(f"  {name:24} under load p50 {row['load_p50_ms']} ms, p99 {row['load_p99_ms']} ms, "
              f"{row['over_500_ms']} of {row['samples']} over 500 ms (idle p99 {row['idle_p99_ms']} ms)")
    pinned = f" on CPUs {','.join(map(str, stack.site_cpus))}" if stack.site_cpus else ""
    print(f"machine: {os.cpu_count()} CPUs, site pools at niceness {stack.site_nice}{pinned}, {stack.api_workers} Prefect API "
          f"process(es) and the services apart, site workers polling every {stack.site_query_seconds:g} s, load average "
          f"{load_at_start} at the start, {result['load_at_end']} at the end")
    print(f"every run terminal: {not lost}; stuck RUNNING: {len(stuck)}; duplicated trainings: "
          f"{result['duplicated_trainings']} ({len(done)} jobs trained); registry aliases consistent: {not aliases} "
          f"{aliases[:3] if aliases else ''}; audit verify: {'passes' if verify.returncode == 0 else verify.stderr[-500:]}")
    print(f"throughput: {result['runs_per_minute']} runs/minute ({completed} completed in {elapsed:.0f} s)")
    ratio = result["api_load_p99_ms"] / result["api_idle_p99_ms"] if result["api_idle_p99_ms"] else float("nan")
    print(f"API latency under load: p50 {result['api_load_p50_ms']} ms, p99 {result['api_load_p99_ms']} ms "
          f"(idle baseline p50 {result['api_idle_p50_ms']} ms, p99 {result['api_idle_p99_ms']} ms; "
          f"p99 ratio {ratio:.2f}x; target p99 <= 500 ms; {probe.errors} failed calls)")
    print(f"schedule lag (scheduled -> RUNNING) of {len(lags)} scheduled control runs: p50 "
          f"{result['schedule_lag_p50_s']} s, p99 {result['schedule_lag_p99_s']} s (target p99 <= 5 s); "
          f"load runs' queue wait p50 {result['queue_wait_p50_s']} s, p99 {result['queue_wait_p99_s']} s")
    print(f"pool {pool}: at most {result['peak_running']} load runs RUNNING at once (its limit: {limit}, split "
          "over its workers' --limit; more would be an overshoot)")
    if own and not args.keep:
        stack_cmd(root, "down")
    print(f"control_plane_lost_runs: {len(lost)} of {len(ids)} (target 0)")
    ok = not lost and not stuck and not dupes and not aliases and verify.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
