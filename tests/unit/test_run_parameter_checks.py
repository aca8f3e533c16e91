"""The checks a run makes of what it was given before it does any work: the run key, the MLflow run a stage reports
to, the pinned dataset (``hybridtrain.cli.preflight``) and the sweep's study storage — each naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridtrain.errors import DataError, DatasetMissing, SpecError
from hybridtrain.workspace import Workspace

# -- run keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "rk-pre", "nightly-2026.12_02", "0b6b3c1e-7f1a-4bb0-9d35-2f4c6a1f0e11",
                                 "a" * 128])
def test_a_run_key_of_the_job_id_characters_passes(key):
    from hybridtrain.stages import check_run_key

    check_run_key(key)


@pytest.mark.parametrize("key", ["../../../tmp/escape", "..", ".", "", "a/b", "-x", ".tmp-x", "a b", "a" * 129])
def test_a_run_key_that_could_leave_its_checkpoint_folder_is_refused_naming_the_parameter(key):
    from hybridtrain.stages import check_run_key

    with pytest.raises(SpecError) as info:
        check_run_key(key)
    [problem] = info.value.problems
    assert problem.path == "run_key"
    assert "is not a run key" in problem.message and "letters, digits, . _ -" in problem.message


def test_a_run_key_is_named_as_the_caller_names_it_and_a_long_one_is_shortened():
    from hybridtrain.stages import check_run_key

    with pytest.raises(SpecError) as info:
        check_run_key("x/" * 5000, field="--run-key")
    [problem] = info.value.problems
    assert problem.path == "--run-key" and "(10000 characters)" in problem.message and len(problem.message) < 300


# -- the MLflow run a stage reports to ------------------------------------------------------------


@pytest.fixture
def ws(workspace) -> Workspace:
    return Workspace.resolve(workspace)


@pytest.mark.parametrize("run_id", ["no-such-run", "../x", "", "  "])
def test_a_stage_for_a_run_that_does_not_exist_is_refused_naming_the_parameter_and_who_starts_it(ws, run_id):
    from hybridtrain.stages import check_run

    with pytest.raises(SpecError) as info:
        check_run(ws, run_id)
    [problem] = info.value.problems
    assert problem.path == "run_id"
    assert "started by training-lifecycle" in problem.message and "run that deployment instead" in problem.message


def test_a_sweep_trial_names_its_parent_run_and_the_sweep(ws):
    from hybridtrain.stages import check_run

    with pytest.raises(SpecError) as info:
        check_run(ws, "no-such-run", "parent_run_id", started_by="hyperparameter-sweep")
    [problem] = info.value.problems
    assert problem.path == "parent_run_id" and "'no-such-run'" in problem.message
    assert "hyperparameter-sweep" in problem.message


def test_an_existing_run_passes_and_a_deleted_one_is_refused(ws):
    from hybridtrain.stages import check_run
    from hybridtrain.tracking.model_registry import Registry

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    run_id = registry.start_run(ws.experiment, run_name="lifecycle", tags={})
    check_run(ws, run_id)
    registry.client.delete_run(run_id)
    with pytest.raises(SpecError) as info:
        check_run(ws, run_id)
    assert "was deleted" in str(info.value)


# -- the pinned dataset -----------------------------------------------------------------------------

DATA = "data/raw/other.csv"
TRACKED, PINNED = "a" * 32, "b" * 32


def job_pinning(ws: Workspace, md5: str, path: str = DATA):
    from hybridtrain.validation import load_job

    job = load_job(ws.root / "jobs" / "churn.yaml", ws.load_sites())
    return job.model_copy(update={"dataset": job.dataset.model_copy(update={"path": path, "md5": md5})})


def track(ws: Workspace, md5: str) -> None:
    """The checkout holds a file and its DVC pointer recording ``md5`` (as `dvc add` leaves them)."""
    ws.path(DATA).parent.mkdir(parents=True, exist_ok=True)
    ws.path(DATA).write_text("id\n1\n")
    ws.path(f"{DATA}.dvc").write_text(f"outs:\n- md5: {md5}\n  size: 5\n  hash: md5\n  path: other.csv\n")


def dvc_object(base: Path, md5: str) -> None:
    obj = base / "files" / "md5" / md5[:2] / md5[2:]
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_text("id\n1\n")


def test_a_pin_the_checkout_tracks_passes(ws):
    from hybridtrain.cli.preflight import check_dataset

    track(ws, PINNED)
    check_dataset(ws, job_pinning(ws, PINNED), ws.load_sites(), "jobs/other.yaml")


def test_a_pin_of_another_version_than_the_checkout_tracks_names_dataset_md5_and_the_md5_to_pin(ws):
    """The prepare-data stage's own words, before a run opens anything (the file is there: the old check passed)."""
    from hybridtrain.cli.preflight import check_dataset

    track(ws, TRACKED)
    with pytest.raises(DataError) as info:
        check_dataset(ws, job_pinning(ws, PINNED), ws.load_sites(), "jobs/other.yaml")
    [problem] = info.value.problems
    assert problem.path == "dataset.md5"
    assert f"pinned version {PINNED} is not in the store of site onprem-dc1" in problem.message
    assert f"set dataset.md5 to {TRACKED}" in problem.message


