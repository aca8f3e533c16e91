"""User-error log lines: a user's mistake (any ``HybridtrainError``) in a run's Prefect log as one line, no traceback.

Prefect logs the exception that ends a task or flow run with its full traceback: ``Encountered
exception during execution: SpecError('...')`` and, in a process a worker started, a second
``Engine execution exited with unexpected exception`` with the same traceback. For a bad spec, bad data or
a bad parameter — a ``HybridtrainError``, whose message already names what to fix — that is 30-110
lines of noise above the one that matters, in the flow run's log in the UI.

``install()`` wraps ``APILogHandler.emit`` (the handler that ships run logs to the Prefect API, which
the UI shows) so that, for a record that carries a ``HybridtrainError``:

- the first such record of a flow run is sent as one line without the traceback: Prefect's own record
  (``Encountered exception ...: SpecError('...')``, ``Task run failed with exception: ...``) is sent as
  the error's message itself; a record the project wrote keeps its text;
- the later records of the same run about the same error (the engine's second traceback) are not sent;
- a task run's ``Finished in state Failed(...)`` after such an error is sent at INFO, as a flow run's own
  is, so the error's line is the run's only ERROR line about it.

Example, a failover-drill run with ``steps=1000000000000``: its log in the UI has one ERROR entry, the
``SpecError``'s message as ``hybridtrain drill`` would print it (a line, then one per problem)::

    failover-drill: 1 problem found; fix and re-run:
      - steps: 1000000000000 is too many; give at most 10000 (default 300)

then Prefect's ``Finished in state Failed(...)``; no traceback.

Every other record — any other exception (a bug) keeps its traceback — is sent unchanged. Only what goes
to the API changes: the record is copied, never altered, so the console, the CLI's run log file
(``hybridtrain.cli.run_log``, tracebacks included) and any other handler get it whole. How the exception
propagates (the run's Failed state and its message, the exception callers catch) does not change.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import prefect
from prefect.logging.handlers import APILogHandler

from hybridtrain.errors import HybridtrainError

#: Prefect's own ``emit``, kept for ``uninstall()``.
PREFECT_EMIT = getattr(APILogHandler.emit, "__wrapped__", APILogHandler.emit)
_PREFECT_DIR = Path(prefect.__file__).resolve().parent

# Per user error, the flow runs whose log already has its line (weak: an error is forgotten with its run).
_reported: weakref.WeakKeyDictionary[BaseException, set[str]] = weakref.WeakKeyDictionary()
# The task runs that failed for a user error, newest last (only the last few matter: their end comes next).
_failed_tasks: OrderedDict[str, None] = OrderedDict()
_FAILED_TASKS_KEPT = 1024
_reported_lock = threading.Lock()


def user_error(record: logging.LogRecord) -> HybridtrainError | None:
    """The ``HybridtrainError`` a record carries as its ``exc_info``, if any."""
    exc = record.exc_info[1] if record.exc_info else None
    return exc if isinstance(exc, HybridtrainError) else None


def _from_prefect(record: logging.LogRecord) -> bool:
    """Whether Prefect's own code (the engines) wrote the record, rather than a flow or the core."""
    try:
        return Path(record.pathname).resolve().is_relative_to(_PREFECT_DIR)
    except (OSError, ValueError):
        return False


def one_line(record: logging.LogRecord, exc: HybridtrainError) -> logging.LogRecord | None:
    """What the API gets for ``record`` about ``exc``: a copy without the traceback, or None when this run's
    log already has a line about ``exc``. ``record`` itself is not changed (other handlers still need it)."""
    run = getattr(record, "flow_run_id", None)
    task_run = getattr(record, "task_run_id", None)
    with _reported_lock:
        if task_run is not None:
            _failed_tasks[str(task_run)] = None
            while len(_failed_tasks) > _FAILED_TASKS_KEPT:
                _failed_tasks.popitem(last=False)
        if run is not None:
            runs = _reported.setdefault(exc, set())
            if str(run) in runs:
                return None
            runs.add(str(run))
    line = logging.makeLogRecord(record.__dict__)
    line.msg = str(exc) if _from_prefect(record) else record.getMessage()
    line.args = None
    line.exc_info = line.exc_text = line.stack_info = None
    return line


def task_end_after_user_error(record: logging.LogRecord) -> logging.LogRecord | None:
    """For a task run's ``Finished in state Failed(...)`` ERROR record after a user error: a copy at INFO."""
    task_run = getattr(record, "task_run_id", None)
    if (record.levelno < logging.ERROR or task_run is None or not isinstance(record.msg, str)
            or not record.msg.startswith("Finished in state ")):
        return None
    with _reported_lock:
        if str(task_run) not in _failed_tasks:
            return None
    line = logging.makeLogRecord(record.__dict__)
    line.levelno, line.levelname = logging.INFO, logging.getLevelName(logging.INFO)
    return line


def one_line_for_user_errors(emit: Callable[[APILogHandler, logging.LogRecord], None]
                             ) -> Callable[[APILogHandler, logging.LogRecord], None]:
    """Wrap an ``APILogHandler.emit`` so that records about a user error reach it as ``one_line`` makes them."""

    @functools.wraps(emit)
    def emit_user_errors_as_one_line(self: APILogHandler, record: logging.LogRecord) -> None:
        exc = user_error(record)
        if exc is not None:
            line = one_line(record, exc)
            if line is None:
                return
            record = line
        else:
            record = task_end_after_user_error(record) or record
        emit(self, record)

    emit_user_errors_as_one_line.one_line_for_user_errors = True  # type: ignore[attr-defined]
    return emit_user_errors_as_one_line


def install() -> None:
    """Send user errors to the API as one line from now on, in this process (every handler, present and future).

    Idempotent. Importing the ``flows`` package calls it (see there for how a worker's process gets there).
    """
    if not getattr(APILogHandler.emit, "one_line_for_user_errors", False):
        APILogHandler.emit = one_line_for_user_errors(PREFECT_EMIT)  # type: ignore[method-assign]


def uninstall() -> None:
    """Put Prefect's own ``emit`` back."""
    APILogHandler.emit = PREFECT_EMIT  # type: ignore[method-assign]
