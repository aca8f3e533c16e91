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

Second, the same SQLite writes fail often: a request whose transaction read first and then writes
after another connection committed gets ``SQLITE_BUSY_SNAPSHOT`` at once (no busy wait), and
Prefect answers 503 with no ``Retry-After``. Its client then sleeps 2, 4, 8, 16 s before retrying
a write that would succeed milliseconds later: in the sweep benchmark, a trial's subflow run was
created 10-30 s after every other trial had ended. With eight clients writing at once, 772 of
1,187 requests were answered 503. So the API's writers now wait in line for each other
(``OneWriterAtATime``), and a request still answered 503 for a locked database (a conflict with
the server's own services) is retried inside the server after a few milliseconds, for up to
``RETRY_FOR_S`` (``RetryLockedRequests``); only then does the client see the 503. The client
would send the same request again on that 503, so retrying it earlier changes when, not what.

``orchestration.session.TetheredServer`` starts the embedded server with this module's
``create_app`` as uvicorn's factory; a served Prefect (``make up``, PostgreSQL) is not affected.
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

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


#: How long the server retries a request answered 503 for a locked database before the client sees it (seconds).
RETRY_FOR_S = 5.0
#: The first and the longest pause between two such retries (seconds); pauses double, with jitter.
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.2


class RetryLockedRequests:
    """ASGI wrapper: an HTTP request the app answers 503 because SQLite was locked runs again, in the server.

    The request's body is read once and replayed to each attempt. An attempt's response is held
    back while it is a 503; when the app then raises an exception Prefect's client may retry on
    (``is_client_retryable_exception``: SQLite busy or locked), the attempt is dropped and the
    request runs again after a short, doubling, jittered pause, for up to ``retry_for_s``. Any other
    response, and the last 503, go to the client unchanged.
    """

    def __init__(self, app: Callable[[Message, Receive, Send], Awaitable[None]], *,
                 retry_for_s: float = RETRY_FOR_S, first_pause_s: float = FIRST_PAUSE_S,
                 max_pause_s: float = MAX_PAUSE_S,
                 retryable: Callable[[BaseException], bool] | None = None) -> None:
        self.app = app
        self.retry_for_s = retry_for_s
        self.first_pause_s = first_pause_s
        self.max_pause_s = max_pause_s
        self.retryable = retryable or _prefect_retryable
        #: Requests answered after at least one retry, and retries made (for tests and diagnosis).
        self.retried_requests = 0
        self.retries = 0

    def __getattr__(self, name: str) -> Any:  # the wrapped app's attributes (``api_app``, ``state``...)
        return getattr(self.app, name)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        deadline = time.monotonic() + self.retry_for_s
        pause = self.first_pause_s
        retried = False
        while True:
            held: list[Message] = []
            may_retry = time.monotonic() < deadline

            async def hold_503(message: Message, held: list[Message] = held, may_retry: bool = may_retry) -> None:
                if held or (may_retry and message["type"] == "http.response.start" and message["status"] == 503):
                    held.append(message)
                else:
                    await send(message)

            try:
                await self.app(dict(scope), _replay(body, receive), hold_503)
            except Exception as exc:
                if not held or not self.retryable(exc):
                    await _flush(held, send)
                    raise
            else:
                await _flush(held, send)
                break
            self.retries += 1
            retried = True
            await asyncio.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, self.max_pause_s)
        if retried:
            self.retried_requests += 1


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect, as the app would see it
    return replay


async def _flush(held: list[Message], send: Send) -> None:
    for message in held:
        await send(message)


def _prefect_retryable(exc: BaseException) -> bool:
    from prefect.server.api.server import is_client_retryable_exception

    return isinstance(exc, Exception) and is_client_retryable_exception(exc)


#: POST endpoints of Prefect's API that only read (filters, counts, pages): they need not wait for a writer.
READ_ONLY_POSTS = ("/filter", "/count", "/paginate", "/history", "/lateness", "/validate")


class OneWriterAtATime:
    """ASGI wrapper: requests that may write (POST, PUT, PATCH, DELETE, except ``READ_ONLY_POSTS``) run one at a time.

    SQLite takes one writer at a time anyway; letting the API's writers race for its lock is what
    makes them fail. In line, they wait their turn (first come, first served) instead of failing
    and retrying, so no writer waits long: with eight clients writing at once, the slowest request
    took 0.44 s in line against 4.7 s when writers raced and retried. Reads, websockets and the
    server's own services are not held; their conflicts are left to ``RetryLockedRequests``.
    """

    def __init__(self, app: Callable[[Message, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self._line = asyncio.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if _may_write(scope):
            async with self._line:
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _may_write(scope: Message) -> bool:
    return (scope["type"] == "http" and scope["method"] not in {"GET", "HEAD", "OPTIONS"}
            and not scope["path"].rstrip("/").endswith(READ_ONLY_POSTS))


def create_app() -> Any:
    """uvicorn's factory for the embedded server: Prefect's ``create_app()``, collecting off the event loop,
    with the API's writers in line (``OneWriterAtATime``) and requests answered 503 for a locked
    database retried in the server (``RetryLockedRequests``)."""
    from prefect.server.api.server import create_app as prefect_create_app

    collect_off_the_loop()
    return RetryLockedRequests(OneWriterAtATime(prefect_create_app()))
