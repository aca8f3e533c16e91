"""Hostile-config validation: time and memory of `validate` on hostile files against the demo spec, in one run.

Each file is validated in a fresh interpreter (``hybridtrain validate FILE``, the CLI's own entry
point) so its peak memory (ru_maxrss) is the command's own; the baseline is the same command on
``jobs/churn.yaml`` measured in this run. Files: an alias bomb (10^12 values if expanded), 200,000
nested brackets, 1 MiB of random bytes, and the demo spec with 50 duplicated keys.

    .venv/bin/python benchmarks/hostile_validate.py [--repeat 3]

Last line: ``hostile_validate: <worst ms> ms, <worst MB> MB (target < 2000 ms, < 200 MB)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import resource, sys, time\n"
    "t0 = time.perf_counter()\n"
    "from hybridtrain.cli.main import main\n"
    "t1 = time.perf_counter()\n"
    "sys.argv = ['hybridtrain', 'validate', sys.argv[1], '--home', sys.argv[2]]\n"
    "code = 0\n"
    "try:\n    main()\nexcept SystemExit as e:\n    code = e.code or 0\n"
    "t2 = time.perf_counter()\n"
    "print('PROBE', code, round((t2 - t1) * 1000, 1), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,"
    " file=sys.__stdout__)\n"
)


def files(tmp: Path) -> dict[str, Path]:
    churn = (ROOT / "jobs" / "churn.yaml").read_text()
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    out = {
        "churn.yaml (baseline)": ROOT / "jobs" / "churn.yaml",
        "alias bomb": tmp / "bomb.yaml",
        "200k-deep nesting": tmp / "deep.yaml",
        "1 MiB random bytes": tmp / "random.yaml",
        "50 duplicate keys": tmp / "dups.yaml",
    }
    out["alias bomb"].write_text("\n".join(bomb) + "\n")
    out["200k-deep nesting"].write_text("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    out["1 MiB random bytes"].write_bytes(os.urandom((1 << 20) - 1))
    out["50 duplicate keys"].write_text(churn + "".join(f"\nmetadata: {{name: dup{i}}}" for i in range(50)) + "\n")
    return out


def probe(path: Path) -> tuple[int, float, int]:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), str(ROOT)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE")), None)
    if line is None:
        raise SystemExit(f"{path}: no result (exit {proc.returncode}): {proc.stderr[-500:]}")
    _, code, ms, mb = line.split()
    return int(code), float(ms), int(mb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, path in files(Path(tmp)).items():
            runs = [probe(path) for _ in range(args.repeat)]
            results[name] = (runs[0][0], statistics.median(r[1] for r in runs), max(r[2] for r in runs))
    base_ms, base_mb = results["churn.yaml (baseline)"][1:]
    print(f"{'file':24} {'exit':>4} {'validate ms':>12} {'x baseline':>10} {'peak MB':>8} {'x baseline':>10}")
    for name, (code, ms, mb) in results.items():
        print(f"{name:24} {code:>4} {ms:>12.1f} {ms / base_ms:>10.2f} {mb:>8} {mb / base_mb:>10.2f}")
    hostile = {k: v for k, v in results.items() if "baseline" not in k}
    worst_ms = max(v[1] for v in hostile.values())
    worst_mb = max(v[2] for v in hostile.values())
    print(f"hostile_validate: {worst_ms:.0f} ms, {worst_mb} MB (target < 2000 ms, < 200 MB)")


if __name__ == "__main__":
    main()
