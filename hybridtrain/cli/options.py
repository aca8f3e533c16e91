"""Options: the checks every command makes of its options before it does anything — one line each, exit 2.

- ``OptionError``: an option's value cannot be used; one line naming the option and the fix.
- ``OptionValueError``: the same for a value parsed from a small syntax (``plan --queue SITE=R/Q@H``,
  ``--spot``); it is a ``SpecError`` whose problem is located at the value, for callers that read problems.
- ``checked_workspace``: ``--home`` (or ``HYBRIDTRAIN_HOME``, or the current directory) is a workspace —
  an existing directory with a sites catalog; nothing is created.
- ``job_spec_target``: a ``--pin`` names a job spec that can be rewritten (never a policy or a catalog).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.workspace import Workspace

#: What ``--pin`` takes, for the messages that refuse anything else.
JOB_SPEC = "a job spec (apiVersion: hybridtrain/v1, kind: TrainingJob) such as jobs/churn.yaml"


class OptionError(HybridtrainError):
    """A command-line option's value cannot be used; the message is one line naming the option and the fix."""

    exit_code = 2

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


class OptionValueError(SpecError):
    """An option's value (``--queue``, ``--spot``) that cannot be: one line naming the option, the value and the
    fix (exit 2); a ``SpecError`` whose one problem is located at the value."""

    def __init__(self, option: str, text: str, message: str):
        self.option = option
        self.source, self.problems = option, [Problem(text, message)]
        HybridtrainError.__init__(self, f"{option}: {text!r}: {message}")


def checked_workspace(home: Path | None) -> Workspace:
    """The workspace at ``home`` (or HYBRIDTRAIN_HOME, or the current directory), refused with ``OptionError``
    unless it is an existing directory with a sites catalog (``Workspace.checked``). Creates nothing."""
    try:
        return Workspace.checked(home, name="--home", unset_fix="run from the workspace root or pass --home ROOT")
    except SpecError as exc:
        [problem] = exc.problems
        raise OptionError(problem.path, problem.message) from None


def job_spec_target(ws: Workspace, pin: Path, option: str = "--pin") -> tuple[Path, dict[str, Any]]:
    """The file ``pin`` names (relative to the workspace root) and its data, if it is a job spec that can be
    rewritten; ``OptionError`` (one line: the file, what it is, what ``option`` takes) otherwise."""
    from hybridtrain.specs.config_file import read_yaml
    from hybridtrain.validation import KINDS

    path = pin if pin.is_absolute() else ws.root / pin
    shown = f"{pin}" if pin.is_absolute() else f"{pin} ({path})"
    if not path.exists():
        raise OptionError(option, f"no file {shown}; {option} takes {JOB_SPEC}")
    if path.is_dir():
        raise OptionError(option, f"{shown} is a directory; {option} takes {JOB_SPEC}")
    try:
        data, _ = read_yaml(path)
    except SpecError as exc:
        why = "; ".join(p.message + (f" (line {p.line})" if p.line else "") for p in exc.problems)
        raise OptionError(option, f"{shown}: {why}; {option} takes {JOB_SPEC}") from None
    if not isinstance(data, dict):
        raise OptionError(option, f"{shown} holds a YAML {type(data).__name__}; {option} takes {JOB_SPEC}")
    kind = data.get("kind", "TrainingJob")
    if kind != "TrainingJob":
        what = f"a {kind}" if kind in KINDS else f"kind {kind!r}"
        raise OptionError(option, f"{shown} is {what}; {option} takes {JOB_SPEC}")
    if data.get("apiVersion") != "hybridtrain/v1":
        raise OptionError(option, f"{shown} has no apiVersion: hybridtrain/v1, so it is not a job spec; {option} "
                                  f"takes {JOB_SPEC}")
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        raise OptionError(option, f"{shown} cannot be rewritten (no write permission on it or its folder); "
                                  "fix the permissions or pin a copy")
    return path, data
