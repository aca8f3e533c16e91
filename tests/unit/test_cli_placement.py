"""``plan`` and ``simulate``: a decision a user can check by hand, and user mistakes without tracebacks."""

from __future__ import annotations

import csv
import json

import typer
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.placement import register
from hybridtrain.simulation.traces import POD_TRACE
from tests.fixtures.workspaces import ROOT

runner = CliRunner()
app = typer.Typer()
register(app)

SITES = str(ROOT / "deployments" / "sites.yaml")
POLICY = str(ROOT / "deployments" / "policy.yaml")
NOW = "2026-05-01T12:00:00Z"


def spec(tmp_path, **placement) -> str:
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data["placement"] = placement
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def plan(*args):
    return runner.invoke(app, ["plan", *args, "--sites", SITES, "--policy", POLICY, "--now", NOW])


def flat(text: str) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(text.split())


def test_plan_explains_the_decision(tmp_path):
    result = plan(spec(tmp_path), "--dataset-bytes", "20000000000", "--queue", "onprem-dc1=8/20@2")
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "churn → cloud-eu (burst)" in out and "meets the deadline" in out
    assert "queue wait" in out and "after the deadline" in out  # why on-prem was not kept
    assert "compute: 1 GPU × 1.00 h × $4.0966/GPU-h = $4.10" in out  # checkable by hand
    assert "job_classes.standard.capacity_classes" in out  # the rejected spot candidate and its rule
    assert "no side effects" in out


def test_plan_with_an_empty_queue_stays_on_prem_and_json_has_the_tags(tmp_path):
    result = plan(spec(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["tags"]["placement.site"] == "onprem-dc1" and doc["candidates"][0]["verdict"] == "chosen"
    assert any(line.startswith("total: $") for line in doc["breakdown"])


def test_plan_spot_for_an_opportunistic_job(tmp_path):
    result = plan(spec(tmp_path, job_class="opportunistic"), "--queue", "onprem-dc1=8/12@2", "--spot",
                  "cloud-eu=0.6/0.3")
    assert result.exit_code == 0, result.output
    assert "cloud-eu (opportunistic)" in result.output and "uniform-progress" in flat(result.output)


def test_user_mistakes_exit_non_zero_without_traceback(tmp_path):
    cases = [
        (["--queue", "onprem-dc1=lots"], "expected SITE=RUNNING/QUEUED[@HOURS]"),
        (["--queue", "mars=1/1"], "no site named 'mars'"),
        (["--strategy", "nope"], "choose one of: cheapest, deadline_spot, fastest, onprem_first (default)"),
        (["--spot", "cloud-eu=2"], "availability in (0, 1]"),
    ]
    for args, message in cases:
        result = plan(spec(tmp_path), *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in flat(result.output), (args, result.output)
        assert "Traceback" not in result.output


def test_a_bad_clock_is_a_user_error(tmp_path):
    result = runner.invoke(app, ["plan", spec(tmp_path), "--sites", SITES, "--policy", POLICY, "--now", "yesterday"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert flat(result.output) == "error: --now: 'yesterday' is not an ISO time; give e.g. 2026-11-28T09:00:00Z"


def test_a_run_time_or_size_no_run_can_have_is_refused_naming_the_option(tmp_path):
    # a run of -3 h used to be planned as a 1-second run costing $0.00
    for args, option in ((["--run-hours", "-3"], "--run-hours"), (["--run-hours", "0"], "--run-hours"),
                         (["--run-hours", "nan"], "--run-hours"), (["--run-hours", "inf"], "--run-hours"),
                         (["--dataset-bytes", "-5"], "--dataset-bytes"),
                         (["--dataset-bytes", str(10**21)], "--dataset-bytes")):
        result = plan(spec(tmp_path), *args)
        assert result.exit_code == 2 and "Traceback" not in result.output, (args, result.output)
        assert flat(result.output).startswith(f"error: {option}: ") and "is not a" in result.output, result.output
        assert "$0.00" not in result.output


def test_plan_reports_a_spec_that_no_site_may_run(tmp_path):
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data["placement"] = {}
    data["data_policy"] = {"sensitivity": "confidential", "residency": ["US"]}
    path = tmp_path / "us.yaml"
    path.write_text(yaml.safe_dump(data))
    result = plan(str(path))
    assert result.exit_code == 5, result.output
    assert "no site may run job 'churn'" in flat(result.output) and "spec data_policy.residency" in flat(result.output)


def test_plan_points_at_a_broken_policy_file(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text((ROOT / "deployments" / "policy.yaml").read_text().replace("wait_slo_hours: 4", "wait_slo: 4"))
    result = runner.invoke(app, ["plan", spec(tmp_path), "--sites", SITES, "--policy", str(bad)])
    assert result.exit_code == 2 and "wait_slo" in result.output and "unknown field" in flat(result.output)


def test_simulate_writes_the_table_and_plot(tmp_path):
    result = runner.invoke(app, ["simulate", "--capacity", "6", "--pods", str(small_pod_trace(tmp_path)),
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "ours" in out and "lower_bound" in out and "tuned on the first half" in out
    assert {p.name for p in (tmp_path / "o").iterdir()} == {"comparison.json", "comparison.csv", "comparison.png"}


def small_pod_trace(tmp_path):
    rows = list(csv.DictReader(POD_TRACE.open()))
    small = tmp_path / "pods.csv"
    with small.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if float(r["creation_time"]) >= 12_500_000)
    return small


def test_simulate_runs_every_load_it_is_given(tmp_path):
    result = runner.invoke(app, ["simulate", "--load", "0.8", "--load", "1.5", "--pods", str(small_pod_trace(tmp_path)),
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    reports = json.loads((tmp_path / "o" / "comparison.json").read_text())
    ratios = [r["demand_ratio"] for r in reports]
    assert len(ratios) == 2 and ratios[0] < 1.0 and ratios[1] > 1.3, ratios


def test_simulate_refuses_a_load_that_is_not_positive(tmp_path):
    result = runner.invoke(app, ["simulate", "--load", "0", "--pods", str(small_pod_trace(tmp_path))])
    assert result.exit_code == 2 and "--load" in result.output and "> 0" in result.output
    assert "Traceback" not in result.output


def test_a_clock_without_a_timezone_or_past_what_dates_hold_is_refused_naming_now(tmp_path):
    for now, says in (("2026-01-01T00:00:00", "has no timezone; add Z (UTC) or an offset"),
                      ("9999-12-31T23:00:00Z", "is outside the years 1970-9000")):  # was an OverflowError traceback
        result = runner.invoke(app, ["plan", spec(tmp_path), "--sites", SITES, "--policy", POLICY, "--now", now])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert flat(result.output).startswith(f"error: --now: '{now}' {says}"), result.output
