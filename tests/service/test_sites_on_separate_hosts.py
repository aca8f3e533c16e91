"""Sites on separate hosts: each site's worker runs from its own root, with code its deployments' pull step fetches.

Nothing is shared between the sites but the control plane's servers (the served stack, `make up`
without its own workers and deployments) and the cloud site's S3 store. A bare git repository made
from this checkout's HEAD stands for the project's repository; the on-prem gateway and the cloud
node are two clones of it in separate roots. The gateway generates the raw data into its own store
and runs `hybridtrain deploy --code-repo file://...`; each site starts `hybridtrain worker --pool
POOL --home ROOT`. The lifecycle, triggered through the API, prepares the data on-prem, syncs the
approved version to the cloud store, trains at the cloud site and promotes into the shared MLflow.

The job needs two nodes, so the cloud site's worker starts two instances through the EC2 API (the
stack's moto server, the same one that serves S3) and trains on them with torchrun over SSH. As in
``tests/fixtures/cloud_fleet``, the instances' addresses are loopback ones where one real sshd
answers with the image's host key; the site's SSH key reaches the worker the user's way, through
``hybridtrain credentials`` (a Secret block on the served Prefect).

The sites run the committed HEAD (what the pull step fetches into each run's directory), not uncommitted edits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.drill.timeline import wait_until
from hybridtrain.service.stack import Stack
from tests.fixtures.cloud_fleet import Hypervisor, loopback_subnet
from tests.fixtures.prefect_api import prefect_api_at
from tests.fixtures.workspaces import ROOT, spec_writer
from tests.service.conftest import stack_cli

pytestmark = pytest.mark.slow
LIFECYCLE = "training-lifecycle/churn-nightly-cloud-eu"
CLOUD_BUCKET = "cloud-eu-store"
EC2_REGION = "eu-west-1"
RUN_TIMEOUT_S = 900  # bounds a wait; ~2 min on a quiet 2-core host


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def site_env(stack: Stack, root: Path) -> dict[str, str]:
    """A site host's environment: the control plane's URLs and S3 credentials, nothing of this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYBRIDTRAIN_", "PYTHON"))}
    env.update(stack.client_env())
    env.update(stack.s3_env())
    env.update({"HYBRIDTRAIN_HOME": str(root), "PREFECT_HOME": str(root / ".hybridtrain" / "prefect"),
                "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_HEARTBEAT_SECONDS": "5"})
    return env


def start_cli(stack: Stack, root: Path, log: Path, *args: str) -> subprocess.Popen:
    """`hybridtrain ARGS --home ROOT` at a site, run from that site's own clone (output to ``log``)."""
    (root / ".hybridtrain" / "prefect").mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "orchestration.cli", *args, "--home", str(root)], cwd=root,
                                env=site_env(stack, root), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def finished(proc: subprocess.Popen, log: Path, timeout: float = 600) -> str:
    assert proc.wait(timeout=timeout) == 0, f"{' '.join(proc.args[2:])} exited {proc.returncode}:\n{log.read_text()[-4000:]}"
    return log.read_text()


