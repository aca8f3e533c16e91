"""A multi-node job on a cloud site: N instances started through a real EC2 API (moto server), trained on over SSH, terminated.

The instances' private addresses are loopback ones (``tests.fixtures.cloud_fleet``), where one real
sshd answers with the image's host key, so provisioning, host-key pinning, torchrun's c10d rendezvous
and gloo DDP all run for real; ``Hypervisor`` ends a terminated instance's processes, as the cloud does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
import torch
import yaml
from pydantic import SecretStr

from hybridtrain.datasets import partitioned
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.remote.ssh_site import SshCredentials
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR, Site, SitesCatalog
from hybridtrain.stages.training import train
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.trainer import Trainer
from tests.fixtures.cloud_fleet import Hypervisor
from tests.fixtures.processes import wait_until
from tests.fixtures.ssh_job import MULTI
from tests.fixtures.ssh_job import MULTI_EPOCHS as EPOCHS

pytestmark = pytest.mark.slow  # an sshd standing for the instances, torchrun ranks, a killed control plane

SITE = "cloud-fleet"
WAIT_S = 240.0


@pytest.fixture(scope="module")
def cloud(env, image_sshd, tmp_path_factory):
    """The workspace's sites catalog with a cloud site that starts instances; its store holds the approved data."""
    ws, onprem, approved = env
    server, host_key = image_sshd
    instances_dir = tmp_path_factory.mktemp("instances")
    site = Site(name=SITE, kind="cloud", region="us-east-1", jurisdiction="EU", gpu_count=8,
                capacity_class="burst", price_per_gpu_hour=3.0, work_pool="cloud", store=onprem.store,
                instances={"region": "us-east-1", "endpoint_url": "http://placeholder", "image_id": "ami-12c6146b",
                           "instance_type": "c5.large", "username": server.host.username, "port": server.host.port,
                           "workdir": f"{instances_dir}/{{instance_id}}", "python": sys.executable,
                           "host_key": host_key, "max_instances": 4, "boot_timeout_s": 60,
                           "connect_timeout_s": 3, "command_timeout_s": 20, "reconnect_s": 30})
    return ws, onprem, site, approved, server, instances_dir


def with_endpoint(cloud, ec2) -> Site:
    """Write the catalog with this test's EC2 endpoint and subnet (the moto state is fresh per test)."""
    ws, onprem, site, *_ = cloud
    site = site.model_copy(update={"instances": site.instances.model_copy(
        update={"endpoint_url": ec2.url, "subnet_id": ec2.subnet_id})})
    catalog = SitesCatalog(apiVersion="hybridtrain/v1", sites=(onprem, site))
    ws.sites_file.parent.mkdir(parents=True, exist_ok=True)
    ws.sites_file.write_text(yaml.safe_dump(catalog.model_dump(mode="json")))
    return site


@pytest.fixture(scope="module")
def single(env, tmp_path_factory):
    """The same job trained by one process (world of one) on the same rows, same global batch and seed."""
    ws = env[0]
    data = ws.path("data/approved/churn-ssh")
    store = CheckpointStore.for_run(LocalObjectStore(tmp_path_factory.mktemp("single")), MULTI.name, "single")
    return Trainer(MULTI.model, MULTI.checkpoint, store, MULTI.data_schema.label, device="cpu", threads=1,
                   job=MULTI.name).fit(partitioned.read(data, ["train"]), partitioned.read(data, ["val"]))


def assert_close_weights(ws, model_uri: str, single) -> None:
    model, _ = Registry(ws.tracking_uri, ws.mlflow_artifacts).load_uri(model_uri)
    two = model.state_dict()
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)


def instance_records(ws, run_key: str) -> list[tuple[list[str], str]]:
    """(instances, outcome) of the audit log's cloud_instances records of ``run_key``."""
    return [(r.inputs["instances"], r.outcome) for r in AuditLog.in_workspace(ws.root).records()
            if r.action == "cloud_instances" and r.inputs["run_key"] == run_key]


def new_run(ws, name: str) -> tuple[Registry, str]:
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    return registry, registry.start_run(ws.experiment, name, {"test": name})


