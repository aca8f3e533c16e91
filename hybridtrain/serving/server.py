"""ModelServer: one release target's model served over HTTP, following the target's ``current`` pointer.

Only verified bundles are served. To load a version the server copies its bundle from the
target into a local cache (``<cache>/<model>/<version>-<manifest sha>``), checks it with
``ModelBundle.verify`` under the public key *it* trusts and against the target's release
marker, and only then loads ``weights/`` as the MLflow pyfunc (``RecordModel``). A bundle that
fails is refused — at start the server exits with ``BundleRejected``; later, the version it
served stays, the refusal is in ``/version`` and in the audit log.

Switching without dropping requests: a watcher thread polls the target's ``current`` and
``canary`` pointers every ``poll_s`` seconds. A new version is loaded *beside* the old one,
then one attribute (the ``Routing``: current version, optional canary and its share) is
replaced; Python assigns references atomically, so a request in flight finishes on the
version it started with and the next one sees the new routing. Rollback is the same move
(the pointer goes back; the old version loads from the cache).

What it serves is reported three ways: ``GET /version``; a ``serve`` audit record per switch
or refusal; and a status object on the target, ``serving/<model>/<site>-<server id>.json``
(site, url, version, since), so the target says which site serves what.

HTTP (the MLflow scoring protocol): ``POST /invocations`` with ``{"dataframe_records": [...]}``
or ``{"dataframe_split": {...}}`` (or CSV) → ``{"predictions": [p, ...], "version": "3"}``;
bad records → 400 ``{"error_code", "message"}``; ``GET /ping``; ``GET /version``.

The MLflow model stays the artifact of record: each version is loaded once with
``mlflow.pyfunc.load_model``. Records bodies then take a hot path (``create_app``): a validator
compiled from that version's MLflow input schema (``request.RecordReader``) and the
``RecordScorer`` inside the pyfunc, which featurizes straight to a tensor — about 2 ms of server
CPU per single-record request instead of ~12 ms through pandas and MLflow's schema enforcement.
Other request forms go through MLflow's parser and ``predict``, with the same scores.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request  # at module level: the app's endpoint annotations are resolved from these globals

from hybridtrain.errors import BundleRejected, HybridtrainError, Problem
from hybridtrain.governance.bundle import WEIGHTS_DIR, ModelBundle
from hybridtrain.serving import canary as canary_mod
from hybridtrain.serving.canary import CanaryPlan, LiveStats
from hybridtrain.serving.request import RECORDS_KEY, BadRecords, RecordReader

log = logging.getLogger(__name__)
RETRY_REFUSED_S = 30.0
KEEP_ALIVE_S = 30
GRACEFUL_S = 10  # at shutdown, how long requests in flight get to finish


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class ServedVersion:
    """One loaded, verified version."""

    version: str
    manifest_sha256: str
    model: Any  # mlflow.pyfunc.PyFuncModel
    loaded_at: str
    stats: LiveStats
    scorer: Any = None  # the RecordModel's RecordScorer: the hot path, when the version is a RecordModel
    reader: RecordReader | None = None  # compiled from this version's input schema


@dataclass(frozen=True)
class Routing:
    """What requests go to: replaced as a whole, never mutated."""

    current: ServedVersion
    canary: ServedVersion | None = None
    plan: CanaryPlan | None = None


class BundleLoader:
    """Fetch → verify → load, with a local cache of verified copies."""

    def __init__(self, target: Any, trusted_key: Any, cache_dir: Path):
        self.target = target
        self.trusted_key = trusted_key
        self.cache_dir = Path(cache_dir)

    def load(self, model: str, version: str) -> ServedVersion:
        import mlflow.pyfunc

        marker = self.target.marker(model, version)
        if marker is None:
            raise BundleRejected(f"{self.target.name}:{model}/{version}",
                                 [Problem("released marker", f"target {self.target.name} does not hold v{version}")])
        dest = self.cache_dir / model / f"{version}-{marker.manifest_sha256[:16]}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=".tmp-fetch-", dir=dest.parent))
            try:
                self.target.fetch(model, version, stage / "bundle")
                os.rename(stage / "bundle", dest)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
        # Verified every time it is loaded, cache or not: the cache is a directory anyone on the host can edit.
        bundle = ModelBundle(dest)
        try:
            bundle.verify(self.trusted_key)
            if bundle.manifest_sha256 != marker.manifest_sha256:
                raise BundleRejected(str(dest), [Problem("manifest.json", "differs from the one the target's release "
                                                                          "marker records")])
        except BundleRejected:
            shutil.rmtree(dest, ignore_errors=True)  # refetch next time rather than trust a changed copy
            raise
        pyfunc = mlflow.pyfunc.load_model(str(dest / WEIGHTS_DIR))
        scorer, reader = hot_path(pyfunc)
        example = pyfunc.input_example
        if example is not None:
            pyfunc.predict(example)  # warm up (first-call allocations) before it takes live requests
            if reader is not None:
                reader.read(json.dumps({RECORDS_KEY: json.loads(example.to_json(orient="records"))}))
        return ServedVersion(version, marker.manifest_sha256, pyfunc, _now(), LiveStats(), scorer, reader)


def hot_path(pyfunc: Any) -> tuple[Any, RecordReader | None]:
    """(RecordScorer, RecordReader) of a loaded pyfunc when it is a ``RecordModel`` with a column schema, else
    (None, None): such a version is served through MLflow's ``predict`` alone."""
    from mlflow.exceptions import MlflowException

    from hybridtrain.training.record_model import RecordModel

    try:
        python_model = pyfunc.unwrap_python_model()
    except MlflowException:  # not a PythonModel flavor
        return None, None
    schema = pyfunc.metadata.get_input_schema()
    if not isinstance(python_model, RecordModel) or schema is None or not schema.has_input_names():
        return None, None
    return python_model.scorer, RecordReader(schema)


