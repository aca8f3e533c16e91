"""Sweep core: the sweep section's validation, the search space, the Optuna study on real storage, pruning, the plan."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from hybridtrain.errors import SpecError
from hybridtrain.specs.job import HIGHER_IS_BETTER, json_schema, load_spec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.specs.sweep import OBJECTIVE_METRICS, SweepSpec
from tests.fixtures.workspaces import ROOT

SPEC = ROOT / "jobs" / "churn-sweep.yaml"


def write(tmp_path: Path, **sweep_changes) -> Path:
    data = yaml.safe_load(SPEC.read_text())
    data["sweep"].update(sweep_changes)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problems(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))
    return str(info.value)


def test_the_example_sweep_spec_is_valid_and_in_the_schema():
    spec = load_spec(SPEC, SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))
    assert spec.sweep is not None and spec.sweep.n_trials == 16 and spec.sweep.job_class == "opportunistic"
    assert spec.sweep.objective.resolved_direction == "maximize"
    schema = json_schema()
    assert "sweep" in schema["properties"] and "SweepSpec" in schema["$defs"]
    assert {"tpe", "median"} <= {schema["$defs"]["SamplerSpec"]["properties"]["name"]["default"],
                                 schema["$defs"]["PrunerSpec"]["properties"]["name"]["default"]}


def test_objective_metrics_are_the_ones_the_trainer_reports():
    assert set(OBJECTIVE_METRICS) == {"train_loss", *(f"val_{m}" for m in HIGHER_IS_BETTER)}
    assert SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0, "high": 0.5}},
                                     "objective": {"metric": "val_log_loss"}}).objective.resolved_direction == "minimize"


def test_a_spec_without_a_sweep_keeps_its_hash():
    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    assert "sweep" not in spec.to_dict()


@pytest.mark.parametrize("parameters, expected", [
    ({"momentum": {"type": "float", "low": 0.1, "high": 0.9}}, "unknown parameter 'momentum'; sweep one of learning_rate"),
    ({"learning_rate": {"type": "float", "low": 0, "high": 0.1, "log": True}}, "log: true needs low > 0"),
    ({"dropout": {"type": "categorical"}}, "needs choices"),
    ({"dropout": {"type": "float", "low": 0.0, "high": 1.5}}, "value 1.5 is not valid for model.dropout"),
    ({"batch_size": {"type": "float", "low": 32, "high": 64}}, "batch_size is a whole number"),
    ({"hidden_layers.5": {"type": "int", "low": 8, "high": 64}}, "model.hidden_layers has 2 layer(s)"),
    ({"hidden_layers": {"type": "categorical", "choices": [32, 64]}}, "lists of layer widths"),
    # an infinite bound used to be an OverflowError traceback (int) or an Optuna crash at the first trial (float)
    ({"seed": {"type": "int", "low": 0, "high": float("inf")}}, "Input should be a finite number"),
    ({"learning_rate": {"type": "float", "low": 1e-4, "high": float("inf")}}, "Input should be a finite number"),
    # layer widths given as choices were never checked: 'abc' crashed a trial, 12.7 trained width 12
    ({"hidden_layers.0": {"type": "categorical", "choices": ["abc"]}}, "a layer width is a whole number of at least 1"),
    ({"hidden_layers.0": {"type": "categorical", "choices": [0, 16]}}, "a layer width is a whole number of at least 1"),
    ({"hidden_layers.0": {"type": "categorical", "choices": [12.7]}}, "a layer width is a whole number of at least 1"),
    # one name per layer: hidden_layers.00 and hidden_layers.0 were both sampled, only one used
    ({"hidden_layers.00": {"type": "int", "low": 8, "high": 64}}, "unknown parameter 'hidden_layers.00'"),
    # Optuna would quietly try only 0 and 0.3
    ({"dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.3}},
     "high (0.5) is not low (0) plus a whole number of steps (0.3): only values up to 0.3 would be tried"),
])
def test_bad_parameters_are_named_with_the_fix(tmp_path, parameters, expected):
    text = problems(write(tmp_path, parameters=parameters))
    assert f"sweep.parameters.{next(iter(parameters))}" in text and expected in text


def test_unknown_sampler_and_pruner_list_the_valid_names(tmp_path):
    from hybridtrain.validation import load_job

    with pytest.raises(SpecError) as info:
        load_job(write(tmp_path, sampler={"name": "bayes"}, pruner={"name": "hyperband"}),
                 SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))
    text = str(info.value)
    assert "unknown sweep sampler 'bayes'; choose one of: tpe (default), random" in text
    assert "unknown sweep pruner 'hyperband'; choose one of: median (default), asha, none" in text
    assert "sweep.sampler.name" in text and "sweep.pruner.name" in text


def test_search_space_applies_values_to_the_model():
    from hybridtrain.sweeps.space import SearchSpace, trial_spec

    spec = load_spec(SPEC)
    space = SearchSpace({**spec.sweep.parameters,
                         "hidden_layers.0": SweepSpec.model_validate(
                             {"parameters": {"hidden_layers.0": {"type": "int", "low": 8, "high": 64}}}
                         ).parameters["hidden_layers.0"]})
    dists = space.distributions()
    assert dists["learning_rate"].log and dists["hidden_layers"].choices == ("[32]", "[64, 32]", "[128, 64]")
    model = space.apply(spec.model, {"learning_rate": 0.01, "hidden_layers.0": 16})
    assert model.learning_rate == 0.01 and model.hidden_layers == [16, 32]
    t = trial_spec(spec, {"hidden_layers": "[128, 64]", "batch_size": 256, "dropout": 0.25})
    assert t.model.hidden_layers == [128, 64] and t.model.batch_size == 256 and t.sweep is None
    assert t.name == spec.name and t.model.epochs == spec.model.epochs


def test_study_on_sqlite_reports_epochs_and_the_median_pruner_stops_a_worse_trial(tmp_path):
    from hybridtrain.sweeps.study import SweepStudy, TrialPruned, open_for_trial, storage_url
    from hybridtrain.workspace import Workspace

    sweep = SweepSpec.model_validate({
        "parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
        "pruner": {"name": "median", "warmup_epochs": 1, "startup_trials": 1}, "sampler": {"name": "random"}})
    url = storage_url(Workspace.resolve(tmp_path))
    assert url == f"sqlite:///{tmp_path.resolve()}/.hybridtrain/sweeps/optuna.db"
    study = SweepStudy.open(url, "s1", sweep)
    good = study.ask()
    # The trial's process opens the study by name, as a worker elsewhere would.
    reporter = open_for_trial(url, "s1", sweep).reporter(good)
    for epoch in range(3):
        reporter(epoch, {"val_auc": 0.8 + epoch / 100})
    study.tell(good, "complete", 0.82)
    bad = study.ask()
    reporter = open_for_trial(url, "s1", sweep).reporter(bad)
    with pytest.raises(TrialPruned) as info:  # behind the finished trial's 0.80 at the same epoch
        reporter(0, {"val_auc": 0.6})
    assert info.value.epoch == 1 and info.value.value == 0.6
    study.tell(bad, "pruned")
    again = SweepStudy.open(url, "s1", sweep)  # a resumed sweep sees both
    assert again.counts() == {"complete": 1, "pruned": 1}
    assert again.best()[0] == good.number


STALE_SWEEP = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
                                        "sampler": {"name": "random"}})


def test_a_trial_whose_sweep_was_killed_fails_when_the_sweep_resumes_and_runs_again_in_its_place(tmp_path):
    # A killed sweep's trial stayed RUNNING in the study for good: never failed, never run again.
    from hybridtrain.sweeps.study import STALE_AFTER_S, SweepStudy
    from tests.fixtures.sweep_study import age_heartbeats, killed_parent

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    dead = killed_parent(url, "s", STALE_SWEEP)
    early = SweepStudy.open(url, "s", STALE_SWEEP)  # run again at once: its heartbeat is not stale yet
    assert early.counts() == {"complete": 1, "running": 1} and early.ended() == 1
    assert age_heartbeats(url, "s", STALE_AFTER_S + 60) == 2  # the parent beat for both trials it asked
    resumed = SweepStudy.open(url, "s", STALE_SWEEP)
    # Failed, and not counted as done: its retry (same values) takes its place in n_trials.
    assert resumed.counts() == {"complete": 1, "interrupted": 1, "waiting": 1} and resumed.ended() == 1
    retry = resumed.ask()
    assert (retry.retry_of, retry.params) == (dead["held"], dead["params"])
    assert resumed.counts() == {"complete": 1, "interrupted": 1, "running": 1}
    resumed.tell(retry, "complete", 0.81)
    assert resumed.ended() == 2


def test_a_live_sweep_keeps_its_trials_beating_and_releases_them_when_it_stops(tmp_path, monkeypatch):
    # No effect on a healthy long trial: its parent's heartbeat keeps it from being judged stale, however long it
    # trains. A sweep stopping on an error or Ctrl-C fails its trials at once, queued to run again.
    from hybridtrain.sweeps import study as study_module
    from hybridtrain.sweeps.study import SweepStudy

    # This URL's storage is new: a beat every second, stale after 4 s without one.
    monkeypatch.setattr(study_module, "HEARTBEAT_S", 1)
    monkeypatch.setattr(study_module, "STALE_AFTER_S", 4)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    live = SweepStudy.open(url, "s", STALE_SWEEP)
    long = live.ask()
    time.sleep(6)  # trains past the stale limit
    assert SweepStudy.open(url, "s", STALE_SWEEP).counts() == {"running": 1}  # a sibling sweep leaves it alone
    assert live.release() == [long.number]
    assert live.counts() == {"interrupted": 1, "waiting": 1} and live.release() == []


def test_a_trial_run_names_its_attempts_flow_run_so_the_reaper_ends_it_after_a_crash(tmp_path):
    # Trial runs carried no flow-run tag: after a crash the reaper could not find them and they stayed RUNNING.
    from hybridtrain.sweeps.study import TrialTicket
    from hybridtrain.sweeps.trial import trial_run
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace
    from orchestration.stale_runs import _end_mlflow_runs

    ws = Workspace.resolve(tmp_path)
    spec = load_spec(SPEC)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    parent = registry.start_run(ws.experiment, "churn-sweep", {"hybridtrain.sweep": "s"})
    ticket = TrialTicket(number=3, trial_id=4, params={"dropout": 0.1})
    run_id = trial_run(ws, spec, parent, "s", ticket, {"dropout": 0.1}, "attempt-1-flow-run")
    # The next attempt (a preempted trial resumed) trains in the same run, under its own flow run.
    assert trial_run(ws, spec, parent, "s", ticket, {"dropout": 0.1}, "attempt-2-flow-run") == run_id
    assert registry.client.get_run(run_id).data.tags["hybridtrain.prefect_flow_run_id"] == "attempt-2-flow-run"
    assert _end_mlflow_runs(ws, "attempt-2-flow-run", "its process is gone") == [run_id]
    run = registry.client.get_run(run_id)
    assert (run.info.status, run.data.tags["hybridtrain.crashed"]) == ("KILLED", "its process is gone")
    assert registry.run_status(parent) == "RUNNING"  # the sweep's own run belongs to the sweep's flow run


def test_a_study_that_exists_with_the_other_direction_is_refused(tmp_path):
    from hybridtrain.sweeps.study import SweepStudy

    url = f"sqlite:///{tmp_path / 'o.db'}"
    base = {"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}}}
    SweepStudy.open(url, "s", SweepSpec.model_validate(base))
    with pytest.raises(SpecError) as info:
        SweepStudy.open(url, "s", SweepSpec.model_validate({**base, "objective": {"metric": "val_log_loss"}}))
    assert "sweep.objective.direction" in str(info.value) and "new sweep.study_name" in str(info.value)


def test_plan_spreads_concurrent_trials_when_on_prem_is_full():
    from hybridtrain.placement.policy import Policy
    from hybridtrain.placement.queue_state import QueueState
    from hybridtrain.sweeps.plan import plan_sweep

    sites = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    spec = load_spec(SPEC, sites)
    spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"n_trials": 10, "parallelism": 4})})
    policy = Policy.load(ROOT / "deployments" / "policy.yaml", sites)
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)
    free = plan_sweep(spec, sites, policy, dataset_bytes=10**6, now=now)
    assert sum(s.trials for s in free.slots) == 10 and [s.trials for s in free.slots] == [3, 3, 2, 2]
    busy = plan_sweep(spec, sites, policy, dataset_bytes=10**6, now=now,
                      queues={"onprem-dc1": QueueState("onprem-dc1", 8, 8, scheduled=20, running=8,
                                                       default_run_hours=2)})
    assert all(s.site == "cloud-eu" and s.capacity_class == "opportunistic" for s in busy.slots)
    assert busy.cost_usd > 0 and busy.hours == 3 * busy.run_hours


def test_cli_plan_and_a_spec_without_a_sweep(tmp_path):
    from tests.fixtures.workspaces import make_workspace

    ws = make_workspace(tmp_path / "ws")
    exe = [sys.executable, "-m", "orchestration.cli"]
    ok = subprocess.run([*exe, "sweep", "jobs/churn-sweep.yaml", "--plan", "--home", str(ws)], check=False,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "Sweep plan: churn-sweep — 16 trials, 4 at a time" in ok.stdout and "Estimated cost at most $" in ok.stdout
    assert not (ws / ".hybridtrain" / "sweeps").exists()  # a plan writes nothing
    bad = subprocess.run([*exe, "sweep", "jobs/churn.yaml", "--plan", "--home", str(ws)], check=False,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "sweep: this job spec has no sweep section" in bad.stderr
    assert "Traceback" not in bad.stderr
    # the plan checks what `hybridtrain validate` checks (it used to plan a misspelled sampler and exit 0)
    data = yaml.safe_load((ws / "jobs" / "churn-sweep.yaml").read_text())
    data["sweep"]["sampler"] = {"name": "tpee"}
    (ws / "jobs" / "typo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    typo = subprocess.run([*exe, "sweep", "jobs/typo.yaml", "--plan", "--home", str(ws)], check=False,
                          capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and "sweep.sampler.name" in typo.stderr and "unknown sweep sampler 'tpee'" in typo.stderr
    # --storage is the storage the plan names; a sweep costing more than budget_usd says the budget is per trial
    data["sweep"]["sampler"] = {"name": "tpe"}
    data["sweep"]["n_trials"], data["budget_usd"] = 200, 1
    (ws / "jobs" / "big.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    big = subprocess.run([*exe, "sweep", "jobs/big.yaml", "--plan", "--storage", f"sqlite:///{tmp_path}/other.db",
                          "--home", str(ws), "--queue", "onprem-dc1=8/20@2"], check=False, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert big.returncode == 0, big.stderr
    out = " ".join(big.stdout.split())
    assert f"Study storage: sqlite:///{tmp_path}/other.db" in out
    assert "budget_usd ($1) is checked for each trial; the whole sweep may cost up to $" in out
    assert not (tmp_path / "other.db").exists()


def test_a_sweep_whose_storage_cannot_be_opened_is_refused_before_prefect_starts(tmp_path):
    from tests.fixtures.workspaces import make_workspace

    ws = make_workspace(tmp_path / "ws")
    out = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "jobs/churn-sweep.yaml", "--storage",
                          "nonsense", "--home", str(ws)], check=False, capture_output=True, text=True, timeout=120)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "--storage: cannot open the study database nonsense" in said, out.stderr
    assert "Traceback" not in out.stderr
    assert not (ws / ".hybridtrain" / "prefect").exists()  # no Prefect server was started for it


def test_a_trial_reports_its_epoch_while_another_reader_holds_the_study_open(tmp_path, monkeypatch):
    # Trials read and write the study from several threads and processes at once; in SQLite's default
    # journal mode a write waits for every open read to end (up to the whole busy timeout).
    import sqlite3

    from hybridtrain.sweeps import study as study_mod
    from hybridtrain.sweeps.study import SweepStudy, open_for_trial

    monkeypatch.setattr(study_mod, "SQLITE_BUSY_TIMEOUT_S", 1)
    path = tmp_path / "optuna.db"
    url = f"sqlite:///{path}"
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
                                      "pruner": {"name": "none"}, "sampler": {"name": "random"}})
    ticket = SweepStudy.open(url, "s", sweep).ask()
    reporter = open_for_trial(url, "s", sweep).reporter(ticket)
    reader = sqlite3.connect(path, timeout=1)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM trials").fetchone() == (1,)  # a read transaction stays open
        reporter(0, {"val_auc": 0.7})  # the write does not wait for the reader
        assert reader.execute("SELECT count(*) FROM trial_intermediate_values").fetchone() == (0,)  # its snapshot
    finally:
        reader.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM trial_intermediate_values").fetchone() == (1,)


def test_the_served_stack_of_this_workspace_holds_the_studies_when_this_process_talks_to_it(tmp_path, monkeypatch):
    """`make up` writes stack.json; a shell pointed at that stack (PREFECT_API_URL) keeps its studies in the stack's
    PostgreSQL database ``optuna``, as the stack's workers do (their environment names it); anything else: SQLite."""
    from hybridtrain.service.stack import Stack
    from hybridtrain.sweeps.study import storage_url
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(tmp_path)
    stack = Stack.create(tmp_path, {"prefect": 14200, "mlflow": 15000, "postgres": 15432, "s3": 19000},
                         is_root=False, pg_bin="/usr/lib/postgresql/15/bin")
    stack.db_password = "pw"
    stack.save()
    monkeypatch.delenv("HYBRIDTRAIN_SWEEP_STORAGE", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    sqlite = f"sqlite:///{ws.state_dir / 'sweeps' / 'optuna.db'}"
    assert storage_url(ws) == sqlite  # the embedded default, even with a stack on disk
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:14200/api/")
    assert storage_url(ws) == "postgresql+psycopg://hybridtrain:pw@127.0.0.1:15432/optuna"
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")  # another server: not this stack
    assert storage_url(ws) == sqlite
    monkeypatch.setenv("HYBRIDTRAIN_SWEEP_STORAGE", "postgresql://u:p@db.example/studies")  # the setting wins
    assert storage_url(ws) == "postgresql+psycopg://u:p@db.example/studies"
    assert storage_url(ws, "sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"  # and the flag over it
    assert stack.client_env()["HYBRIDTRAIN_SWEEP_STORAGE"] == "postgresql://hybridtrain:pw@127.0.0.1:15432/optuna"


def test_trials_are_planned_with_the_job_estimate_until_three_trials_ended_then_with_theirs():
    from hybridtrain.sweeps.plan import TrialDurations, trial_job

    assert trial_job("churn") == "churn-trial"
    # The job's lifecycle runs take half the 2-h limit; full trials take all of it, pruned ones a third.
    d = TrialDurations(2.0, job_hours=1.0)
    assert d.run_hours() == 1.0
    d.observe(2.0)
    d.observe(0.7)
    assert d.run_hours() == 1.0  # two trials are not yet a history
    d.observe(2.0)
    assert d.run_hours() == pytest.approx(2.0)
    assert TrialDurations(2.0).run_hours() is None  # no history at all: the declared limit
    # Earlier sweeps' trials count from the start, and an estimate never exceeds the limit.
    assert TrialDurations(2.0, 1.0, earlier=[0.5, 0.5, 0.6, 0.5]).run_hours() == pytest.approx(0.6)
    assert TrialDurations(2.0, 1.0, earlier=[3.0, 3.0, 3.0]).run_hours() == 2.0


@pytest.mark.parametrize("changes, where, expected", [
    ({"objective": {"metric": "val_log_loss", "direction": "maximize"}}, "sweep.objective",
     "val_log_loss is better lower: direction maximize would pick the worst trial; use direction: minimize"),
    ({"objective": {"metric": "val_auc", "direction": "minimize"}}, "sweep.objective", "use direction: maximize"),
    ({"n_trials": True}, "sweep.n_trials", "true is not a whole number"),
    ({"parallelism": False}, "sweep.parallelism", "false is not a whole number"),
    ({"study_name": ""}, "sweep.study_name", "'' is not a study name: 1-128 ASCII letters"),
    ({"pruner": {"name": "median", "warmup_epochs": 4}}, "sweep.pruner.warmup_epochs",
     "4 is not below model.epochs (4): a trial could be stopped only at its last epoch"),
    ({"pruner": {"name": "asha", "min_epochs": 50}}, "sweep.pruner.min_epochs", "50 is not below model.epochs (4)"),
])
def test_sweep_settings_that_would_mislead_are_named_with_the_fix(tmp_path, changes, where, expected):
    text = problems(write(tmp_path, **changes))
    assert where in text and expected in text, text


def test_sampler_and_pruner_may_be_given_by_name_alone(tmp_path):
    spec = load_spec(write(tmp_path, sampler="random", pruner="none"), SitesCatalog.load(ROOT / "deployments" / "sites.yaml"))
    assert spec.sweep.sampler.name == "random" and spec.sweep.pruner.name == "none"
    assert spec.sweep.sampler.seed == 0  # the other fields keep their defaults


def test_the_trials_job_class_must_be_one_of_the_policy(tmp_path):
    from hybridtrain.placement.policy import Policy
    from hybridtrain.validation import load_job

    sites = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    with pytest.raises(SpecError) as info:
        load_job(write(tmp_path, job_class="opportunstic"), sites, Policy.load(ROOT / "deployments" / "policy.yaml", sites))
    assert "sweep.job_class" in str(info.value) and "unknown job class 'opportunstic'; the policy knows: " \
        "opportunistic, production, standard" in str(info.value)
