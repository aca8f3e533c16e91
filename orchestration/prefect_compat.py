"""Fixes for two costs of the pinned Prefect release: the flow-run heartbeat's stall, and a TLS context per client.

**Heartbeat stall.** Prefect 3.8.8 sends a flow run's heartbeat events
(``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, default 180 s; zombie-run automations rely on them) from a
thread that sleeps in 1-second steps and checks a stop flag between steps. When a synchronous flow
run ends, the engine sets that flag and joins the thread, so every run ends 0-1 s late (0.5 s on
average): 4-6 % of the demo lifecycle, the largest single Prefect cost in
``benchmarks/orchestration_overhead.py``.

``install()`` swaps the engine's heartbeat context for one that behaves the same way (one event at
the start of the run and one every interval, none once the run is final, same daemon thread and
settings context) but waits on the stop event itself, so the join returns as soon as the run ends.
It applies only to the Prefect versions listed in ``FIXED_VERSIONS``, which were read for this;
on any other version Prefect's own code runs unchanged, and the test that checks the fixes are
active fails, so an upgrade gets this module looked at again (drop each fix once Prefect has its own).

**A TLS context per client.** Every ``PrefectClient`` and ``SyncPrefectClient`` Prefect 3.8.8 creates
builds a new ``ssl.SSLContext`` from certifi's bundle (``PREFECT_API_SSL_CERT_FILE`` when set), even
for an ``http://`` API: 30-45 ms of CPU each on this VM, paid by every flow run (its client context),
every concurrency lease (the slot service's own client), and every CLI call. ``install()`` hands each
new client one shared context per (verify-or-skip, CA file) instead, built the same way; a client
given its own ``verify`` in ``httpx_settings`` keeps it. Prefect's open pull request #19106 (custom
SSL contexts, to reuse one across clients) is the upstream version of this. A CA file changed while
a process runs is read again only by a new process.
"""

from __future__ import annotations

import contextvars
import functools
import ssl
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

import certifi
import prefect
from prefect import flow_engine
from prefect.client import orchestration

FIXED_VERSIONS = frozenset({"3.8.8"})
THREAD_NAME = "prefect-flow-run-heartbeat"
# Prefect's own code, kept for comparison (benchmarks/orchestration_overhead.py measures both) and uninstall().
PREFECT_SEND_HEARTBEATS = flow_engine._send_heartbeats
CLIENT_CLASSES = (orchestration.PrefectClient, orchestration.SyncPrefectClient)
PREFECT_CLIENT_INITS = {cls: cls.__init__ for cls in CLIENT_CLASSES}


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


_contexts: dict[tuple[bool, str], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def shared_ssl_context() -> ssl.SSLContext:
    """The TLS context Prefect 3.8.8 would build for a new client under the current settings, built once."""
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    insecure = bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value())
    cafile = "" if insecure else (PREFECT_API_SSL_CERT_FILE.value() or certifi.where())
    key = (insecure, cafile)
    with _contexts_lock:
        context = _contexts.get(key)
        if context is None:
            if insecure:  # as Prefect: an unverified context when the user turned verification off
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                context = ssl.create_default_context(cafile=cafile)
            _contexts[key] = context
    return context


def sharing_ssl_context(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a Prefect client's ``__init__`` so that a client without its own ``verify`` gets the shared context."""

    @functools.wraps(init)
    def __init__(self: Any, api: Any, *, httpx_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if httpx_settings is None or "verify" not in httpx_settings:
            httpx_settings = {**(httpx_settings or {}), "verify": shared_ssl_context()}
        init(self, api, httpx_settings=httpx_settings, **kwargs)

    __init__.shares_ssl_context = True  # type: ignore[attr-defined]
    return __init__


def install() -> bool:
    """Use ``send_heartbeats`` and the shared TLS context if this Prefect is one they were written for.

    Idempotent; returns whether the fixes are active.
    """
    if prefect.__version__ not in FIXED_VERSIONS:
        return False
    flow_engine._send_heartbeats = send_heartbeats
    for cls in CLIENT_CLASSES:
        if not getattr(cls.__init__, "shares_ssl_context", False):
            cls.__init__ = sharing_ssl_context(PREFECT_CLIENT_INITS[cls])
    return True


def uninstall() -> None:
    """Put Prefect's own code back (the benchmark compares both); ``install()`` applies the fixes again."""
    flow_engine._send_heartbeats = PREFECT_SEND_HEARTBEATS
    for cls, init in PREFECT_CLIENT_INITS.items():
        cls.__init__ = init