class ModelServer:
    """Serves ``model`` from ``target``: routing, the watcher, canary judging and the records of what is served."""

    def __init__(self, *, target: Any, model: str, trusted_key: Any, cache_dir: Path, audit: Any, site: str,
                 poll_s: float = 2.0, actor: str | None = None):
        self.target = target
        self.model = model
        self.site = site
        self.audit = audit
        self.poll_s = poll_s
        self.server_id = uuid.uuid4().hex[:8]
        self.actor = actor or f"serve:{site}:{socket.gethostname()}:{self.server_id}"
        self.loader = BundleLoader(target, trusted_key, cache_dir)
        self.url: str | None = None
        self.routing: Routing | None = None
        self.refused: dict[str, Any] | None = None
        self._counter = itertools.count()
        self._stop = threading.Event()
        self._refresh_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._judge_blocked: tuple[str, float] | None = None  # why a verdict could not be carried out, and when
        self._input_schema: Any = None

    # -- versions ----------------------------------------------------------------------------

    def _get(self, version: str) -> ServedVersion:
        r = self.routing
        for sv in (r.current, r.canary) if r else ():
            if sv is not None and sv.version == version:
                return sv
        return self.loader.load(self.model, version)

    def start(self) -> ServedVersion:
        """Load the version the target's ``current`` names; raises ``BundleRejected`` if it does not verify."""
        version = self.target.current(self.model)
        if version is None:
            raise BundleRejected(f"{self.target.name}:{self.model}",
                                 [Problem("current", f"target {self.target.name} serves no version of {self.model} "
                                                     "yet; promote or release one first")])
        try:
            sv = self.loader.load(self.model, version)
        except BundleRejected as exc:
            self._record_refusal(version, exc)
            raise
        self.routing = Routing(sv)
        self._input_schema = sv.model.metadata.get_input_schema()
        self._record_switch(None, sv)
        self.refresh()  # a canary already running on this target
        return sv

    def refresh(self) -> bool:
        """Follow the target's pointers once; True when the routing changed."""
        with self._refresh_lock:
            old = self.routing
            want = self.target.current(self.model)
            plan = canary_mod.plan_of(self.target, self.model)
            if want is None or old is None:
                return False
            if self._recently_refused(want):
                want = old.current.version
            try:
                current = self._get(want)
            except BundleRejected as exc:
                self._record_refusal(want, exc)
                return False
            canary = None
            if plan is not None and self._recently_refused(plan.version):
                plan = None
            if plan is not None and plan.version != want:
                try:
                    canary = self._get(plan.version)
                except BundleRejected as exc:
                    self._record_refusal(plan.version, exc)
                    plan = None
            else:
                plan = None
            if (current.version, canary.version if canary else None) == (
                    old.current.version, old.canary.version if old.canary else None):
                return False
            starting = canary is not None and (old.canary is None or old.canary.version != canary.version)
            if starting:  # judged on the same traffic: both windows start with the canary, not before it
                current.stats.reset()
                canary.stats.reset()
            # Loaded beside the old routing; this one assignment is the switch.
            self.routing = Routing(current, canary, plan)
            if current.version != old.current.version:
                self._input_schema = current.model.metadata.get_input_schema()
                self._record_switch(old.current, current)
            if starting:
                self._record_canary_routing(current, canary, plan)
            return True

    def _recently_refused(self, version: str) -> bool:
        """A version refused less than ``RETRY_REFUSED_S`` ago is not fetched again on every poll."""
        r = self.refused
        return bool(r and r["version"] == version and time.monotonic() - r["t"] < RETRY_REFUSED_S)

    # -- requests ----------------------------------------------------------------------------

    @property
    def input_schema(self) -> Any:
        return self._input_schema

    def route(self) -> tuple[ServedVersion, Routing]:
        r = self.routing
        if r is None:
            raise RuntimeError("the server has not loaded a model yet; call start()")
        if r.canary is not None and r.plan is not None:
            # Deterministic split: of every 1000 requests, share*1000 go to the canary, spread evenly.
            n = next(self._counter)
            if int((n + 1) * r.plan.share) != int(n * r.plan.share):
                return r.canary, r
        return r.current, r

    def predict(self, frame: Any) -> tuple[Any, str]:
        """Scores of ``frame`` and the version that made them; raises the model's MlflowException on bad records."""
        return self._scored(lambda sv: sv.model.predict(frame))

    def score_body(self, body: bytes) -> tuple[Any, str] | None:
        """Scores of a ``dataframe_records`` body by the hot path (``RecordReader`` -> ``RecordScorer``) and the
        version that made them; ``None`` when the body or the routed version needs MLflow's parser (``predict``).
        Bad records raise ``BadRecords`` or the model's MlflowException."""
        sv, routing = self.route()
        if sv.reader is None:
            return None
        started = time.perf_counter()
        try:
            columns = sv.reader.read(body)
        except BadRecords:
            sv.stats.record((time.perf_counter() - started) * 1000, False)
            raise
        if columns is None:
            return None
        return self._scored(lambda v: v.scorer.score_columns(columns.values, columns.rows), (sv, routing), started)

    def _scored(self, score: Any, routed: tuple[ServedVersion, Routing] | None = None,
                started: float | None = None) -> tuple[Any, str]:
        from mlflow.exceptions import MlflowException

        sv, routing = routed or self.route()
        started = started if started is not None else time.perf_counter()
        try:
            scores = score(sv)
        except MlflowException:
            sv.stats.record((time.perf_counter() - started) * 1000, False)  # the client's mistake, not the model's
            raise
        except Exception:
            sv.stats.record((time.perf_counter() - started) * 1000, True)
            raise
        sv.stats.record((time.perf_counter() - started) * 1000, False, scores)
        if routing.canary is not None:
            self._maybe_judge(routing)
        return scores, sv.version

    def _maybe_judge(self, routing: Routing) -> None:
        assert routing.plan is not None and routing.canary is not None
        verdict = canary_mod.judge(routing.plan, routing.current.stats.snapshot(), routing.canary.stats.snapshot())
        if verdict.decision == "wait":
            return
        blocked = self._judge_blocked
        if blocked is not None and time.monotonic() - blocked[1] < self.poll_s:
            return  # tried a moment ago: the request path does not retry on every call
        if not self._refresh_lock.acquire(blocking=False):
            return
        try:
            if self.routing is not routing:
                return
            canary_mod.conclude(self.target, self.audit, routing.plan, verdict, actor=self.actor)
        except HybridtrainError as exc:  # e.g. the audit log cannot take the record: nothing moved; keep the canary
            if blocked is None or blocked[0] != str(exc):
                log.error("%s: canary v%s not %s: %s; the canary keeps running until it can be recorded", self.model,
                          routing.plan.version, "promoted" if verdict.decision == "promote" else "rolled back", exc)
            self._judge_blocked = (str(exc), time.monotonic())
            return
        finally:
            self._refresh_lock.release()
        self._judge_blocked = None
        self.refresh()

    # -- records -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        r = self.routing
        out: dict[str, Any] = {"model": self.model, "target": self.target.name, "site": self.site,
                               "server_id": self.server_id, "url": self.url,
                               "version": r.current.version if r else None,
                               "manifest_sha256": r.current.manifest_sha256 if r else None,
                               "since": r.current.loaded_at if r else None, "canary": None,
                               "refused": {k: v for k, v in self.refused.items() if k != "t"} if self.refused else None}
        if r is not None and r.canary is not None and r.plan is not None:
            out["canary"] = {"version": r.canary.version, "share": r.plan.share,
                             "requests": {"current": r.current.stats.snapshot()["requests"],
                                          "canary": r.canary.stats.snapshot()["requests"]}}
        return out

    def _status_key(self) -> str:
        return f"serving/{self.model}/{self.site}-{self.server_id}.json"

    def _publish_status(self) -> None:
        self.target.meta.put_bytes(self._status_key(), json.dumps(self.status(), sort_keys=True).encode())

    def _record_switch(self, old: ServedVersion | None, new: ServedVersion) -> None:
        self.refused = None
        self._publish_status()
        outcome = (f"serving v{new.version} at {self.site}" if old is None
                   else f"switched v{old.version} -> v{new.version} at {self.site}")
        self.audit.append(actor=self.actor, action="serve", subject=f"model {self.model} v{new.version}",
                          inputs={"target": self.target.name, "site": self.site, "url": self.url,
                                  "manifest_sha256": new.manifest_sha256,
                                  "previous": old.version if old else None}, outcome=outcome)
        log.info("%s: %s", self.model, outcome)

    def _record_canary_routing(self, current: ServedVersion, canary: ServedVersion, plan: CanaryPlan) -> None:
        self._publish_status()
        self.audit.append(actor=self.actor, action="serve", subject=f"model {self.model} v{canary.version}",
                          inputs={"target": self.target.name, "site": self.site, "share": plan.share,
                                  "current": current.version},
                          outcome=f"routing {plan.share:.0%} of requests to canary v{canary.version} at {self.site}")

    def _record_refusal(self, version: str, exc: BundleRejected) -> None:
        problems = [str(p) for p in exc.problems]
        again = bool(self.refused and self.refused["version"] == version and self.refused["problems"] == problems)
        self.refused = {"version": version, "problems": problems, "at": _now(), "t": time.monotonic()}
        if again:
            return  # already recorded; retried every RETRY_REFUSED_S while the pointer names it
        kept = self.routing.current.version if self.routing else None
        self.audit.append(actor=self.actor, action="serve", subject=f"model {self.model} v{version}",
                          inputs={"target": self.target.name, "site": self.site, "problems": problems},
                          outcome=f"refused: bundle does not verify; still serving "
                                  f"{'v' + kept if kept else 'nothing'}")
        if kept is not None:  # at start the refusal is the command's error, not a log line
            log.error("%s v%s refused: %s", self.model, version, "; ".join(problems))

    # -- watcher -----------------------------------------------------------------------------

    def watch(self) -> None:
        """Start the background thread that follows the pointers."""
        def loop() -> None:
            said = None  # a problem is logged when it starts or changes, not at every poll
            while not self._stop.wait(self.poll_s):
                try:
                    self.refresh()
                    said = None
                except OSError as exc:  # the target's store is unreachable: keep serving what we have
                    if str(exc) != said:
                        log.warning("%s: could not read target %s (%s); still serving", self.model, self.target.name,
                                    exc)
                    said = str(exc)
                except HybridtrainError as exc:  # a pointer there is unreadable: the same, and say which
                    if str(exc) != said:
                        log.warning("%s; still serving", exc)
                    said = str(exc)

        self._watcher = threading.Thread(target=loop, name="hybridtrain-serve-watcher", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=self.poll_s + 5)
        try:
            self.target.meta.delete(self._status_key())
        except OSError as exc:
            log.warning("could not remove the serving status %s: %s", self._status_key(), exc)


