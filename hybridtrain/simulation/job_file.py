"""JobFile: a user's own workload for ``hybridtrain simulate --jobs FILE`` — one CSV row per training job.

Required columns: ``id``, ``arrival_s`` (seconds on any clock), ``gpus`` (whole GPUs ≥ 1),
``true_hours`` (what the run really takes, > 0). Optional columns — an empty cell or a missing
column is drawn by the same seeded rules as the pod trace (``hybridtrain/simulation/workload.py``):
``declared_hours`` (the hard limit, ≥ true_hours), ``job_class`` (a class of the policy),
``sensitivity`` (public / internal / confidential / restricted), ``deadline_s`` (absolute, on the
same clock as ``arrival_s``; ``none`` for no deadline), ``dataset_gb``.

Example::

    id,arrival_s,gpus,true_hours,declared_hours,job_class,sensitivity,deadline_s
    train-a,0,4,2.5,4,production,internal,36000
    train-b,600,1,0.5,,standard,,none
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from hybridtrain.errors import DataError, Problem
from hybridtrain.simulation.workload import JobRecord, SimJob, WorkloadParams, jobs_from_records
from hybridtrain.specs.job import Sensitivity

REQUIRED = ("id", "arrival_s", "gpus", "true_hours")


def _num(row: dict, col: str, line: int, problems: list[Problem], *, positive: bool = False) -> float | None:
    text = (row.get(col) or "").strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or (positive and v <= 0) or v < 0:
        problems.append(Problem(col, f"{text!r} is not a {'positive ' if positive else ''}finite number", line))
        return None
    return v


def load_jobs(path: Path | str, params: WorkloadParams = WorkloadParams()) -> list[SimJob]:
    """The jobs of a job CSV (see the module docstring); ``DataError`` lists every bad cell with its line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), [Problem("--jobs", "file not found; give a CSV with columns "
                                                      + ", ".join(REQUIRED))])
    problems: list[Problem] = []
    records: list[JobRecord] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(str(path), [Problem(c, "required column missing") for c in missing])
        seen: set[str] = set()
        for line, row in enumerate(reader, start=2):
            jid = (row.get("id") or "").strip()
            if not jid or jid in seen:
                problems.append(Problem("id", "empty or repeated", line))
            seen.add(jid)
            arrival = _num(row, "arrival_s", line, problems)
            gpus = _num(row, "gpus", line, problems, positive=True)
            hours = _num(row, "true_hours", line, problems, positive=True)
            declared = _num(row, "declared_hours", line, problems, positive=True)
            gb = _num(row, "dataset_gb", line, problems)
            for col, v in (("arrival_s", arrival), ("gpus", gpus), ("true_hours", hours)):
                if v is None and not any(p.line == line and p.path == col for p in problems):
                    problems.append(Problem(col, "required", line))
            if gpus is not None and gpus != int(gpus):
                problems.append(Problem("gpus", "whole GPUs only", line))
            if declared is not None and hours is not None and declared < hours:
                problems.append(Problem("declared_hours", "below true_hours: a limit is never under-asked", line))
            deadline_text = (row.get("deadline_s") or "").strip().lower()
            deadline, has = None, None
            if deadline_text == "none":
                has = False
            elif deadline_text:
                deadline = _num(row, "deadline_s", line, problems)
                has = True if deadline is not None else None
                if deadline is not None and arrival is not None and deadline <= arrival:
                    problems.append(Problem("deadline_s", "not after arrival_s", line))
            sens_text = (row.get("sensitivity") or "").strip()
            sens = None
            if sens_text:
                try:
                    sens = Sensitivity(sens_text)
                except ValueError:
                    problems.append(Problem("sensitivity", f"{sens_text!r}: one of "
                                            + ", ".join(s.value for s in Sensitivity), line))
            job_class = (row.get("job_class") or "").strip() or "standard"
            if arrival is None or gpus is None or hours is None:
                continue
            records.append(JobRecord(jid, arrival, int(gpus), hours, job_class, declared, sens, deadline, has, gb))
    if not problems and not records:
        problems.append(Problem("", "no jobs in the file"))
    if problems:
        raise DataError(str(path), problems[:20])
    return jobs_from_records(records, params)
