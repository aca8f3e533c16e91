"""JobFile and deadline regimes: a user's job CSV becomes jobs (blanks drawn, bad cells named by line);
tight deadlines are 1.2–3 × the true run time."""

from __future__ import annotations

import pytest

from hybridtrain.errors import DataError
from hybridtrain.simulation.job_file import load_jobs
from hybridtrain.simulation.traces import load_pods
from hybridtrain.simulation.workload import WorkloadParams, jobs_from_pods
from hybridtrain.specs.job import Sensitivity


def test_a_job_file_keeps_what_it_gives_and_draws_the_rest(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("id,arrival_s,gpus,true_hours,declared_hours,job_class,sensitivity,deadline_s\n"
                    "a,0,4,2.5,4,production,internal,36000\n"
                    "b,600,1,0.5,,standard,,none\n")
    a, b = load_jobs(path, WorkloadParams(seed=3))
    assert (a.id, a.gpus, a.true_hours, a.declared_hours, a.job_class, a.sensitivity, a.deadline) == \
        ("a", 4, 2.5, 4.0, "production", Sensitivity.internal, 36000.0)
    assert b.deadline is None and b.declared_hours >= 0.5 and b.sensitivity in Sensitivity
    assert load_jobs(path, WorkloadParams(seed=3)) == [a, b]


def test_bad_cells_are_named_with_their_line(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("id,arrival_s,gpus,true_hours,declared_hours\n"
                    "a,0,1.5,2,\n"
                    "b,10,1,nan,\n"
                    "c,20,1,3,2\n")
    with pytest.raises(DataError) as err:
        load_jobs(path)
    text = str(err.value)
    assert "gpus (line 2): whole GPUs only" in text
    assert "true_hours (line 3)" in text and "declared_hours (line 4): below true_hours" in text
    missing = tmp_path / "cols.csv"
    missing.write_text("id,gpus\nx,1\n")
    with pytest.raises(DataError, match="arrival_s: required column missing"):
        load_jobs(missing)


def test_tight_deadlines_follow_the_true_run_time_and_loose_ones_are_unchanged():
    pods = load_pods()
    loose = jobs_from_pods(pods, WorkloadParams())
    tight = jobs_from_pods(pods, WorkloadParams(deadline_regime="tight"))
    assert [j.id for j in loose] == [j.id for j in tight]
    assert [j.deadline is None for j in loose] == [j.deadline is None for j in tight]
    windows = [(j.deadline - j.arrival) / 3600.0 / j.true_hours for j in tight if j.deadline is not None]
    assert min(windows) >= 1.2 - 1e-9 and max(windows) <= 3.0 + 1e-9
    assert sum(j.deadline < k.deadline for j, k in zip(tight, loose, strict=True) if j.deadline) > 0.9 * len(windows)
