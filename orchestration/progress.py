"""RunProgress: the core's progress events shown in Prefect — a line in the run log for each, and a
progress artifact for training and sync, updated as they run.

Shell machinery, not a flow: each flow calls ``bind_progress()`` first. The core reports
through the ``hybridtrain.progress`` logger (``hybridtrain.reporting.progress``) and never imports
Prefect; this handler binds that logger to ``get_run_logger()`` of whichever flow or task run is
current when the event is reported, so the lines land in the right run's log in the UI.

Reporting never waits for the Prefect API while work goes on: the artifacts' API calls are made by
one sender thread (``ArtifactSender``), which keeps only the latest value per artifact while a call
is in flight. A stage's last event (its end, failure, or 100 %) waits, in its own thread only, until
its artifact holds it (at most ``FINAL_WAIT_S``), so a run that returns shows its final value. The
handler takes no lock of its own around a record: before, one slow API call (a busy embedded
server) held every thread that reported anything — all of a sweep's trials — until it answered.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.exceptions import MissingContextError
from prefect.utilities.context import get_task_and_flow_run_ids

from hybridtrain.reporting.progress import LOGGER, MEASURED, ProgressEvent, event_of

#: How long a stage's last event waits for its artifact to hold it before the stage goes on anyway.
FINAL_WAIT_S = 10.0

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """The newest value for one artifact that the API does not hold yet."""

    percent: float
    description: str
    create: bool  # a new artifact (the stage started again): created, not updated
    flow_run_id: UUID | None
    task_run_id: UUID | None
    seq: int


class ArtifactSender:
    """One thread that sends progress-artifact values to the Prefect API, newest value per artifact.

    ``put`` never blocks on the API: a value waiting behind an earlier one for the same artifact
    replaces it (a creation stays a creation, with the newer value). ``wait_sent`` blocks the
    caller until a given value is sent (or failed), or the timeout passes.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: dict[tuple[str, str], _Pending] = {}  # (flow run, stage) -> newest unsent value
        self.ids: dict[tuple[str, str], UUID] = {}  # (flow run, stage) -> its artifact
        self.seq = 0
        self.sent = 0  # every value with seq <= sent is sent or given up on
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.failures = 0

    def put(self, key: tuple[str, str], percent: float, description: str, create: bool,
            flow_run_id: UUID | None, task_run_id: UUID | None) -> int:
        with self.cond:
            self._ensure_thread()
            self.seq += 1
            before = self.pending.get(key)
            self.pending[key] = _Pending(percent, description, create or (before is not None and before.create),
                                         flow_run_id, task_run_id, self.seq)
            self.cond.notify_all()
            return self.seq

    def wait_sent(self, seq: int, timeout_s: float) -> bool:
        """Wait until the value numbered ``seq`` (and every earlier one) is sent; False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self.sent >= seq, timeout=timeout_s)

    def _ensure_thread(self) -> None:
        if self.pid != os.getpid():  # a forked child: the parent's thread and values are not here
            self.pending.clear()
            self.ids.clear()
            self.thread = None
            self.pid = os.getpid()
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="hybridtrain-progress-artifacts", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.pending))
                batch = dict(self.pending)
                self.pending.clear()
            try:
                with get_client(sync_client=True) as client:
                    for key, value in batch.items():
                        self._send(client, key, value)
            except Exception as exc:  # noqa: BLE001 - progress is best effort: the run goes on
                self._failed(exc)
            with self.cond:
                self.sent = max(v.seq for v in batch.values())  # every later value is still pending
                self.cond.notify_all()

    def _send(self, client, key: tuple[str, str], value: _Pending) -> None:
        try:
            artifact = self.ids.get(key)
            if artifact is None or value.create:
                self.ids[key] = client.create_artifact(artifact=ArtifactCreate(
                    type="progress", key=f"{key[1]}-progress", description=value.description,
                    data=value.percent, flow_run_id=value.flow_run_id, task_run_id=value.task_run_id)).id
            else:
                client.update_artifact(artifact_id=artifact,
                                       artifact=ArtifactUpdate(data=value.percent, description=value.description))
        except Exception as exc:  # noqa: BLE001 - one artifact's call failed: the others still go
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            log.warning("progress artifact not updated (%d so far): %s", self.failures, exc)


class PrefectProgress(logging.Handler):
    """Forwards progress records to the current run's logger; keeps one progress artifact per
    measured stage (``train-progress``, ``sync-progress``) up to date, through an ``ArtifactSender``."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.sender = ArtifactSender()

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler-wide lock: ``emit`` is thread-safe, and a thread waiting for its stage's last
        # value must not hold up the other threads' records.
        rv = self.filter(record)
        if rv:
            self.emit(record)
        return bool(rv)

    def emit(self, record: logging.LogRecord) -> None:
        event = event_of(record)
        if event is None:
            return
        try:
            logger = get_run_logger()
        except MissingContextError:  # reported outside any run (a plain call): nobody to show it to
            return
        logger.log(record.levelno, record.getMessage())
        if event.stage in MEASURED and event.fraction is not None:
            self.update(event)

    def update(self, event: ProgressEvent) -> None:
        percent = round(100.0 * (event.fraction or 0.0), 1)
        task_run_id, flow_run_id = get_task_and_flow_run_ids()
        key = (str(flow_run_id or ""), event.stage)
        seq = self.sender.put(key, percent, f"{event.stage}: {event.message}", event.kind == "start",
                              flow_run_id, task_run_id)
        if event.kind in ("end", "failed") or event.fraction == 1.0:
            self.sender.wait_sent(seq, FINAL_WAIT_S)


_lock = threading.Lock()


def bind_progress() -> None:
    """Show the core's progress events in Prefect from now on, in this process (idempotent).

    A flow calls it first thing: the handler stays on the ``hybridtrain.progress`` logger for the
    life of the process (a worker's flow-run process, or a CLI / test process running flows), and
    reports to whichever run is current when an event happens (none: the event is not shown
    there). Progress records then no longer propagate to the ``hybridtrain`` logger, which
    ``PREFECT_LOGGING_EXTRA_LOGGERS`` may send to the API as well (each line would show twice).
    """
    logger = logging.getLogger(LOGGER)
    with _lock:
        if any(isinstance(h, PrefectProgress) for h in logger.handlers):
            return
        logger.addHandler(PrefectProgress())
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
        logger.propagate = False
