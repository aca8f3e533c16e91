"""The failover drill, run for real: every scenario once on a fresh workspace with the project's sites catalog.

One drill (all five scenarios, 300 steps, a checkpoint every 25) runs once for the module; each
test checks what one scenario measured and that the recovery it reports really happened. s3-down
needs moto's server and ssh-down Debian's openssh-server: each is skipped, with the drill's own
reason, where its server cannot run.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml
from typer.testing import CliRunner

from hybridtrain.drill.report import EXPERIMENT, JOB, DrillReport, ScenarioResult
from hybridtrain.drill.runner import run_drill
from hybridtrain.drill.scenarios import scenario_names
from hybridtrain.errors import SpecError
from hybridtrain.workspace import Workspace
from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = pytest.mark.slow  # the failover drill starts its S3, SSH and Prefect processes

STEPS = 300
INTERVAL = 25


@pytest.fixture(scope="module")
def drilled(tmp_path_factory):
    root = make_workspace(tmp_path_factory.mktemp("drill") / "ws")
    ws = Workspace.resolve(root, tracking_uri=f"sqlite:///{root / '.hybridtrain' / 'mlflow' / 'mlflow.db'}")
    lines: list[str] = []
    report = run_drill(ws, None, steps=STEPS, interval=INTERVAL, say=lines.append)
    return ws, report, lines


def scenario(report: DrillReport, name: str) -> ScenarioResult:
    (found,) = [s for s in report.scenarios if s.scenario == name]
    # The test machine has sshd and moto (.ci/run installs them): a skipped scenario is a failure here.
    assert found.outcome == "ok", found.notes
    return found


def test_the_drill_plans_its_fault_half_an_interval_past_a_checkpoint(drilled):
    _, report, lines = drilled
    assert [s.scenario for s in report.scenarios] == scenario_names()
    assert (report.steps, report.checkpoint_interval, report.fault_step) == (STEPS, INTERVAL, 112)
    assert report.reference_seconds > 0 and report.seconds_per_step > 0
    assert any(line.startswith("kill-9: ok") for line in lines)


def test_kill_9_resumes_from_the_newest_checkpoint_and_loses_less_than_an_interval(drilled):
    _, report, _ = drilled
    s = scenario(report, "kill-9")
    assert s.last_step >= report.fault_step
    assert s.resumed_from_step == s.last_step // INTERVAL * INTERVAL  # the newest checkpoint before the kill
    assert 0 <= s.rpo_steps < INTERVAL and s.rpo_steps == s.last_step - s.resumed_from_step
    assert s.rpo_s >= 0 and (s.rpo_s > 0) == (s.rpo_steps > 0)  # the same loss in seconds of training
    assert s.rto_s > 0 and s.site == s.resumed_site
    assert s.weights_match_reference is True  # bit-identical to the uninterrupted run on the CPU
    whats = [e.what for e in s.timeline]
    assert any("SIGKILL" in w for w in whats) and any("process gone (status -9)" in w for w in whats)
    fault = next(e for e in s.timeline if "SIGKILL" in e.what)
    first = next(e for e in s.timeline if e.what == "resumed run: first step completed")
    assert fault.at_s == 0 and first.at_s == pytest.approx(s.rto_s, abs=1e-3)


def test_preempt_checkpoints_on_notice_and_resumes_at_another_site_losing_nothing(drilled):
    ws, report, _ = drilled
    s = scenario(report, "preempt")
    assert s.rpo_steps == 0 and s.rpo_s == 0
    assert s.resumed_from_step == s.last_step >= report.fault_step
    assert (s.site, s.resumed_site) == ("onprem-dc1", "cloud-eu")  # the catalog's two sites
    whats = [e.what for e in s.timeline]
    assert "process exited with status 75" in whats
    assert any("checkpoint copied onprem-dc1 -> cloud-eu" in w for w in whats)
    assert s.weights_match_reference is True and s.rto_s > 0


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(drilled):
    _, report, _ = drilled
    s = scenario(report, "corrupt-checkpoint")
    newest = s.last_step // INTERVAL * INTERVAL
    assert s.resumed_from_step == newest - INTERVAL  # one interval more lost than kill-9 would
    assert INTERVAL <= s.rpo_steps < 2 * INTERVAL
    assert any(f"checkpoint of step {newest} corrupted" in e.what for e in s.timeline)
    assert s.weights_match_reference is True


def test_s3_down_leaves_no_partial_checkpoint_and_the_retry_resumes(drilled):
    _, report, _ = drilled
    s = scenario(report, "s3-down")
    at = -(-report.fault_step // INTERVAL) * INTERVAL  # the checkpoint whose manifest never arrived
    # The checkpoint is written beside training: training goes on until the cut write fails, at the next
    # checkpoint at the latest, and resumes from the one before the cut.
    assert at <= s.last_step < at + INTERVAL and s.resumed_from_step == at - INTERVAL
    assert INTERVAL <= s.rpo_steps < 2 * INTERVAL and s.rpo_steps == s.last_step - s.resumed_from_step
    assert any(f"upload of step {at} cut before its manifest" in n and "not visible" in n for n in s.notes)
    whats = [e.what for e in s.timeline]
    assert any("the store gave up after 4 attempts" in w for w in whats)
    assert any("failed (attempt 1 of 4)" in w for w in whats)  # the store's retry warnings, as events
    assert s.weights_match_reference is True


def test_ssh_down_marks_the_site_unhealthy_and_resumes_at_the_next_site(drilled):
    _, report, _ = drilled
    s = scenario(report, "ssh-down")
    assert (s.site, s.resumed_site) == ("drill-ssh-a", "drill-ssh-b")
    at = -(-report.fault_step // INTERVAL) * INTERVAL  # the drill stops sshd once this checkpoint is stored
    assert s.resumed_from_step >= at and s.resumed_from_step % INTERVAL == 0 and s.rpo_estimated
    whats = [e.what for e in s.timeline]
    assert any(w.startswith("ssh_train gave up") for w in whats)
    assert any("drill-ssh-a UNHEALTHY: ssh " in w and "drill-ssh-b healthy" in w for w in whats)
    assert any(w.startswith("placement: drill-ssh-b") and "site health" in w for w in whats)
    assert s.weights_match_reference is True


def test_the_report_is_written_as_markdown_and_json(drilled):
    ws, report, _ = drilled
    d = ws.state_dir / "drills"
    assert report.directory is not None and os.path.dirname(report.directory) == str(d)
    again = DrillReport.read(report.directory)
    assert again == report
    md = (ws.state_dir / "drills" / os.path.basename(report.directory) / "report.md").read_text()
    assert "| scenario | outcome | RTO s | RPO steps |" in md
    for s in report.scenarios:
        assert f"| {s.scenario} | {s.outcome} |" in md
    assert "**rto_s**" in md and "**rpo_steps**" in md
    # The drill cleaned up after itself: no scratch directory, no checkpoints left in the sites' stores.
    assert not [p for p in d.iterdir() if p.name.startswith(".work-")]
    stores = ws.root / ".hybridtrain" / "stores"
    assert not list(stores.glob(f"*/objects/checkpoints/{JOB}/*/*"))


def test_the_drill_is_recorded_in_mlflow(drilled):
    from mlflow import MlflowClient

    ws, report, _ = drilled
    client = MlflowClient(tracking_uri=ws.tracking_uri, registry_uri=ws.tracking_uri)
    run = client.get_run(report.mlflow_run_id)
    assert client.get_experiment(run.info.experiment_id).name == EXPERIMENT
    for s in report.scenarios:
        if s.outcome == "ok":
            assert run.data.metrics[f"{s.scenario}.rto_s"] == pytest.approx(s.rto_s)
            assert run.data.metrics[f"{s.scenario}.rpo_steps"] == s.rpo_steps
    assert run.info.status == ("FAILED" if report.failed else "FINISHED")
    assert {a.path for a in client.list_artifacts(report.mlflow_run_id)} >= {"report.md", "report.json"}
    (ws.root / "fetched").mkdir(exist_ok=True)
    fetched = client.download_artifacts(report.mlflow_run_id, "report.json", str(ws.root / "fetched"))
    assert json.loads(open(fetched).read())["mlflow_run_id"] == report.mlflow_run_id


def test_impossible_step_settings_are_refused_before_anything_runs(tmp_path):
    ws = Workspace.resolve(make_workspace(tmp_path / "ws"))
    with pytest.raises(SpecError) as err:
        run_drill(ws, ["kill-9"], steps=300, interval=200)
    assert "--interval" in str(err.value) and "use --interval 25" in str(err.value)
    assert not (ws.state_dir / "drills").exists()


def test_the_cli_refuses_an_unknown_scenario_and_lists_the_valid_ones(tmp_path, monkeypatch):
    from hybridtrain.cli.main import app

    monkeypatch.setattr(os, "environ", os.environ.copy())  # the CLI sets Prefect/DVC defaults for its process
    result = CliRunner().invoke(app, ["drill", "--scenario", "kill-9", "--scenario", "kill-10",
                                      "--home", str(make_workspace(tmp_path / "ws"))])
    assert result.exit_code == 2, result.output
    assert "unknown drill scenario 'kill-10'" in result.output
    assert "kill-9, preempt, corrupt-checkpoint, s3-down, ssh-down" in result.output
    assert "Traceback" not in result.output


def test_a_weekly_deployment_runs_the_drill_flow():
    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    (drill,) = [d for d in deployments if d["entrypoint"] == "flows/drill.py:failover_drill"]
    assert [s["cron"] for s in drill["schedules"]] == ["0 3 * * 0"]
    from flows.drill import failover_drill

    assert failover_drill.name == "failover-drill"
