"""``hybridtrain simulate`` as a user runs it (a subprocess): bad numbers refused in one line before any work,
any spot-trace directory and job file, both deadline regimes over seeds, plots logged to MLflow."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridtrain.simulation.traces import TRACES_DIR, load_pods
from hybridtrain.simulation.workload import WorkloadParams, jobs_from_pods

CLI = [str(Path(sys.executable).with_name("hybridtrain"))]
HELD_OUT = TRACES_DIR / "skypilot-spot-traces-heldout"


def run(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "simulate", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize(("args", "option", "says"), [
    (["--capacity", "0"], "--capacity", "whole number ≥ 1"),
    (["--capacity", "-4"], "--capacity", "whole number ≥ 1"),
    (["--load", "nan"], "--load", "finite number > 0"),
    (["--load", "inf"], "--load", "finite number > 0"),
    (["--load", "0"], "--load", "finite number > 0"),
    (["--seeds", "0"], "--seeds", "give 1 to 100"),
    (["--deadlines", "strict"], "--deadlines", "choose loose or tight"),
    (["--relaxed-policy", "no-such-policy.yaml"], "--relaxed-policy", "is not a file"),
])
def test_a_bad_number_is_refused_in_one_line_naming_the_option(tmp_path, args, option, says):
    result = run(*args, "--out", str(tmp_path / "o"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}:") and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_unwritable_out_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    t0 = time.monotonic()
    result = run("--load", "1.5", "--out", str(blocker / "sub"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: --out:") and "not a writable directory" in line
    assert time.monotonic() - t0 < 30  # the full comparison takes minutes: none of it ran
    assert blocker.read_text() == "x"


@pytest.fixture(scope="module")
def jobs_csv(tmp_path_factory) -> Path:
    """A user's job file: half a busy day of the trace (~85 jobs), only the required columns and the class."""
    jobs = jobs_from_pods(load_pods(), WorkloadParams())
    start = jobs[len(jobs) // 2].arrival
    day = [j for j in jobs if start - 21600 <= j.arrival < start + 21600]
    path = tmp_path_factory.mktemp("jobs") / "jobs.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "arrival_s", "gpus", "true_hours", "job_class"])
        w.writerows([j.id, j.arrival, j.gpus, j.true_hours, j.job_class] for j in day)
    return path


def test_any_trace_directory_job_file_regimes_and_seeds_with_plots_in_mlflow(tmp_path, jobs_csv):
    spot = tmp_path / "spot"
    shutil.copytree(HELD_OUT, spot)
    db = tmp_path / "mlflow.db"
    result = run("--jobs", str(jobs_csv), "--spot-traces", str(spot), "--capacity", "5", "--deadlines", "loose",
                 "--deadlines", "tight", "--seeds", "2", "--out", str(tmp_path / "o"), "--plot", str(tmp_path / "png"),
                 "--mlflow-uri", f"sqlite:///{db}", timeout=600, cwd=tmp_path)  # artifacts: ./mlruns
    assert result.returncode == 0, result.stderr[-3000:]
    assert "us-west-2b_v100_1" in result.stdout and "us-west-2c_v100_1" in result.stdout
    assert "Targets over seeds" in result.stdout
    reports = json.loads((tmp_path / "o" / "comparison.json").read_text())
    assert sorted((r["deadlines"], r["seed"]) for r in reports) == [("loose", 2024), ("loose", 2025), ("tight", 2024),
                                                                  ("tight", 2025)]
    for r in reports:
        assert r["spot_traces"]["cloud-eu"].endswith("us-west-2b_v100_1.json")
        assert r["bound"]["status"] == "optimal"
        assert r["bound"]["usd"] <= next(x for x in r["rows"] if x["name"] == "ours")["total_usd"]
        assert r["targets"]["reference"] == "threshold_burst"
        ours = next(x for x in r["rows"] if x["name"] == "ours")
        assert sum(x["usd"] for x in r["spend"]) == pytest.approx(ours["total_usd"], abs=0.01)  # every dollar placed
        assert sum(x["jobs"] for x in r["spend"] if x["where"] == "on-prem") > 0
    assert "Where ours spent $" in result.stdout
    tight = [r for r in reports if r["deadlines"] == "tight"]
    loose = [r for r in reports if r["deadlines"] == "loose"]
    assert sum(x["misses"] for r in tight for x in r["rows"] if x["name"] == "threshold_0") > \
        sum(x["misses"] for r in loose for x in r["rows"] if x["name"] == "threshold_0")
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert {"cost_vs_load_loose.png", "cost_vs_load_tight.png"} <= set(pngs)
    assert any(p.startswith("frontier_tight_") for p in pngs) and any(p.startswith("timeline_loose_") for p in pngs)
    assert all((tmp_path / "png" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("hybridtrain-simulate")
    (run_info,) = client.search_runs([exp.experiment_id])
    assert any(k.startswith("tight_") and k.endswith("cost_ratio_mean") for k in run_info.data.metrics)
    logged = {a.path for a in client.list_artifacts(run_info.info.run_id, "plots")}
    assert "plots/cost_vs_load_tight.png" in logged


def test_relaxed_policy_shows_what_the_rule_costs_beside_the_comparison(tmp_path, jobs_csv):
    result = run("--jobs", str(jobs_csv), "--capacity", "4", "--relaxed-policy",
                 str(TRACES_DIR / "simulation-policy-spot-allowed.yaml"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "What the rule costs (production, standard changed" in result.stdout
    saved = json.loads((tmp_path / "o" / "rule_ablation.json").read_text())
    assert [r["rule"] for r in saved["rows"]] == ["with", "without"]
    assert saved["rows"][0]["policy"].endswith("simulation-policy.yaml")
    assert saved["rows"][1]["policy"].endswith("simulation-policy-spot-allowed.yaml")
    (relaxed,) = saved["relaxed"]
    assert relaxed["capacity"] == 4 and relaxed["policy"].endswith("simulation-policy-spot-allowed.yaml")


def test_a_spot_trace_directory_without_traces_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run("--spot-traces", str(tmp_path / "empty"), "--capacity", "4", "--out", str(tmp_path / "o"))
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "holds no *.json spot trace" in result.stderr


@pytest.mark.parametrize(("content", "says"), [
    ('[{"capacity": 10, "seed": 2024}]', "(top level): not a JSON object"),  # e.g. a saved comparison.json
    ('{"metadata": {"gap_seconds": 0}, "data": [0, 1]}', "metadata.gap_seconds: Input should be greater than 0"),
    ('{"metadata": {"gap_seconds": 32}, "data": []}', "data: List should have at least 1 item"),
    ('{"metadata": {"gap_seconds": 32}, "data": [0, "gone"]}', "data[1]: Input should be a valid number"),
    ('{"metadata": {"gap_seconds": 32}, "data": [0, NaN]}', "data[1]: Input should be a finite number"),
    ("\xff not json", "not a SkyPilot spot trace"),
])
def test_a_file_that_is_not_a_spot_trace_is_named_with_the_field_and_the_layout(tmp_path, content, says):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "a.json").write_text(content, encoding="latin-1")
    result = run("--spot-traces", str(traces), "--capacity", "4", "--out", str(tmp_path / "o"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    # lines kept whole, however long the path (a piped console would wrap them at 80 columns)
    assert result.stderr.splitlines()[0] == f"error: dataset {traces / 'a.json'} failed validation:", result.stderr
    assert says in result.stderr, result.stderr
    assert '"gap_seconds": N > 0' in result.stderr  # the layout a trace must have
    assert not (tmp_path / "o" / "comparison.json").exists()


HEADER = "name,num_gpu,gpu_milli,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


@pytest.mark.parametrize(("content", "says"), [
    ("name,num_gpu\nx,1\n", "columns: missing gpu_milli, qos, pod_phase"),
    (HEADER + "a,1,1000,LS,Running,0,100,\nb,two,1000,LS,Running,0,100,0\n", "num_gpu (line 3): Input should be a valid integer"),
    (HEADER + "a,1,1000,LS,Running,0,inf,0\n", "deletion_time (line 2): Input should be a finite number"),
    (HEADER + "a,-1,1000,LS,Running,0,100,0\n", "num_gpu (line 2): Input should be greater than or equal to 0"),
    ("\xff\xfe not text", "not a CSV pod trace"),
])
def test_a_bad_pod_trace_is_named_with_its_column_and_line(tmp_path, content, says):
    pods = tmp_path / "pods.csv"
    pods.write_text(content, encoding="latin-1")
    result = run("--pods", str(pods), "--capacity", "4", "--out", str(tmp_path / "o"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.splitlines()[0] == f"error: dataset {pods} failed validation:", result.stderr
    assert says in result.stderr, result.stderr
    assert not (tmp_path / "o" / "comparison.json").exists()