@pytest.mark.parametrize("where", ["cache", "store"])
def test_a_pinned_version_another_than_the_checkout_s_passes_when_the_cache_or_the_site_store_has_it(ws, where):
    from hybridtrain.cli.preflight import check_dataset

    track(ws, TRACKED)
    sites = ws.load_sites()
    base = ws.root / ".dvc" / "cache" if where == "cache" else Path(sites.get("onprem-dc1").store_url(ws.root)) / "dvc"
    dvc_object(base, PINNED)
    check_dataset(ws, job_pinning(ws, PINNED), sites, "jobs/other.yaml")


def test_a_dataset_that_is_nowhere_is_one_line_with_the_command_that_makes_it(ws):
    from hybridtrain.cli.preflight import SAMPLE_PATH, check_dataset

    with pytest.raises(DatasetMissing) as info:
        check_dataset(ws, job_pinning(ws, PINNED, SAMPLE_PATH), ws.load_sites(), "jobs/churn.yaml")
    assert "\n" not in str(info.value) and "`hybridtrain data generate --pin jobs/churn.yaml`" in str(info.value)
    with pytest.raises(DatasetMissing) as info:  # a spec given as a form has no file to --pin
        check_dataset(ws, job_pinning(ws, PINNED, SAMPLE_PATH), ws.load_sites(), "the spec form")
    assert "--pin" not in str(info.value) and "set dataset.md5 to the md5 it prints" in str(info.value)


# -- the sweep's study storage ---------------------------------------------------------------------


def test_a_storage_that_cannot_be_opened_names_the_setting_the_caller_gave_it_with(tmp_path):
    from hybridtrain.sweeps.study import open_storage

    with pytest.raises(SpecError) as info:
        open_storage("nonsense", "storage")
    [problem] = info.value.problems
    assert problem.path == "storage" and "cannot open the study database nonsense" in problem.message
    assert "--storage" not in problem.message and "\n" not in problem.message
    with pytest.raises(SpecError) as info:  # the CLI's default keeps its flag and variable
        open_storage("nonsense")
    [problem] = info.value.problems
    assert problem.path == "HYBRIDTRAIN_SWEEP_STORAGE" and "(--storage or HYBRIDTRAIN_SWEEP_STORAGE)" in problem.message


def test_a_sqlite_storage_whose_folder_cannot_be_made_is_a_spec_error_not_an_os_error(tmp_path):
    from hybridtrain.sweeps.study import open_storage

    (tmp_path / "file").write_text("")
    with pytest.raises(SpecError) as info:
        open_storage(f"sqlite:///{tmp_path / 'file' / 'sweeps' / 'optuna.db'}", "storage")
    assert info.value.problems[0].path == "storage"


def test_the_storage_field_is_where_the_url_came_from(monkeypatch):
    from hybridtrain.sweeps.study import storage_field

    monkeypatch.delenv("HYBRIDTRAIN_SWEEP_STORAGE", raising=False)
    assert storage_field("nonsense", "storage") == "storage"
    assert storage_field(None, "storage") == "storage"
    monkeypatch.setenv("HYBRIDTRAIN_SWEEP_STORAGE", "postgresql://u:p@db.example/studies")
    assert storage_field(None, "storage") == "HYBRIDTRAIN_SWEEP_STORAGE"
    assert storage_field("", "--storage") == "HYBRIDTRAIN_SWEEP_STORAGE"
    assert storage_field("sqlite:///x.db", "--storage") == "--storage"
