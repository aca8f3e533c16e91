"""A fix for one cost of the pinned Prefect release: the flow-run heartbeat's stall at the end of a run.

Prefect 3.8.8 sends a flow run's heartbeat events (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, default
180 s; zombie-run automations rely on them) from a thread that sleeps in 1-second steps and checks
a stop flag between steps. When a synchronous flow run ends, the engine sets that flag and joins
the thread, so every run ends 0-1 s late (0.5 s on average): 4-6 % of the demo lifecycle, the
largest single Prefect cost in ``benchmarks/orchestration_overhead.py``.

``install()`` swaps the engine's heartbeat context for one that behaves the same way (one event at
the start of the run and one every interval, none once the run is final, same daemon thread and
settings context) but waits on the stop event itself, so the join returns as soon as the run ends.
It applies only to the Prefect versions listed in ``FIXED_VERSIONS``, which were read for this;
on any other version Prefect's own code runs unchanged, and the test that checks the fix is active
fails, so an upgrade gets this module looked at again (drop it once Prefect waits on the event).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import prefect
from prefect import flow_engine

FIXED_VERSIONS = frozenset({"3.8.8"})
THREAD_NAME = "prefect-flow-run-heartbeat"
# Prefect's own version, kept for comparison (benchmarks/orchestration_overhead.py measures both).
PREFECT_SEND_HEARTBEATS = flow_engine._send_heartbeats


@contextmanager
def send_heartbeats(engine: Any, join_on_exit: bool = True) -> Generator[None, None, None]:
    """Prefect 3.8.8's ``flow_engine._send_heartbeats``, waiting on the stop event instead of 1-s sleeps."""
    heartbeat_seconds = engine.heartbeat_seconds
    if heartbeat_seconds is None:
        yield
        return
    heartbeat_seconds = max(heartbeat_seconds, flow_engine.MINIMUM_HEARTBEAT_INTERVAL)
    resource, related = engine._build_heartbeat_event_template()
    stop_event = threading.Event()

    def heartbeat_loop() -> None:
        while not stop_event.is_set():
            run = engine.flow_run
            if run and run.state and run.state.is_final():
                engine.logger.debug("Flow run in terminal state, stopping heartbeat")
                return
            try:
                engine._emit_flow_run_heartbeat(resource, related)
            except Exception:  # as Prefect's: a missed heartbeat must never fail the run
                engine.logger.debug("Failed to emit heartbeat", exc_info=True)
            stop_event.wait(heartbeat_seconds)

    # The thread sees the caller's settings context (API URL), as in Prefect's version.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(heartbeat_loop,), daemon=True, name=THREAD_NAME)
    thread.start()
    engine.logger.debug("Started flow run heartbeat context")
    try:
        yield
    finally:
        stop_event.set()
        if join_on_exit:
            thread.join(timeout=2)
        engine.logger.debug("Stopped flow run heartbeat context")


def install() -> bool:
    """Use ``send_heartbeats`` in Prefect's flow engine if this Prefect is one it was written for.

    Idempotent; returns whether the fix is active.
    """
    if flow_engine._send_heartbeats is send_heartbeats:
        return True
    if prefect.__version__ not in FIXED_VERSIONS:
        return False
    flow_engine._send_heartbeats = send_heartbeats
    return True