def test_a_two_node_job_on_a_cloud_site_starts_two_instances_trains_like_one_process_and_terminates_them(
        cloud, ec2, single):
    ws, _, _, approved, server, instances_dir = cloud
    with_endpoint(cloud, ec2)
    registry, run_id = new_run(ws, "cloud-together")
    lines: list[str] = []
    ssh = SshCredentials(private_key=SecretStr(server.private_key), known_hosts="")  # the hosts are pinned by the image key
    with Hypervisor(ec2, lambda i: instances_dir / i):
        # Placed on spot at a burst site (its spot price is an option): the instances follow the placement.
        out = train(ws, MULTI, approved, SITE, run_id, "cloud-together", ssh=ssh, on_line=lines.append,
                    capacity_class="opportunistic")
    assert (out.global_step, out.epochs_completed, out.resumed_from_step) == (EPOCHS * 16, EPOCHS, None)
    assert_close_weights(ws, out.model_uri, single)
    # Two instances were started for the job, trained on at their own addresses, and are gone now.
    assert len(out.instances) == 2 and ec2.states() == dict.fromkeys(out.instances, "terminated")
    assert registry.client.get_run(run_id).data.tags["cloud.instances"] == ",".join(out.instances)
    tags = ec2.tags(out.instances[0])
    assert tags["hybridtrain:job"] == f"{MULTI.name}-cloud-together" and tags["hybridtrain:mlflow-run"] == run_id
    assert datetime.fromisoformat(tags["hybridtrain:expires"]) > datetime.now(UTC) + timedelta(hours=MULTI.resources.max_hours)
    described = ec2.client.describe_instances(InstanceIds=list(out.instances))["Reservations"]
    assert {i.get("InstanceLifecycle") for r in described for i in r["Instances"]} == {"spot"}
    assert registry.client.get_run(run_id).data.tags["cloud.market"] == "spot"
    launched = next(x for x in lines if "launched on 2 nodes" in x)
    assert "127.0.0.4" in launched and "127.0.0.5" in launched and "rendezvous at 127.0.0.4:" in launched
    for instance in out.instances:  # each instance fetched its own data copy into its own workdir
        assert (instances_dir / instance / "data-copy").is_dir()
    assert instance_records(ws, "cloud-together") == [(out.instances, "terminated")]


def test_a_killed_control_plane_leaves_instances_that_the_resumed_attempt_terminates_before_it_starts_fresh_ones(
        cloud, ec2, single, tmp_path):
    ws, _, site, approved, server, instances_dir = cloud
    site = with_endpoint(cloud, ec2)
    _, run_id = new_run(ws, "cloud-killed")
    run_key = "cloud-killed"
    store = CheckpointStore.for_run(open_store(site.store, ws.root, CHECKPOINT_SUBDIR), MULTI.name, run_key)
    config = tmp_path / "child.json"
    config.write_text(json.dumps({"root": str(ws.root), "spec": MULTI.to_dict(), "approved": approved.model_dump(
        mode="json"), "site": SITE, "run_id": run_id, "run_key": run_key, "private_key": server.private_key}))
    log = tmp_path / "child.log"
    with Hypervisor(ec2, lambda i: instances_dir / i) as hypervisor:
        with open(log, "wb") as fh:
            child = subprocess.Popen([sys.executable, "-m", "tests.integration.cloud_train_child", str(config)],
                                     stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            wait_until(lambda: store.list() or child.poll() is not None, "a checkpoint of the first attempt",
                       timeout=WAIT_S, every=0.1)
            assert child.poll() is None, log.read_text()[-3000:]
            os.kill(child.pid, signal.SIGKILL)  # the control plane dies mid-run: nothing terminates its instances
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
        first = ec2.states()
        assert sorted(first.values()) == ["running", "running"], log.read_text()[-3000:]
        lines: list[str] = []
        started = time.monotonic()
        out = train(ws, MULTI, approved, SITE, run_id, run_key, on_line=lines.append,
                    ssh=SshCredentials(private_key=SecretStr(server.private_key), known_hosts=""))
        assert time.monotonic() - started < WAIT_S
    assert any(f"terminated {', '.join(sorted(first))}" in x or
               all(i in x for i in first) and "left running by an earlier attempt" in x for x in lines), lines
    assert set(first).isdisjoint(out.instances) and len(out.instances) == 2  # fresh instances for the resume
    assert ec2.states() == dict.fromkeys([*first, *out.instances], "terminated")
    assert hypervisor.stopped >= set(first)
    # Resumed from a checkpoint of the first attempt. Its ranks train on after the kill until this attempt
    # terminates them, so on a fast host they may have reached the last step's checkpoint (CI, 11-27: 480).
    assert out.resumed_from_step is not None and 0 < out.resumed_from_step <= EPOCHS * 16
    assert out.global_step == EPOCHS * 16
    assert_close_weights(ws, out.model_uri, single)
    records = instance_records(ws, run_key)
    assert [(sorted(ids), outcome) for ids, outcome in records] == [
        (sorted(first), "terminated: left running by an earlier attempt"), (sorted(out.instances), "terminated")]
