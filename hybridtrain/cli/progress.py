"""ProgressDisplay: the lifecycle's progress events in a terminal — rich progress bars for the measured
stages (sync, training) and one line per event (a sync's byte steps move its bar only), or plain
lines when the output is not a terminal.

The same events the Prefect UI shows (``hybridtrain.reporting.progress``). While the display is
on, the Prefect run loggers' console output is held to warnings, so a line is not printed twice;
the Prefect server (if any) still receives the whole run log.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO

from hybridtrain.reporting.progress import LOGGER, MEASURED, event_of, human_bytes

#: Loggers whose console output would repeat the progress lines (Prefect's run loggers).
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class PlainProgress(logging.Handler):
    """One line per event (``[train] train epoch 2/4 ...``), flushed at once: logs, CI, pipes."""

    def __init__(self, stream: TextIO):
        super().__init__(level=logging.INFO)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        event = event_of(record)
        if event is None:
            return
        self.stream.write(f"[{event.stage}] {record.getMessage()}\n")
        self.stream.flush()


class BarProgress(logging.Handler):
    """A rich progress bar per measured stage, every event's line printed above the bars."""

    def __init__(self, progress: Any):
        super().__init__(level=logging.INFO)
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def emit(self, record: logging.LogRecord) -> None:
        event = event_of(record)
        if event is None:
            return
        # A transfer's byte steps move its bar (whose label says how far) instead of adding lines.
        transfer_step = event.kind == "step" and "bytes" in event.fields
        if not transfer_step:
            self.progress.console.print(f"[dim]{event.stage:>10}[/dim] {record.getMessage()}", markup=True,
                                        highlight=False)
        if event.stage in MEASURED and event.fraction is not None:
            task = self.tasks.get(event.stage)
            if task is None or event.kind == "start":
                task = self.tasks[event.stage] = self.progress.add_task(event.stage, total=100.0)
            label = f"{event.stage} {human_bytes(event.fields['bytes'])}" if transfer_step else event.stage
            self.progress.update(task, completed=100.0 * event.fraction, description=label)


def _quiet_run_loggers(held: ExitStack) -> None:
    for name in RUN_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and handler.level < logging.WARNING:
                held.callback(handler.setLevel, handler.level)
                handler.setLevel(logging.WARNING)


@contextmanager
def shown(console: Any | None = None, stream: TextIO | None = None) -> Iterator[None]:
    """Show progress events while the block runs: bars on a terminal (``console.is_terminal``), plain
    lines on ``stream`` (default stdout) otherwise."""
    logger = logging.getLogger(LOGGER)
    with ExitStack() as held:
        if console is not None and console.is_terminal:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            bars = held.enter_context(Progress(TextColumn("{task.description:>10}"), BarColumn(),
                                               TaskProgressColumn(), TimeElapsedColumn(), console=console,
                                               transient=False))
            handler: logging.Handler = BarProgress(bars)
        else:
            handler = PlainProgress(stream or sys.stdout)
        saved = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        held.callback(logger.setLevel, saved)
        held.callback(logger.removeHandler, handler)
        _quiet_run_loggers(held)
        yield