def use_cloud_s3_store(root: Path, stack: Stack, instances: dict) -> None:
    """The site's sites catalog with the cloud site's store on the S3 server (a local one is per root), and the
    ``instances:`` block that has it start its machines through the EC2 API."""
    path = root / "deployments" / "sites.yaml"
    data = yaml.safe_load(path.read_text())
    for site in data["sites"]:
        if site["name"] == "cloud-eu":
            site["store"] = {"kind": "s3", "bucket": CLOUD_BUCKET, "endpoint_url": stack.s3_url}
            site["instances"] = instances
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def digests(top: Path) -> dict[str, Path]:
    return {hashlib.md5(p.read_bytes()).hexdigest(): p for p in top.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def control_plane() -> Iterator[tuple[Stack, Path]]:
    """The served stack's servers (PostgreSQL, S3, MLflow, Prefect), no workers or deployments of its own."""
    base = Path(tempfile.mkdtemp(prefix="hybridtrain-sites-"))
    base.chmod(0o755)  # PostgreSQL's own user must enter it
    control = base / "control"
    control.mkdir()
    try:
        stack_cli(control, "up", "--no-deploy", "--no-workers", "--no-doctor", "--warm-spares", "0")
        yield Stack.load(control), base
    finally:
        stack_cli(control, "down", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_a_lifecycle_runs_across_sites_that_share_no_checkout_and_trains_on_two_cloud_instances(
        control_plane, image_sshd):
    import boto3
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.deployments import run_deployment

    from orchestration.dispatch import workers_online

    stack, base = control_plane
    server, host_key = image_sshd
    fleet = loopback_subnet(stack.s3_url, EC2_REGION)  # the stack's moto serves EC2 beside S3
    instances_dir = base / "instances"  # each instance's workdir, {instance_id}, is a directory of its own here
    instances = {"region": EC2_REGION, "endpoint_url": stack.s3_url, "image_id": "ami-12c6146b",
                 "instance_type": "c5.large", "subnet_id": fleet.subnet_id, "username": server.host.username,
                 "port": server.host.port, "workdir": f"{instances_dir}/{{instance_id}}", "python": sys.executable,
                 "host_key": host_key, "max_instances": 4, "boot_timeout_s": 60, "connect_timeout_s": 3,
                 "command_timeout_s": 20, "reconnect_s": 30}
    bare = base / "hybridtrain.git"
    git("init", "-q", "--bare", str(bare))
    git("push", "-q", str(bare), "HEAD:refs/heads/main", cwd=ROOT)
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=bare)
    sha = git("rev-parse", "HEAD", cwd=ROOT)
    onprem, cloud = base / "onprem-gateway", base / "cloud-node"
    for root in (onprem, cloud):
        git("clone", "-q", f"file://{bare}", str(root))
        use_cloud_s3_store(root, stack, instances)
    boto3.client("s3", endpoint_url=stack.s3_url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=CLOUD_BUCKET)

    # At once: the gateway generates the raw data into its own store and deploys (the pools' deployments clone
    # the code from the bare repository); each site starts its worker from its own root.
    logs = {name: base / f"{name}.log" for name in ("data", "deploy", "worker-onprem", "worker-cloud", "credentials")}
    # The cloud site's operator stores in the site's block the instances' SSH key (the image's host key is pinned)
    # and the store's S3 keys, which the instances fetch the data with (the worker has its own in its environment).
    key, s3_secret = base / "instances_key", base / "s3_secret"
    key.write_text(server.private_key)
    s3_secret.write_text(stack.s3_env()["AWS_SECRET_ACCESS_KEY"])
    for path in (key, s3_secret):
        path.chmod(0o600)
    finished(start_cli(stack, cloud, logs["credentials"], "credentials", "cloud-eu", "--ssh-key", str(key),
                       "--aws-access-key-id", stack.s3_env()["AWS_ACCESS_KEY_ID"], "--aws-secret-access-key-file",
                       str(s3_secret)), logs["credentials"])
    key.unlink()
    s3_secret.unlink()
    workers = [start_cli(stack, root, logs[f"worker-{pool}"], "worker", "--pool", pool)
               for pool, root in (("onprem", onprem), ("cloud", cloud))]
    data = start_cli(stack, onprem, logs["data"], "data", "generate", "--rows", "2000", "--pin", "jobs/churn.yaml")
    deploy = start_cli(stack, onprem, logs["deploy"], "deploy", "--code-repo", f"file://{bare}")
    try:
        finished(data, logs["data"])
        # Two CPU nodes (the instances are c5.large, without GPUs), trained together with gloo DDP.
        spec_writer(onprem)("sites-e2e", model__epochs=2, resources__nodes=2, resources__gpus=0,
                            resources__gpu_type=None)
        deployed = finished(deploy, logs["deploy"])
        assert f"pool cloud: workers clone commit {sha}" in deployed, deployed
        with prefect_api_at(stack.prefect_api):
            with get_client(sync_client=True) as client:  # their schedules are test_served_stack's; here they
                for name in ("burst-controller/control", "recover-runs/control"):  # would only add cold runs
                    client.pause_deployment(client.read_deployment_by_name(name).id)
            wait_until(lambda: all(workers_online(p) for p in ("onprem", "cloud")) or any(
                w.poll() is not None for w in workers), "both sites' workers to come online", timeout=RUN_TIMEOUT_S,
                every=1.0)
            assert all(w.poll() is None for w in workers), logs["worker-onprem"].read_text()[-3000:] + \
                logs["worker-cloud"].read_text()[-3000:]
            with Hypervisor(fleet, lambda i: instances_dir / i):
                run = run_deployment(LIFECYCLE, parameters={"spec_path": "jobs/sites-e2e.yaml"},
                                     timeout=RUN_TIMEOUT_S, poll_interval=1)
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs.values())
            assert run.state is not None and run.state.is_completed(), f"{run.state}\n{tails}"
            with get_client(sync_client=True) as client:
                stages = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
                flows = {f.id: f.name for f in client.read_flows()}
    finally:
        stop_with_children(*workers, data, deploy, grace_s=20)

    ran = {(flows[r.flow_id], r.work_pool_name) for r in stages if r.state and r.state.is_completed()}
    assert {("prepare-data", "onprem"), ("sync-data", "onprem"), ("train-stage", "cloud")} <= ran, ran

    # Each stage's worker fetched the deployed commit with the pull step and ran the flow from that clone.
    def pulled(run_id) -> bool:
        with prefect_api_at(stack.prefect_api), get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200)
        return any("git_clone" in log.message for log in logs)

    for r in [run, *stages]:
        wait_until(lambda r=r: pulled(r.id), f"{r.name}'s log to show the git_clone pull step", timeout=60, every=1.0)

    # The model is in the shared MLflow server, trained at the cloud site from the deployed code.
    # registry_uri too: a client without one uses the registry mlflow.set_registry_uri set in this process (an
    # earlier test's workspace), not its tracking URI
    mlflow = MlflowClient(stack.mlflow_url, registry_uri=stack.mlflow_url)
    versions = [mlflow.get_model_version(v.name, v.version)
                for v in mlflow.search_model_versions("name = 'churn-classifier'")]
    assert [v.tags.get("hybridtrain.site") for v in versions] == ["cloud-eu"], [(v.version, v.run_id, v.source, v.tags)
                                                                                for v in versions]
    # The gateway's commit (marked -dirty: its sites catalog and pinned job spec are local edits).
    assert versions[0].tags["hybridtrain.code_version"].startswith(sha)
    # Trained on two instances the cloud site's worker started, each with its own copy of the data; both are gone.
    trained = mlflow.get_run(versions[0].run_id).data.tags
    started = trained["cloud.instances"].split(",")
    assert len(started) == 2 and fleet.states() == dict.fromkeys(started, "terminated"), (trained, fleet.states())
    assert fleet.tags(started[0])["hybridtrain:mlflow-run"] == versions[0].run_id
    for instance in started:
        assert (instances_dir / instance / "data-copy").is_dir()

    # Raw and curated data never reached the cloud root; the approved data did (so the walk sees synced files).
    on_data = onprem / "data"
    private = {md5: p for tier in ("raw", "curated") for md5, p in digests(on_data / tier).items()}
    approved = digests(on_data / "approved")
    assert private and approved
    pii = (on_data / "raw" / "churn.csv").read_text().splitlines()[1].split(",")[2].strip().encode()  # an email
    seen_approved = []
    for path in (p for top in (cloud, instances_dir) for p in top.rglob("*") if p.is_file()):
        content = path.read_bytes()
        md5 = hashlib.md5(content).hexdigest()
        assert md5 not in private, f"{path} under the cloud root holds {private[md5]} of the on-prem site"
        assert path.name != "churn.csv" and "curated" not in path.parts, path
        assert pii not in content, f"{path} under the cloud root holds raw personal data"
        if md5 in approved:
            seen_approved.append(path)
    assert seen_approved, "the approved data synced to the cloud site was not found under its root or instances"
    assert not (cloud / ".hybridtrain" / "stores" / "onprem-dc1").exists()
