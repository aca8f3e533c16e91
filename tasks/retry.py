"""Retry policy: retry what may succeed on a second try (network, locks, lost sites), never user mistakes."""

from __future__ import annotations

from typing import Any

from hybridtrain.errors import is_retryable

# Backoff for transient failures: 2 s, 10 s, 30 s.
BACKOFF_S = [2, 10, 30]


def only_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: a SpecError, DataError or LeakDetected is never retried."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - we only classify the exception, it is re-raised by Prefect
        return is_retryable(exc)
    return False
