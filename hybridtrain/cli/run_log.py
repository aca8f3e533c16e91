"""RunLog: the log file of one CLI run of the lifecycle — everything the flow logs, tracebacks included.

Prefect logs a failed task or flow with its full traceback. For a *user* mistake (a bad spec,
bad data: any ``HybridtrainError``) that traceback is noise above the one line that says what to
fix, so while a ``RunLog`` is open:

- every record, at every level, also goes to ``.hybridtrain/logs/run-<UTC time>.log``;
- the terminal's handlers drop the records that carry a ``HybridtrainError`` and Prefect's
  "Finished in state Failed(...)" lines about one, so the CLI's own ``error: ...`` line is the
  only thing printed about it (it names the log file).

Failures that are not user mistakes (a bug, a crash) still print their traceback on the terminal.
Plain ``logging`` only: this module imports no Prefect.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from hybridtrain.errors import HybridtrainError


def _user_error_classes() -> set[str]:
    seen: set[str] = set()
    todo = [HybridtrainError]
    while todo:
        cls = todo.pop()
        if cls.__name__ not in seen:
            seen.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return seen


class _UserErrorFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__("hybridtrain-user-errors")
        self._names = _user_error_classes()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HybridtrainError):
            return False
        if record.levelno >= logging.ERROR and exc is None:
            text = record.getMessage()
            # "Finished in state Failed('Task run encountered an exception SpecError: ...')" and the like.
            if "Failed(" in text and any(f"{name}:" in text or f"{name}(" in text for name in self._names):
                return False
        return True


def _console_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in sorted(logging.root.manager.loggerDict)
                                       if n == "prefect" or n.startswith("prefect.")]
    found: list[logging.Handler] = []
    for lg in loggers:
        for h in getattr(lg, "handlers", []):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) and h not in found:
                found.append(h)
    return found


class RunLog:
    """Context manager: a log file for everything, the terminal spared user-error tracebacks."""

    def __init__(self, directory: Path, name: str = "run"):
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
        self.path = Path(directory) / f"{name}-{stamp}.log"
        self._file: logging.FileHandler | None = None
        self._filter = _UserErrorFilter()
        self._filtered: list[logging.Handler] = []

    def __enter__(self) -> RunLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = logging.FileHandler(self.path, encoding="utf-8")
        self._file.setLevel(logging.DEBUG)
        self._file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._file)
        for name in ("prefect", "hybridtrain"):
            # Records of these loggers reach the root's handlers; those without propagation get the file too.
            lg = logging.getLogger(name)
            if not lg.propagate:
                lg.addHandler(self._file)
        self._filtered = _console_handlers()
        for h in self._filtered:
            h.addFilter(self._filter)
        return self

    def refresh(self) -> None:
        """Filter console handlers that appeared since ``__enter__`` (Prefect configures logging on first use)."""
        for h in _console_handlers():
            if h not in self._filtered:
                h.addFilter(self._filter)
                self._filtered.append(h)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for h in self._filtered:
            h.removeFilter(self._filter)
        if self._file is not None:
            for lg in (logging.getLogger(), logging.getLogger("prefect"), logging.getLogger("hybridtrain")):
                lg.removeHandler(self._file)
            self._file.close()
