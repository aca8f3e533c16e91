"""Multi-node jobs in the spec and in placement: N hosts at one site, priced together, rejected with the numbers."""

from __future__ import annotations

import pytest

from hybridtrain.errors import NoFeasiblePlacement, SpecError
from hybridtrain.placement.engine import decide
from hybridtrain.placement.node_fit import (
    held_hosts,
    host_key,
    host_shortfall,
    node_shortfall,
    pick_gpus,
    reserve_hosts,
    visible_devices,
)
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.request import request_from_spec
from hybridtrain.specs.job import load_spec, parse_spec
from hybridtrain.specs.sites import CloudInstances, SshHost
from tests.fixtures.placement_cases import CLOUD_EU, NOW, ONPREM, request, site
from tests.fixtures.workspaces import ROOT


def ssh(name: str, gpus: int) -> SshHost:
    return SshHost(hostname=name, username="train", gpus=gpus)


GPU1, GPU2, GPU3 = ssh("gpu1", 8), ssh("gpu2", 8), ssh("gpu3", 4)
DC = site("onprem-dc1", kind="onprem", gpus=20).model_copy(update={"hosts": (GPU1, GPU2, GPU3)})
FLEET = CloudInstances(region="r", image_id="ami-1", instance_type="p4d.24xlarge", gpus_per_instance=8,
                       username="ubuntu", max_instances=3,
                       host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHLlzJ1hWXMAHNd1YyA7qXJ0ybsN/c3nkDGKEeDXKCWk")
CLOUD_NODES = CLOUD_EU.model_copy(update={"instances": FLEET})  # cloud-eu as it starts instances


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.load(ROOT / "deployments" / "policy.yaml")


def test_nodes_default_to_one_and_the_request_counts_every_nodes_gpus():
    data = load_spec(ROOT / "jobs" / "churn.yaml").to_dict()
    assert parse_spec(data).resources.nodes == 1
    data["resources"].update(nodes=3, gpus=2)
    spec = parse_spec(data)
    req = request_from_spec(spec, dataset_bytes=0, now=NOW)
    assert (req.nodes, req.gpus, req.gpus_per_node) == (3, 6, 2)
    data["resources"]["nodes"] = 0
    with pytest.raises(SpecError) as bad:
        parse_spec(data)
    assert "resources.nodes" in str(bad.value)


def test_a_site_needs_n_hosts_with_the_per_node_gpus():
    assert node_shortfall(DC, 2, 8) is None
    assert node_shortfall(DC, 3, 4) is None
    assert node_shortfall(DC, 3, 8) == ("site onprem-dc1 has 2 SSH host(s) with >= 8 GPUs (1 more with fewer "
                                        "GPUs); the job needs 3 nodes")
    assert "lists no SSH hosts" in node_shortfall(ONPREM, 2, 1)
    assert node_shortfall(CLOUD_EU, 2, 4) == (
        "site cloud-eu lists no SSH hosts and starts no instances (it trains in the worker's process: 1 node); the "
        "job needs 2 nodes — add an instances: block to sites.cloud-eu or set resources.nodes: 1")
    assert node_shortfall(CLOUD_EU, 1, 4) is None


def test_gpus_are_picked_on_the_first_hosts_with_enough_free_and_the_lowest_indices_there():
    k1, k2, k3 = host_key(GPU1), host_key(GPU2), host_key(GPU3)
    busy1 = {k1: [6, 7]}  # gpu1 holds six GPUs for other jobs; gpu2 and gpu3 are free
    assert pick_gpus(DC, 1, 4, busy1) == {k2: (0, 1, 2, 3)}
    assert pick_gpus(DC, 1, 2, busy1) == {k1: (6, 7)}
    assert pick_gpus(DC, 2, 4, busy1) == {k2: (0, 1, 2, 3), k3: (0, 1, 2, 3)}
    assert list(pick_gpus(DC, 2, 4, {k1: [0, 2, 4, 6]})) == [k1, k2]  # catalog order; the first runs the rendezvous
    assert pick_gpus(DC, 1, 4, {k1: [7, 0, 5, 3]})[k1] == (0, 3, 5, 7)
    with pytest.raises(NoFeasiblePlacement) as none:
        pick_gpus(DC, 2, 8, {k1: [], k2: list(range(8)), k3: []})
    assert none.value.rejected["onprem-dc1"] == ("site onprem-dc1 has 1 free host(s) with >= 8 GPUs (3 hosts, "
                                                 "1 busy, 1 with fewer GPUs); the job needs 2")


def test_a_host_shortfall_is_what_no_wait_can_free_and_held_gpus_name_hosts_and_devices():
    assert host_shortfall(DC, 1, 8) is None and host_shortfall(DC, 3, 4) is None
    assert host_shortfall(DC, 1, 16) == ("site onprem-dc1 has 0 SSH host(s) with >= 16 GPUs (3 more with fewer GPUs); "
                                         "the job needs 1")
    assert host_shortfall(ONPREM, 4, 8) is None  # no SSH hosts: a local process, not judged here
    held = {host_key(GPU3): (1,), host_key(GPU1): (0, 2)}
    assert held_hosts(DC, held) == (GPU3, GPU1)
    assert visible_devices(held, GPU1) == {"CUDA_VISIBLE_DEVICES": "0,2"}
    assert visible_devices(held, GPU2) == {} and visible_devices(None, GPU1) == {}
    # A CPU job holds no GPU and sees none, rather than every GPU of the host (another job's among them).
    assert visible_devices(None, GPU1, cpu_only=True) == {"CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(ValueError, match="lists no host"):
        held_hosts(DC, {"x@y:22": (0,)})


def test_a_cloud_site_that_starts_instances_needs_max_instances_and_their_gpus():
    cloud = CLOUD_NODES
    assert node_shortfall(cloud, 3, 8) is None
    assert node_shortfall(cloud, 4, 8) == ("site cloud-eu starts at most 3 instance(s) for one job "
                                           "(sites.cloud-eu.instances.max_instances); the job needs 4 nodes")
    assert node_shortfall(cloud, 2, 16) == ("site cloud-eu's instances (p4d.24xlarge) have 8 GPU(s); the job needs "
                                            "16 per node")
    assert node_shortfall(ONPREM, 1, 1) is None  # one node: what every site could always do


def test_reserve_hosts_takes_free_hosts_in_catalog_order_and_says_why_not():
    got = reserve_hosts(DC, 2, 4, busy={host_key(GPU1)})
    assert got.hosts == (GPU2, GPU3) and got.rendezvous == GPU2 and got.nodes == 2
    with pytest.raises(NoFeasiblePlacement) as full:
        reserve_hosts(DC, 2, 8, busy={host_key(GPU2)}, job="big")
    assert full.value.rejected == {"onprem-dc1": "site onprem-dc1 has 1 free host(s) with >= 8 GPUs (3 hosts, 1 busy, "
                                                 "1 with fewer GPUs); the job needs 2"}


def test_placement_rejects_sites_without_n_hosts_and_prices_the_nodes_together(policy):
    one = decide(request(gpus=4, data_site="onprem-dc1", deadline=None), [ONPREM, CLOUD_NODES], policy, now=NOW)
    two = decide(request(gpus=8, nodes=2, data_site="onprem-dc1", deadline=None), [ONPREM, CLOUD_NODES], policy,
                 now=NOW)
    assert one.site == "onprem-dc1"
    assert two.site == "cloud-eu"
    rejected = {c.site: (c.rule, c.reason) for c in two.candidates if not c.allowed}
    assert rejected["onprem-dc1"] == ("spec resources.nodes", node_shortfall(ONPREM, 2, 4))
    one_cloud = decide(request(gpus=4, data_site="onprem-dc1", deadline=None), [CLOUD_NODES], policy, now=NOW)
    assert two.estimate.compute_usd == pytest.approx(2 * one_cloud.estimate.compute_usd)
    with_hosts = decide(request(gpus=16, nodes=2, data_site="onprem-dc1", deadline=None), [DC, CLOUD_NODES], policy,
                        now=NOW)
    assert with_hosts.site == "onprem-dc1"
    with pytest.raises(NoFeasiblePlacement) as nowhere:
        decide(request(gpus=24, nodes=3, data_site="onprem-dc1", deadline=None), [DC, CLOUD_NODES], policy, now=NOW)
    assert "site onprem-dc1 has 20 GPUs; the job needs 24 (3 nodes × 8)" in str(nowhere.value)
    # A cloud site that starts no instances trains in one process: placement refuses it, as the stage would.
    with pytest.raises(NoFeasiblePlacement) as no_fleet:
        decide(request(gpus=8, nodes=2, data_site="onprem-dc1", deadline=None), [ONPREM, CLOUD_EU], policy, now=NOW)
    assert "add an instances: block to sites.cloud-eu" in str(no_fleet.value)


@pytest.mark.parametrize("instances, words", [
    (False, ("site cloud-eu lists no SSH hosts and starts no instances, and a job of 2 nodes runs on several "
            "machines: add hosts to sites.cloud-eu.hosts (on-prem), an instances: block to sites.cloud-eu (cloud)")),
    (True, ("site cloud-eu trains on the instances it starts but its block holds no SSH key: run "
           "`hybridtrain credentials cloud-eu --ssh-key FILE`")),
])
def test_the_train_stage_says_what_a_multi_node_job_at_a_cloud_site_lacks(tmp_path, instances, words):
    import yaml

    from hybridtrain.datasets.dvc_repo import DatasetVersion
    from hybridtrain.stages.training import train
    from hybridtrain.workspace import Workspace

    catalog = yaml.safe_load((ROOT / "deployments" / "sites.yaml").read_text())
    if instances:
        catalog["sites"][1]["instances"] = {
            "region": "eu-west-1", "image_id": "ami-1", "instance_type": "p4d.24xlarge", "username": "ubuntu",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHLlzJ1hWXMAHNd1YyA7qXJ0ybsN/c3nkDGKEeDXKCWk"}
    (tmp_path / "deployments").mkdir()
    (tmp_path / "deployments" / "sites.yaml").write_text(yaml.safe_dump(catalog))
    data = load_spec(ROOT / "jobs" / "churn.yaml").to_dict()
    data["resources"].update(nodes=2)
    approved = DatasetVersion(path="data/approved/churn", md5="0" * 32 + ".dir", size=1, tier="approved",
                              site="cloud-eu")
    with pytest.raises(SpecError) as err:
        train(Workspace.resolve(tmp_path), parse_spec(data), approved, "cloud-eu", "run", "key")
    assert words in str(err.value)
