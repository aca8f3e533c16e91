"""Orchestration overhead: the lifecycle as Prefect flows vs the same core stage calls in plain Python.

Same data, same process, one run, on the server ``make demo`` uses: Prefect's embedded server,
started and warmed up before timing. One untimed plain lifecycle establishes a champion so both
timed variants do identical work (including the champion comparison), and one untimed flow run pays
the process's one-time Prefect costs. Each variant runs ``--repeat`` times in back-to-back pairs,
plain first in even pairs and Prefect first in odd ones. Before each timed lifecycle the benchmark
collects garbage and waits until the server is quiet, so no lifecycle is charged with server work
left over from the one before, and it prints the server's CPU seconds per lifecycle for both
variants, with the part spent after the flow returned (the leftover the wait keeps out of the next
run).

The headline is the median of the per-pair ratios with a distribution-free confidence interval
from order statistics: on this VM a single lifecycle varies by about 15 % between runs, so the
ratio of the two best times swings both ways while the paired median holds. The best-of ratio and
the seconds spent outside the five stages are printed too, and a few more pairs run with Prefect's
own code instead of the fixes in ``flows/prefect_compat.py`` (its heartbeat thread holds the end of
every flow run 0-1 s; each client builds a new TLS context), to show what the fixes are worth (those
pairs are not in the headline). A second measurement times trivial tasks to give the per-task
overhead once the server is up.

Usage: .venv/bin/python benchmarks/orchestration_overhead.py [--rows 200000] [--repeat 11]
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def make_workspace(base: Path, rows: int) -> Path:
    from hybridtrain.cli.main import ensure_sample_data
    from hybridtrain.workspace import Workspace

    ws_root = base / "ws"
    ws_root.mkdir()
    for rel in ("deployments", "jobs"):
        shutil.copytree(ROOT / rel, ws_root / rel, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    subprocess.run(["git", "init", "-q", str(ws_root)], check=True)
    ensure_sample_data(Workspace.resolve(ws_root), rows, 20261121, Path("jobs/churn.yaml"))
    return ws_root


def plain_lifecycle(ws, spec_path: Path, key: bytes, signing_pem: str, run_key: str) -> dict[str, float]:
    """The flow's stage sequence, as direct calls of the same core functions; seconds per stage."""
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec

    started = time.perf_counter()
    spec = load_spec(spec_path, ws.load_sites())
    run_id = stages.open_run(ws, spec, None)
    prep = stages.preprocess(ws, spec)
    anon = stages.anonymize(ws, spec, prep.curated, key)
    decision = stages.place(ws, spec, anon.approved.size, None, datetime.now(UTC), stages.estimate_run_hours(ws, spec))
    stages.record_placement(ws, run_id, decision, spec.name)
    site = decision.site
    if site == spec.dataset.site:
        synced = stages.SyncResult(dataset=anon.approved, transfer=None, site=site, seconds=0.0)
    else:
        synced = stages.sync(ws, anon.approved, site, spec)
    stages.record_data(ws, spec, run_id, prep, anon, synced)
    stages.checkpoint_sites(ws, spec, run_key)  # as the supervised training does before its first attempt
    trained = stages.train(ws, spec, synced.dataset, site, run_id, run_key)
    stages.audit(ws).append(actor="benchmark", action="training_attempt", subject=f"job {spec.name}",
                            inputs={"mlflow_run_id": run_id, "site": site}, outcome="succeeded")
    evaluated = stages.evaluate(ws, spec, synced.dataset, site, trained.model_uri)
    lineage = stages.build_lineage(ws, spec, prep, anon, synced, site, started)
    crossings = [t for t in (synced.transfer, *trained.transfers) if t is not None]
    promoted = stages.promote(ws, spec, run_id, trained, decision.capacity_class, lineage, evaluated, crossings,
                              signing_pem, "benchmark")
    stages.close_run(ws, run_id, lineage, evaluated, promoted, crossings)
    return {"preprocess": prep.seconds, "anonymize": anon.seconds, "train": trained.seconds,
            "evaluate": evaluated.seconds, "promote": promoted.seconds}


