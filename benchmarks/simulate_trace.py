"""Simulator speed: `hybridtrain simulate` on the full pod trace (target <= 10 s).

One comparison = replay the first half of the trace under each tuning setting of our policy,
then replay the second half under every contender (on-prem FIFO, cloud on-demand, threshold
burst at 8 thresholds, greedy spot, ours) plus the lower bound — all through the production
placement engine. Timed end to end, trace loading included.

Run: .venv/bin/python benchmarks/simulate_trace.py [--capacity N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybridtrain.simulation.comparison import run_comparison  # noqa: E402

TARGET_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=None, help="on-prem GPUs (default: demand / 1.1)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    report = run_comparison(args.capacity)
    elapsed = time.perf_counter() - t0
    jobs = report.row("ours").jobs
    print(f"capacity {report.capacity} GPUs, demand {report.demand_ratio:.2f}x, report-half jobs {jobs}, "
          f"contenders {len(report.rows)}, tuning settings {len(report.tuning.grid)}")
    for r in report.rows:
        print(f"  {r.name:16s} {r.seconds:5.2f} s  total ${r.total_usd:,.0f}")
    print(f"simulate_seconds: {elapsed:.1f} s (target <= {TARGET_S:g})")


if __name__ == "__main__":
    main()
