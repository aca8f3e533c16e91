"""Starting a multi-node job's cloud instances through a real EC2 API (moto server): all or none, tagged, terminated."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from hybridtrain.drill.loopback import free_port
from hybridtrain.errors import SiteUnavailable, SpecError
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.remote.cloud_instances import (
    EXPIRES_TAG,
    JOB_TAG,
    RUN_TAG,
    SITE_TAG,
    provision,
    sweep_orphans,
    terminate_orphans,
)
from hybridtrain.specs.sites import Site, SitesCatalog
from hybridtrain.stages import sweep_instances
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHLlzJ1hWXMAHNd1YyA7qXJ0ybsN/c3nkDGKEeDXKCWk"


def cloud_site(ec2, capacity: str = "burst", **instances) -> Site:
    block = ec2.instances(port=instances.pop("port", free_port()), host_key=HOST_KEY, workdir="/w/{instance_id}",
                          **instances)
    return Site(name="cloud-x", kind="cloud", region="us-east-1", jurisdiction="EU", gpu_type="A100", gpu_count=16,
                capacity_class=capacity, price_per_gpu_hour=4.0, spot_price_per_gpu_hour=1.0, work_pool="cloud",
                store={"kind": "local", "path": "/tmp/cloud-x"}, instances=block)


@pytest.mark.parametrize("capacity, lifecycle", [("burst", None), ("opportunistic", "spot")])
def test_instances_that_never_answer_on_ssh_are_all_terminated_with_one_clear_error(ec2, capacity, lifecycle):
    site = cloud_site(ec2, capacity, boot_timeout_s=1.5)  # nothing listens on the port at their addresses
    started = time.monotonic()
    with pytest.raises(SiteUnavailable) as err:
        provision(site, 2, "churn-r1")
    waited = time.monotonic() - started
    states = ec2.states()
    assert len(states) == 2 and set(states.values()) == {"terminated"}  # nothing left running, nothing paid for
    message = str(err.value)
    assert "asked EC2 for 2 instances of c5.large for job churn-r1, 0 came up within 1.5 s" in message
    assert all(i in message for i in states) and "sites.cloud-x.instances.boot_timeout_s" in message
    assert err.value.site == "cloud-x" and err.value.retryable
    assert 1.5 <= waited < 15
    described = ec2.client.describe_instances()["Reservations"][0]["Instances"]
    assert {i.get("InstanceLifecycle") for i in described} == {lifecycle}  # spot follows the capacity class
    assert {i["PrivateIpAddress"] for i in described} == {"127.0.0.4", "127.0.0.5"}
    assert {i["InstanceType"] for i in described} == {"c5.large"} and ec2.tags(described[0]["InstanceId"])[
        JOB_TAG] == "churn-r1"


def left_running(ec2, job: str, site_name: str, n: int, run_id: str | None = None,
                 expires: datetime | None = None) -> list[str]:
    """Instances as ``provision`` tags them, left running (what an attempt killed after provisioning leaves)."""
    tags = [{"Key": JOB_TAG, "Value": job}, {"Key": SITE_TAG, "Value": site_name}]
    if run_id:
        tags.append({"Key": RUN_TAG, "Value": run_id})
    if expires:
        tags.append({"Key": EXPIRES_TAG, "Value": expires.isoformat(timespec="seconds")})
    out = ec2.client.run_instances(ImageId="ami-12c6146b", InstanceType="c5.large", MinCount=n, MaxCount=n,
                                   SubnetId=ec2.subnet_id, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    return [i["InstanceId"] for i in out["Instances"]]


def test_orphans_of_the_job_are_terminated_and_other_jobs_instances_are_left_alone(ec2):
    site = cloud_site(ec2)

    def run(job: str, site_name: str, n: int) -> list[str]:
        return left_running(ec2, job, site_name, n)

    mine, other_job, other_site = run("churn-r1", "cloud-x", 2), run("churn-r2", "cloud-x", 1), \
        run("churn-r1", "cloud-y", 1)
    assert sorted(terminate_orphans(site, "churn-r1")) == sorted(mine)
    states = ec2.states()
    assert {states[i] for i in mine} == {"terminated"}
    assert states[other_job[0]] == "running" and states[other_site[0]] == "running"
    assert terminate_orphans(site, "churn-r1") == []  # terminated ones are not orphans any more


def test_a_refused_subnet_is_a_spec_error_naming_the_field_and_starts_nothing(ec2):
    site = cloud_site(ec2, subnet_id="subnet-0000dead")
    with pytest.raises(SpecError) as err:
        provision(site, 2, "churn-r1")
    (problem,) = err.value.problems
    assert problem.path == "sites.cloud-x.instances.subnet_id" and "InvalidSubnetID" in problem.message
    assert ec2.states() == {}


def test_more_nodes_than_the_site_may_start_is_refused_before_anything_starts(ec2):
    site = cloud_site(ec2, max_instances=2)
    with pytest.raises(SpecError) as err:
        provision(site, 3, "churn-r1")
    assert err.value.problems[0].path == "sites.cloud-x.instances.max_instances"
    assert "needs 3 instances and site cloud-x starts at most 2" in err.value.problems[0].message
    assert ec2.states() == {}


def test_the_sweep_terminates_instances_whose_run_ended_or_whose_deadline_passed_and_nothing_else(ec2):
    site, now = cloud_site(ec2), datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    later, earlier = now + timedelta(hours=1), now - timedelta(minutes=1)
    training = left_running(ec2, "a-r1", "cloud-x", 2, "run-a", later)
    ended = left_running(ec2, "b-r1", "cloud-x", 2, "run-b", later)
    overdue = left_running(ec2, "c-r1", "cloud-x", 1, "run-c", earlier)
    untagged = left_running(ec2, "d-r1", "cloud-x", 1)  # an older provisioner's: neither run nor deadline
    elsewhere = left_running(ec2, "e-r1", "cloud-y", 1, "run-b", earlier)  # another site's
    status = {"run-a": None, "run-b": "KILLED", "run-c": None}
    asked: list[str] = []
    swept = sweep_orphans(site, lambda run: asked.append(run) or status[run], now=now)
    reasons = {x.instance_id: x.reason for x in swept}
    assert set(reasons) == {*ended, *overdue}
    assert reasons[ended[0]] == "its MLflow run run-b ended (KILLED)"
    assert reasons[overdue[0]] == "past its deadline 2026-11-27T11:59:00+00:00 (boot time + the job's max_hours)"
    assert sorted(asked) == ["run-a", "run-b"]  # each run read once; the overdue one's deadline decided
    states = ec2.states()
    assert {states[i] for i in [*ended, *overdue]} == {"terminated"}
    assert {states[i] for i in [*training, *untagged, *elsewhere]} == {"running"}
    assert sweep_orphans(site, status.get, now=now) == []  # terminated ones are not looked at again


def test_the_instance_sweep_reads_each_runs_state_from_mlflow_and_audits_what_it_terminates(ec2, tmp_path):
    ws = Workspace.resolve(tmp_path / "ws")
    site = cloud_site(ec2)
    ws.sites_file.parent.mkdir(parents=True, exist_ok=True)
    ws.sites_file.write_text(yaml.safe_dump(SitesCatalog(apiVersion="hybridtrain/v1", sites=(site,)).model_dump(
        mode="json")))
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    running = registry.start_run(ws.experiment, "training", {})
    failed = registry.start_run(ws.experiment, "killed", {})
    registry.end_run(failed, "FAILED")
    later = datetime.now(UTC) + timedelta(hours=2)
    keep = left_running(ec2, "churn-r1", "cloud-x", 2, running, later)
    gone = left_running(ec2, "churn-r2", "cloud-x", 2, failed, later)
    unknown = left_running(ec2, "churn-r3", "cloud-x", 1, "0123456789abcdef0123456789abcdef", later)

    rows = sweep_instances(ws)
    assert sorted(r["instance"] for r in rows) == sorted(gone)
    assert {r["reason"] for r in rows} == {f"its MLflow run {failed} ended (FAILED)"}
    states = ec2.states()
    assert {states[i] for i in gone} == {"terminated"} and {states[i] for i in [*keep, *unknown]} == {"running"}
    records = [r for r in AuditLog.in_workspace(ws.root).records() if r.action == "cloud_instances"]
    assert sorted(i for r in records for i in r.inputs["instances"]) == sorted(gone)
    assert all(r.outcome.startswith("terminated by the sweep: its MLflow run") for r in records)
    # An EC2 API that does not answer is a row that says so, not a failed recovery pass.
    broken = site.model_copy(update={"instances": site.instances.model_copy(update={"endpoint_url": "http://127.0.0.1:9"})})
    ws.sites_file.write_text(yaml.safe_dump(SitesCatalog(apiVersion="hybridtrain/v1", sites=(broken,)).model_dump(
        mode="json")))
    [row] = sweep_instances(ws)
    assert row["site"] == "cloud-x" and "could not list its instances on its EC2 API" in row["error"]


def test_the_recovery_pass_terminates_leftover_instances_and_lists_them(ec2, tmp_path, prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.recovery import recover_runs

    ws = Workspace.resolve(tmp_path / "ws")
    ws.sites_file.parent.mkdir(parents=True, exist_ok=True)
    ws.sites_file.write_text(yaml.safe_dump(SitesCatalog(apiVersion="hybridtrain/v1", sites=(cloud_site(ec2),))
                                            .model_dump(mode="json")))
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    ended = registry.start_run(ws.experiment, "crashed-control-plane", {})
    registry.end_run(ended, "KILLED")  # as the recovery path marks a run whose control plane died
    left = left_running(ec2, "churn-r9", "cloud-x", 2, ended, datetime.now(UTC) + timedelta(hours=2))
    # Only the sweep is under test: a look-back window (~4 ms) that holds no other test's lifecycle run to resubmit.
    state = recover_runs(workspace=str(ws.root), lookback_hours=1e-6, return_state=True)
    assert state.is_completed(), state
    assert {ec2.states()[i] for i in left} == {"terminated"}
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["swept-instances"])),
                                           limit=1)
    assert all(i in str(artifact.data) for i in left)


def test_the_instances_command_lists_them_and_sweeps_the_leftovers(ec2, workspace, prefect_server):
    import os
    import subprocess
    import sys

    ws = Workspace.resolve(workspace)
    catalog = ws.load_sites()
    ws.sites_file.write_text(yaml.safe_dump(catalog.model_copy(update={"sites": (*catalog.sites, cloud_site(ec2))})
                                            .model_dump(mode="json")))
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    running, ended = (registry.start_run(ws.experiment, name, {}) for name in ("training", "killed"))
    registry.end_run(ended, "KILLED")
    later = datetime.now(UTC) + timedelta(hours=2)
    keep = left_running(ec2, "churn-r1", "cloud-x", 1, running, later)
    gone = left_running(ec2, "churn-r2", "cloud-x", 2, ended, later)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "COLUMNS": "300", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestration.cli", "instances", *args, "--home", str(ws.root)],
                              env=env, capture_output=True, text=True, timeout=300, check=False)

    listed = cli()
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {line.split("│")[2].strip(): line for line in listed.stdout.splitlines() if "│ cloud-x" in line}
    assert set(rows) == {*keep, *gone}
    cells = {i: [c.strip() for c in line.split("│")[1:-1]] for i, line in rows.items()}
    assert cells[keep[0]][4:6] == ["churn-r1", "running"] and cells[keep[0]][-1] == "-"
    assert cells[gone[0]][4:6] == ["churn-r2", "KILLED"] and cells[gone[0]][-1].startswith("its run ended")
    assert "2 leftover instance(s): `hybridtrain instances --sweep` terminates them now" in listed.stdout
    swept = cli("--sweep")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "2 instance(s) terminated" in swept.stdout and all(f"terminated {i} at cloud-x" in swept.stdout for i in gone)
    states = ec2.states()
    assert {states[i] for i in gone} == {"terminated"} and states[keep[0]] == "running"
    wrong = cli("--site", catalog.sites[0].name)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip() == (f"site {catalog.sites[0].name} starts no instances: add an instances: block to "
                                    f"sites.{catalog.sites[0].name} in {ws.sites_file}")