def wait_recorded(flow_run_id, n: int, timeout_s: float = 120.0) -> None:
    """Poll until the server has recorded ``n`` completed task runs of ``flow_run_id``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    done = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.COMPLETED])))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while not client.read_task_runs(flow_run_filter=runs, task_run_filter=done, offset=n - 1, limit=1):
            if time.monotonic() > deadline:
                print(f"the server had not recorded all {n} task runs after {timeout_s:.0f} s")
                return
            time.sleep(0.2)


class ServerCpu:
    """CPU seconds of the embedded server process (all its threads), and a wait until it is quiet."""

    def __init__(self, pid: int):
        import psutil

        self.proc = psutil.Process(pid)

    def seconds(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def wait_quiet(self, window_s: float = 0.5, busy: float = 0.1, timeout_s: float = 60.0) -> None:
        """Poll until the server used under ``busy`` of a core over ``window_s`` (its idle loops use ~3 %)."""
        deadline = time.monotonic() + timeout_s
        before = self.seconds()
        while time.monotonic() < deadline:
            time.sleep(window_s)
            now = self.seconds()
            if now - before < busy * window_s:
                return
            before = now
        print(f"the server was still busy after {timeout_s:.0f} s")


@contextmanager
def prefect_own_code() -> Iterator[None]:
    """Run flows with Prefect 3.8.8's own code instead of the fixes in ``orchestration.prefect_compat``."""
    from orchestration import prefect_compat

    prefect_compat.uninstall()
    try:
        yield
    finally:
        prefect_compat.install()