def create_app(server: ModelServer) -> Any:
    """The ASGI app around ``server`` (MLflow's scoring protocol plus ``/version``).

    ``POST /invocations`` with a JSON ``dataframe_records`` body is answered by a plain ASGI
    function: body -> ``RecordReader`` -> ``RecordScorer`` -> JSON, on the event loop for small
    requests (a few hundred microseconds; a hop to a thread and back costs more than that on a
    busy host) and in a thread for large ones. Everything else (CSV, ``dataframe_split``,
    ``/ping``, ``/version``) goes to the FastAPI app, through MLflow's parser and ``predict``.
    """
    api = _fastapi_app(server)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope["path"] != "/invocations" or scope["method"] != "POST"
                or _content_type(scope) != b"application/json"):
            await api(scope, receive, send)
            return
        body = await _read_body(receive)
        try:
            small = len(body) <= INLINE_BODY_BYTES
            answer = server.score_body(body) if small else await _in_thread(server.score_body, body)
        except BadRecords as exc:
            await _send_json(send, 400, {"error_code": "BAD_REQUEST", "message": str(exc)}, _version_header(server))
            return
        except Exception as exc:  # only MLflow's own error is the client's; the rest propagate
            from mlflow.exceptions import MlflowException

            if not isinstance(exc, MlflowException):
                raise
            await _send_json(send, exc.get_http_status_code(), {"error_code": exc.error_code,
                                                                 "message": exc.message}, _version_header(server))
            return
        if answer is None:  # another request form, or a version without the hot path: MLflow's route
            await api(scope, _replay(body), send)
            return
        scores, served = answer
        await _send_json(send, 200, {"predictions": scores.tolist(), "version": served},
                         {"X-Model-Version": served})

    return app


