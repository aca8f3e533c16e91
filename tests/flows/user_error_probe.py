"""Flows for tests/flows/test_user_errors_in_prefect.py: one that fails for a user's mistake, one for a bug.

Run in a process of their own as a worker's flow-run process runs a deployment's flow (``python -m
prefect.flow_engine ENTRYPOINT``). Like every deployment's entrypoint under ``flows/``, importing them imports
the ``flows`` package first, which installs ``orchestration.user_errors``.
"""

from __future__ import annotations

from prefect import flow, task

import flows  # noqa: F401  - as a deployment's entrypoint does: the fixes of flows/__init__ are installed
from hybridtrain.errors import DataError, Problem, SpecError


class Bug(Exception):
    """Not a user error: a programming mistake, whose traceback is what a developer needs."""


@task
def validate_rows(rows: int) -> int:
    if rows < 10:
        raise DataError("data/raw/probe.csv", [Problem("rows", f"{rows} rows; give at least 10")])
    return rows


@flow(name="user-error-probe")
def user_error_probe(steps: int = -5) -> None:
    raise SpecError("parameters", [Problem("steps", f"{steps} is too few; give at least 40 (default 300)")])


@flow(name="task-user-error-probe")
def task_user_error_probe(rows: int = 3) -> int:
    return validate_rows(rows)


@flow(name="bug-probe")
def bug_probe() -> None:
    raise Bug("an index went out of range")
