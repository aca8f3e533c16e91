"""The embedded Prefect server's app: Prefect's own, with Python's cyclic garbage collector moved off its event loop.

Why. On the embedded default Prefect's server keeps its state in SQLite, through aiosqlite: one
worker thread per connection, each waiting up to 60 s (Prefect's ``busy_timeout``) for another
connection's write lock, and holding its connection's mutex while it waits. Under concurrent
writes (a sweep's trials) some statements fail with ``database is locked``; the error's traceback
keeps the failed cursor alive in a reference cycle. When the cyclic collector frees that cursor
*on the event loop's thread*, CPython resets its statement, which takes the connection's mutex —
held by that connection's worker, busy-waiting for a write lock that a transaction on the event
loop holds. The loop cannot run that transaction to its commit, so the whole server stands still
until the 60 s wait gives up. Seen in the sweep benchmark as 60-s pauses in every API call
(gdb: the main thread in ``gc_collect_main`` → ``cursor_dealloc`` → ``sqlite3_reset`` →
``pthread_mutex_lock``); reproduced without Prefect in ``tests/unit/test_embedded_server.py``.

What. ``collect_off_the_loop`` turns off automatic collection and collects from a thread of its
own, with the interpreter's thresholds: a collection that has to wait for a connection now waits
in that thread while the loop goes on and commits, which frees the waiting connection at once.

``orchestration.session.TetheredServer`` starts the embedded server with this module's
``create_app`` as uvicorn's factory; a served Prefect (``make up``, PostgreSQL) is not affected.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

#: How often the collector thread looks at the allocation counts (seconds).
POLL_S = 0.05
#: The least time between two full (generation 2) collections (seconds).
FULL_EVERY_S = 10.0

_started = threading.Lock()
_thread: threading.Thread | None = None


def collect_off_the_loop() -> threading.Thread:
    """Disable automatic garbage collection in this process and collect from a daemon thread instead (idempotent)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return _thread
        thresholds = gc.get_threshold()
        gc.disable()
        _thread = threading.Thread(target=_collect, args=(thresholds,), name="gc-off-the-loop", daemon=True)
        _thread.start()
        return _thread


def _collect(thresholds: tuple[int, ...]) -> None:
    t0, t1, t2 = (max(1, t) for t in thresholds[:3])
    last_full = time.monotonic()
    while True:
        time.sleep(POLL_S)
        c0, c1, c2 = gc.get_count()
        if c0 < t0:
            continue
        if c2 >= t2 and time.monotonic() - last_full >= FULL_EVERY_S:
            gc.collect(2)
            last_full = time.monotonic()
        elif c1 >= t1:
            gc.collect(1)
        else:
            gc.collect(0)


def create_app() -> Any:
    """uvicorn's factory for the embedded server: Prefect's ``create_app()``, collecting off the event loop."""
    from prefect.server.api.server import create_app as prefect_create_app

    collect_off_the_loop()
    return prefect_create_app()
