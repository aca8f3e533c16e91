"""Starting a multi-node job's cloud instances through a real EC2 API (moto server): all or none, tagged, terminated."""

from __future__ import annotations

import time

import pytest

from hybridtrain.drill.loopback import free_port
from hybridtrain.errors import SiteUnavailable, SpecError
from hybridtrain.remote.cloud_instances import JOB_TAG, SITE_TAG, provision, terminate_orphans
from hybridtrain.specs.sites import Site

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


def test_orphans_of_the_job_are_terminated_and_other_jobs_instances_are_left_alone(ec2):
    site = cloud_site(ec2)

    def run(job: str, site_name: str, n: int) -> list[str]:  # what an attempt killed after provisioning leaves
        tags = [{"Key": JOB_TAG, "Value": job}, {"Key": SITE_TAG, "Value": site_name}]
        out = ec2.client.run_instances(ImageId="ami-12c6146b", InstanceType="c5.large", MinCount=n, MaxCount=n,
                                       SubnetId=ec2.subnet_id,
                                       TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        return [i["InstanceId"] for i in out["Instances"]]

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