INLINE_BODY_BYTES = 64 * 1024  # about 150 records: scored on the event loop


def _content_type(scope: dict[str, Any]) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower()
    return b""


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


async def _send_json(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *((k.lower().encode(), v.encode()) for k, v in headers.items())]})
    await send({"type": "http.response.body", "body": body})


def _fastapi_app(server: ModelServer) -> Any:
    """``/ping``, ``/version`` and the requests the hot path hands over (MLflow's parser and ``predict``)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import BAD_REQUEST
    from mlflow.pyfunc.scoring_server import infer_and_parse_data, parse_csv_input

    app = FastAPI(title=f"hybridtrain serve {server.model}")

    def error(exc: MlflowException) -> Response:
        return JSONResponse({"error_code": exc.error_code, "message": exc.message},
                            status_code=exc.get_http_status_code(), headers=_version_header(server))

    @app.get("/ping")
    def ping() -> Response:
        return Response("\n", status_code=200 if server.routing else 503, media_type="application/json")

    @app.get("/version")
    def version() -> dict[str, Any]:
        return server.status()

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        body = await request.body()
        ctype = (request.headers.get("content-type") or "").split(";")[0].strip()
        try:
            if ctype == "text/csv":
                import io

                frame = parse_csv_input(io.StringIO(body.decode("utf-8")), schema=server.input_schema)
            elif ctype == "application/json":
                try:
                    data = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise MlflowException(f"the body is not JSON ({exc})", error_code=BAD_REQUEST) from None
                if not isinstance(data, dict):
                    raise MlflowException('send {"dataframe_records": [{column: value, ...}]}',
                                          error_code=BAD_REQUEST)
                frame = infer_and_parse_data(data, server.input_schema)
            else:
                return JSONResponse({"error_code": "BAD_REQUEST",
                                     "message": f"content type {ctype or 'none'} is not supported; use "
                                                "application/json or text/csv"}, status_code=415)
            scores, served = await _in_thread(server.predict, frame)
        except MlflowException as exc:
            return error(exc)
        return JSONResponse({"predictions": [float(s) for s in scores], "version": served},
                            headers={"X-Model-Version": served})

    return app


def _version_header(server: ModelServer) -> dict[str, str]:
    r = server.routing
    return {"X-Model-Version": r.current.version} if r else {}


async def _in_thread(fn: Any, *args: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(fn, *args)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one, read back from the socket).

    Made with ``proto=IPPROTO_TCP`` and ``TCP_NODELAY``: asyncio turns Nagle's algorithm off only
    on connections whose socket names that protocol (an accepted socket inherits the listener's
    ``proto`` 0 otherwise), and with Nagle on, a response written as headers then body waits for
    the client's delayed ACK — about 40 ms on every keep-alive request.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections (Linux)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()  # a refused bind leaves no open socket behind (a worker runs many flow runs)
        raise
    return sock


class Terminated(BaseException):
    """SIGTERM arrived (``kill``, a supervisor stopping the process). Raised in the main thread so that ``finally``
    blocks run — the server stops its watcher and removes its status from the target — before the process exits
    with ``exit_code`` (128 + SIGTERM, as a shell reports a death by that signal). A ``BaseException``, like
    ``KeyboardInterrupt``: no ``except Exception`` on the way may swallow it."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within: SIGTERM raises ``Terminated`` in the main thread instead of killing the process on the spot
    (a no-op outside the main thread, where signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(server: ModelServer, sock: socket.socket, threads: int = 1, handle_signals: bool = True) -> None:
    """Serve HTTP on ``sock`` until interrupted (SIGINT/SIGTERM), then stop the watcher and remove the status.

    ``threads``: torch's intra-op threads (scoring runs under ``torch.inference_mode``). One is fastest for this
    network's requests (a 1,000-record batch is ~0.4 ms of arithmetic); more only adds thread wake-ups to every
    request. ``handle_signals=False`` leaves SIGTERM/SIGINT to the process's own handlers: inside a Prefect flow
    run, Prefect's handler must stay installed, or a cancel from the worker is not acknowledged and the run ends
    Crashed instead of Cancelled. With ``handle_signals``, SIGTERM raises ``Terminated`` (``sigterm_unwinds``)
    and SIGINT ``KeyboardInterrupt``.

    The event loop runs in a thread of its own; this (main) thread only waits for it. A signal handler's
    exception is raised here, then, not inside the loop — where uvloop runs Python signal handlers in a callback
    and only logs what they raise, and uvicorn answers an exception inside a request with a 500 and carries on.
    So any signal that raises — ``Terminated``, ``KeyboardInterrupt``, Prefect's ``TerminationSignal`` on a
    cancel — ends the same way: uvicorn shuts down gracefully (requests in flight finish, up to ``GRACEFUL_S``),
    the status is removed from the target, and the exception goes on to the caller.
    """
    import torch
    import uvicorn

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    host, port = sock.getsockname()[:2]
    server.url = server.url or f"http://{host}:{port}"
    # Keep-alive for clients that reuse connections; no lifespan, Server or Date header work per request.
    config = uvicorn.Config(create_app(server), log_level="warning", access_log=False, lifespan="off",
                            server_header=False, date_header=False, timeout_keep_alive=KEEP_ALIVE_S,
                            timeout_graceful_shutdown=GRACEFUL_S)
    http = uvicorn.Server(config)  # outside the main thread it installs no signal handlers of its own
    failed: list[BaseException] = []
    done = threading.Event()

    def serve_http() -> None:
        try:
            http.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            failed.append(exc)
        finally:
            done.set()

    # Waited for with an Event, not Thread.join: a join that a signal's exception interrupts marks the thread
    # stopped while it still runs (CPython 3.11), and an event loop still running as the interpreter exits crashes.
    loop_thread = threading.Thread(target=serve_http, name="hybridtrain-serve-http", daemon=True)
    with sigterm_unwinds() if handle_signals else contextlib.nullcontext():
        try:
            server._publish_status()
            gc.freeze()  # the loaded models and modules: out of every later collection's scan
            server.watch()
            loop_thread.start()
            while not done.wait(timeout=1.0):  # a signal's handler runs (and raises) here
                pass
        finally:
            try:
                http.should_exit = True  # graceful: requests in flight finish
                if loop_thread.ident is not None:
                    done.wait(timeout=GRACEFUL_S + 5)
            finally:
                server.stop()
    if failed:
        raise failed[0]