def median_interval(values: list[float], level: float = 0.90) -> tuple[float, float, float]:
    """Distribution-free interval for the median from order statistics: (low, high, its coverage).

    The k-th smallest and k-th largest of n values bracket the true median with probability
    1 - 2 P(Binomial(n, 1/2) < k); k is the largest rank whose coverage is still at least ``level``
    (for n = 11: the 3rd and 9th values, 93 %). Too few values for ``level``: the extremes.
    """
    xs = sorted(values)
    n = len(xs)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=11,
                    help="timed plain/Prefect pairs; the headline's confidence interval narrows with more")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--unfixed-repeat", type=int, default=3,
                    help="extra pairs with Prefect's own code, to show what the fixes in "
                         "orchestration.prefect_compat save (0: skip)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ht-bench-") as tmp:
        # The embedded server `make demo` uses, with its database in this run's directory.
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        os.environ.pop("PREFECT_API_URL", None)
        from prefect import flow, task
        from prefect.server.api.server import SubprocessASGIServer

        from blocks.register import ensure_pseudonym_key, ensure_release_key, release_key_pem
        from flows.lifecycle import lifecycle
        from hybridtrain.workspace import Workspace
        from tasks.data import pseudonym_key

        ws_root = make_workspace(Path(tmp), args.rows)
        ws = Workspace.resolve(ws_root)
        spec_path = ws_root / "jobs" / "churn.yaml"

        @task
        def noop(i: int) -> int:
            return i

        @flow
        def many(n: int) -> int:
            return sum(noop(i) for i in range(n))

        server = SubprocessASGIServer()  # the one Prefect's clients use when no PREFECT_API_URL is set
        server.start(timeout=180)  # a first start creates the database: over 20 s on a busy 2-core VM
        cpu = ServerCpu(server.server_process.pid)
        try:
            ensure_pseudonym_key(ws.pseudonym_key_block)
            key = pseudonym_key(ws.pseudonym_key_block)
            ensure_release_key(ws.release_key_block, ws.release_public_key)
            signing = release_key_pem(ws.release_key_block)
            many(2)  # warm the client and the server
            t = time.perf_counter()
            plain_lifecycle(ws, spec_path, key, signing, "warmup")  # establishes the champion; not timed
            print(f"warm-up lifecycle (plain, untimed): {time.perf_counter() - t:.1f} s")
            t = time.perf_counter()
            # One-time costs of the first flow run in a process (flow and block registration, first
            # task-engine paths) are not per-run overhead: warm the Prefect path up too.
            lifecycle(spec_path="jobs/churn.yaml", workspace=str(ws_root), run_key="warmup-prefect", dispatch="inline")
            print(f"warm-up lifecycle (Prefect, untimed): {time.perf_counter() - t:.1f} s")

            def timed(run: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float], float, float]:
                """Seconds, stage seconds, and the server's CPU seconds until it is quiet again (all, after return)."""
                gc.collect()  # each lifecycle starts from a collected heap, not the previous one's garbage
                cpu.wait_quiet()
                c = cpu.seconds()
                t = time.perf_counter()
                stage_s = run()
                elapsed = time.perf_counter() - t
                returned = cpu.seconds()
                cpu.wait_quiet()
                end = cpu.seconds()
                return elapsed, stage_s, end - c, end - returned

            def plain_run(run_key: str) -> dict[str, float]:
                return plain_lifecycle(ws, spec_path, key, signing, run_key)

            def prefect_run(run_key: str) -> dict[str, float]:
                summary = lifecycle(spec_path="jobs/churn.yaml", workspace=str(ws_root), run_key=run_key,
                                    dispatch="inline")
                return {row.stage: row.seconds for row in summary.stages}

            def pairs(n: int, tag: str) -> dict[str, list[float]]:
                out: dict[str, list[float]] = {k: [] for k in ("plain", "prefect", "outside_plain", "outside_prefect",
                                                               "cpu_plain", "cpu_prefect", "cpu_after_prefect")}
                for i in range(n):
                    # Alternate which goes first: the second of a pair runs in a warmer process (and
                    # after the first one's garbage), which must not favour either side.
                    p_run = functools.partial(plain_run, f"plain-{tag}{i}")
                    f_run = functools.partial(prefect_run, f"prefect-{tag}{i}")
                    if i % 2 == 0:
                        (p_s, plain_stages, p_cpu, _), (f_s, flow_stages, f_cpu, f_after) = timed(p_run), timed(f_run)
                    else:
                        (f_s, flow_stages, f_cpu, f_after), (p_s, plain_stages, p_cpu, _) = timed(f_run), timed(p_run)
                    out["plain"].append(p_s)
                    out["prefect"].append(f_s)
                    out["outside_plain"].append(p_s - sum(plain_stages.values()))
                    out["outside_prefect"].append(f_s - sum(flow_stages.get(k, 0.0) for k in plain_stages))
                    out["cpu_plain"].append(p_cpu)
                    out["cpu_prefect"].append(f_cpu)
                    out["cpu_after_prefect"].append(f_after)
                    print(f"repeat {tag}{i}: plain {p_s:.2f} s, prefect {f_s:.2f} s (server CPU {p_cpu:.2f} / "
                          f"{f_cpu:.2f} s); stage seconds plain/prefect: "
                          + ", ".join(f"{k} {v:.2f}/{flow_stages.get(k, float('nan')):.2f}"
                                      for k, v in plain_stages.items()))
                return out

            res = pairs(args.repeat, "")
            if args.unfixed_repeat:
                # The same pairs with Prefect's own code (flows/prefect_compat.py: a heartbeat that
                # holds the end of each flow run 0-1 s, a TLS context per client): shows what the
                # fixes are worth. Not in the headline.
                with prefect_own_code():
                    old = pairs(args.unfixed_repeat, "unfixed-")

            t = time.perf_counter()
            for i in range(args.tasks):
                noop.fn(i)
            bare = time.perf_counter() - t
            t = time.perf_counter()
            state = many(args.tasks, return_state=True)
            orchestrated = time.perf_counter() - t
            per_task_ms = (orchestrated - bare) / args.tasks * 1000
            # Let the server record those task runs before it is stopped (else it logs cancelled flushes).
            wait_recorded(state.state_details.flow_run_id, args.tasks)
        finally:
            server.stop()

    med = statistics.median
    plain, prefect = res["plain"], res["prefect"]
    ratios = [p / q for p, q in zip(prefect, plain)]
    ratio = med(ratios)
    low, high, cover = median_interval(ratios)
    print(f"rows: {args.rows}, lifecycle plain best {min(plain):.2f} s, prefect best "
          f"{min(prefect):.2f} s (best-of ratio {min(prefect) / min(plain):.3f}); per-pair ratios "
          + ", ".join(f"{r:.3f}" for r in ratios))
    extra = med(res["outside_prefect"]) - med(res["outside_plain"])
    print(f"seconds outside the five stages (median): plain {med(res['outside_plain']):.2f} s, "
          f"prefect {med(res['outside_prefect']):.2f} s (+{extra:.2f} s, {extra / med(plain):.1%} of a plain "
          f"lifecycle); server CPU per lifecycle (median): plain "
          f"{med(res['cpu_plain']):.2f} s, prefect {med(res['cpu_prefect']):.2f} s (of which after the flow returned "
          f"{med(res['cpu_after_prefect']):.2f} s)")
    if args.unfixed_repeat:
        print(f"with Prefect 3.8.8's own code (no orchestration.prefect_compat fixes): median ratio "
              f"{med(p / q for p, q in zip(old['prefect'], old['plain'])):.3f} x, prefect outside the stages "
              f"{med(old['outside_prefect']):.2f} s, server CPU per lifecycle {med(old['cpu_prefect']):.2f} s")
    print(f"per_task_overhead: {per_task_ms:.1f} ms/task over {args.tasks} tasks incl. one flow run "
          f"(target <= 15)")
    print(f"overhead_ratio: {ratio:.3f} x median of {len(plain)} paired runs, {cover:.0%} interval "
          f"{low:.3f}-{high:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
