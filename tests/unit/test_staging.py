"""Staging: what a killed writer left beside its target is removed by the next write; nothing else is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hybridtrain.datasets.sample_data import write_churn_csv
from hybridtrain.storage import staging

KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from hybridtrain.storage import staging
fd, path = staging.staged_file(Path(sys.argv[1]), suffix=".csv")
os.write(fd, b"half a file")
d = staging.staged_dir(Path(sys.argv[1]), tag=".part")
(d / "x.parquet").write_bytes(b"half")
print(path, d, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writers_leftovers_go_with_the_next_write_and_nobody_elses(tmp_path):
    out = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == -signal.SIGKILL, out.stderr
    left_file, left_dir = (tmp_path / os.path.basename(p) for p in out.stdout.split())
    assert left_file.is_file() and left_dir.is_dir()  # what `kill -9` leaves: nothing unwinds
    other_host = tmp_path / ".tmp-another-host-1-abc.csv"
    mine_live = tmp_path / f".tmp-{staging._host()}-{os.getpid()}-abc.csv"  # a live writer (this test) on this host
    unrelated = tmp_path / ".tmp-notes.csv"
    for p in (other_host, mine_live, unrelated):
        p.write_text("x")

    write_churn_csv(tmp_path / "churn.csv", rows=50)

    assert not left_file.exists()
    assert left_dir.exists()  # another tag: a partitioned write of `part` sweeps it, a CSV write does not
    assert other_host.exists() and mine_live.exists() and unrelated.exists()
    assert (tmp_path / "churn.csv").is_file()
    assert staging.sweep(tmp_path, ".part") == [left_dir] and not left_dir.exists()
