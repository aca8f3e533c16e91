"""The embedded server's garbage collector runs off its event loop, so a cursor freed by it cannot stall the loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What stalled the embedded Prefect server for 60 s at a time, without Prefect: the "loop" thread holds
# a write lock and must commit; connection b's worker busy-waits for that lock holding b's mutex; the
# loop allocates, and the cyclic collector frees a cursor of b (kept alive by a failed statement's
# traceback), whose reset needs b's mutex.
SCENARIO = textwrap.dedent('''
    import os, sqlite3, sys, tempfile, threading, time
    if sys.argv[1] == "off-the-loop":
        from orchestration.embedded_server import collect_off_the_loop
        collect_off_the_loop()
    db = os.path.join(tempfile.mkdtemp(), "state.db")
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t(x)")
    setup.commit()
    setup.close()
    loop_conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    b = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    loop_conn.execute("BEGIN IMMEDIATE")
    loop_conn.execute("INSERT INTO t VALUES (1)")  # the loop's transaction holds the write lock
    b.execute("PRAGMA busy_timeout = 50")
    cur = b.cursor()
    try:
        cur.execute("INSERT INTO t VALUES (2)")  # database is locked: the cursor keeps its statement
    except sqlite3.OperationalError as exc:
        cycle = {"cursor": cur, "error": exc}
        cycle["self"] = cycle  # garbage only the cyclic collector frees
    del cur, cycle
    b.execute("PRAGMA busy_timeout = 3000")
    outcome = []

    def writer():
        try:
            b.execute("INSERT INTO t VALUES (3)")  # waits for the lock in SQLite, holding b's mutex
            outcome.append("written")
        except sqlite3.OperationalError as exc:
            outcome.append(str(exc))

    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    junk = [[i] for i in range(200_000)]  # the loop's own work: allocations that start a collection
    del junk
    loop_conn.execute("COMMIT")
    waited = time.monotonic() - t0
    w.join()
    print(f"{waited:.3f} {outcome[0]}")
''')


def run(mode: str) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", SCENARIO, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split(maxsplit=1)
    return float(out[0]), out[1].strip()


def test_a_cursor_freed_by_the_collector_stalls_the_loop_unless_it_collects_in_its_own_thread():
    waited, outcome = run("on-the-loop")  # the interpreter's default: what Prefect's server did
    assert waited >= 2.0 and outcome == "database is locked"  # the loop stood still for b's whole wait
    waited, outcome = run("off-the-loop")
    assert waited < 1.0, f"the loop's commit waited {waited:.2f} s"
    assert outcome == "written"  # the commit freed the lock, and the waiting writer went on


def test_collecting_off_the_loop_still_frees_cycles():
    script = textwrap.dedent('''
        import gc, time, weakref
        from orchestration.embedded_server import collect_off_the_loop
        collect_off_the_loop()
        assert not gc.isenabled()
        class Node: pass
        node = Node(); node.self = node
        ref = weakref.ref(node)
        del node
        deadline = time.monotonic() + 30
        while ref() is not None and time.monotonic() < deadline:
            junk = [[i] for i in range(10_000)]  # allocations, as a server makes them
            time.sleep(0.01)
        print("freed" if ref() is None else "kept")
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "freed"
