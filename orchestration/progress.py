"""RunProgress: the core's progress events shown in Prefect — a line in the run log for each, and a
progress artifact for training and sync, updated as they run.

Shell machinery, not a flow: each flow calls ``bind_progress()`` first. The core reports
through the ``hybridtrain.progress`` logger (``hybridtrain.reporting.progress``) and never imports
Prefect; this handler binds that logger to ``get_run_logger()`` of whichever flow or task run is
current when the event is reported, so the lines land in the right run's log in the UI.
"""

from __future__ import annotations

import logging
import threading
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import MissingContextError

from hybridtrain.reporting.progress import LOGGER, MEASURED, ProgressEvent, event_of


class PrefectProgress(logging.Handler):
    """Forwards progress records to the current run's logger; keeps one progress artifact per
    measured stage (``train-progress``, ``sync-progress``) up to date."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.artifacts: dict[tuple[str, str], UUID] = {}  # (flow run, stage) -> its progress artifact

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
        description = f"{event.stage}: {event.message}"
        ctx = FlowRunContext.get()
        key = (str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else "", event.stage)
        artifact = self.artifacts.get(key)
        if artifact is None or event.kind == "start":
            self.artifacts[key] = create_progress_artifact(
                percent, key=f"{event.stage}-progress", description=description)
        else:
            update_progress_artifact(artifact, percent, description=description)


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
