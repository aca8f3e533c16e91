"""RunProgress: the core's progress events shown in Prefect — a line in the run log for each, and a
progress artifact for training and sync, updated as they run.

Shell machinery, not a flow: flows put ``@shows_progress`` under ``@flow``. The core reports
through the ``hybridtrain.progress`` logger (``hybridtrain.reporting.progress``) and never imports
Prefect; this handler binds that logger to ``get_run_logger()`` of whichever flow or task run is
current when the event is reported, so the lines land in the right run's log in the UI.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.exceptions import MissingContextError

from hybridtrain.reporting.progress import LOGGER, MEASURED, ProgressEvent, event_of

F = TypeVar("F", bound=Callable[..., Any])


class PrefectProgress(logging.Handler):
    """Forwards progress records to the current run's logger; keeps one progress artifact per
    measured stage (``train-progress``, ``sync-progress``) up to date."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.artifacts: dict[str, UUID] = {}

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
        artifact = self.artifacts.get(event.stage)
        if artifact is None or event.kind == "start":
            self.artifacts[event.stage] = create_progress_artifact(
                percent, key=f"{event.stage}-progress", description=description)
        else:
            update_progress_artifact(artifact, percent, description=description)


_bound = threading.local()


def shows_progress(fn: F) -> F:
    """Bind the core's progress logger to Prefect for the duration of ``fn`` (a flow body).

    Nested calls (a stage flow run inline by the lifecycle) share the outer binding. While bound,
    progress records do not also propagate to the ``hybridtrain`` logger, which
    ``PREFECT_LOGGING_EXTRA_LOGGERS`` may send to the API as well (each line would show twice).
    """

    @functools.wraps(fn)
    def bound(*args: Any, **kwargs: Any) -> Any:
        if getattr(_bound, "handler", None) is not None:
            return fn(*args, **kwargs)
        logger = logging.getLogger(LOGGER)
        handler, saved = PrefectProgress(), (logger.level, logger.propagate)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        _bound.handler = handler
        try:
            return fn(*args, **kwargs)
        finally:
            _bound.handler = None
            logger.removeHandler(handler)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]

    return bound  # type: ignore[return-value]
