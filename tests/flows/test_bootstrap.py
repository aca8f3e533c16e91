"""Bootstrap on a real Prefect server: pools, site blocks, the pseudonym key and deployments, idempotently."""

from __future__ import annotations

import pytest

from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.workspace import Workspace
from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = pytest.mark.slow


def forget_pools_and_site_blocks(ws: Workspace) -> None:
    """Start from a server that has never been bootstrapped: the session's Prefect server is shared by the
    test files of one worker, and others bootstrap it (with credentials) before this file may run."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    from blocks.site import SiteBlock
    from deployments.bootstrap import CONTROL_POOL

    catalog = SitesCatalog.load(ws.sites_file)
    with get_client(sync_client=True) as client:
        for pool in [*catalog.pools, CONTROL_POOL]:
            try:
                client.delete_work_pool(pool)
            except ObjectNotFound:
                pass
        try:
            docs = client.read_block_documents_by_type(SiteBlock.get_block_type_slug())
        except PrefectHTTPStatusError as exc:  # a fresh server: the block type is not registered yet
            if exc.response.status_code != 404:
                raise
            docs = []
        for doc in docs:
            client.delete_block_document(doc.id)


@pytest.fixture(scope="module")
def boot(prefect_server, tmp_path_factory):
    from deployments.bootstrap import bootstrap

    root = make_workspace(tmp_path_factory.mktemp("boot") / "ws")
    for pkg in ("flows", "tasks", "blocks", "workers"):
        # prefect deploy loads the entrypoint from the workspace, as a worker would.
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    ws = Workspace.resolve(root)
    forget_pools_and_site_blocks(ws)
    first = bootstrap(ws)
    second = bootstrap(ws)
    return ws, first, second


def test_pools_are_created_once_with_gpu_limits(boot):
    from prefect.client.orchestration import get_client

    ws, first, second = boot
    assert sorted(first.pools_created) == ["cloud", "control", "onprem"]
    assert second.pools_created == [] and sorted(second.pools_existing) == ["cloud", "control", "onprem"]
    with get_client(sync_client=True) as client:
        onprem = client.read_work_pool("onprem")
        cloud = client.read_work_pool("cloud")
        control = client.read_work_pool("control")
    assert onprem.type == cloud.type == control.type == "process"
    assert onprem.concurrency_limit == 8 and cloud.concurrency_limit == 16
    assert control.concurrency_limit is None  # the control flows never wait for a site's slot
    assert "command" in onprem.base_job_template["variables"]["properties"]


def test_site_blocks_round_trip_to_the_catalog(boot):
    from blocks.site import catalog_from_blocks

    ws, first, _ = boot
    catalog = SitesCatalog.load(ws.sites_file)
    assert first.site_blocks == catalog.names
    assert catalog_from_blocks(first.site_blocks) == catalog


def test_pseudonym_key_is_created_once_and_kept(boot):
    from prefect.blocks.system import Secret

    ws, first, second = boot
    assert second.key_created is False
    assert len(Secret.load(ws.pseudonym_key_block).get()) == 64


def test_deployments_have_pools_schedule_and_a_typed_spec_parameter(boot):
    from prefect.client.orchestration import get_client

    _, first, second = boot
    assert first.deployments == second.deployments
    assert {"training-lifecycle/churn-nightly-cloud-eu", "training-lifecycle/churn-from-cloud-pool"} <= set(first.deployments)
    with get_client(sync_client=True) as client:
        d = client.read_deployment_by_name("training-lifecycle/churn-nightly-cloud-eu")
        cloud = client.read_deployment_by_name("training-lifecycle/churn-from-cloud-pool")
    assert d.work_pool_name == "onprem" and cloud.work_pool_name == "cloud"
    assert [s.schedule.cron for s in d.schedules] == ["0 2 * * *"]
    props = d.parameter_openapi_schema["properties"]
    assert props["spec_path"]["default"] == "jobs/churn.yaml"
    assert "JobSpec" in str(props["spec"])  # the UI renders the spec as a typed form
    assert d.job_variables["env"]["HYBRIDTRAIN_HOME"]
    with get_client(sync_client=True) as client:
        control = [client.read_deployment_by_name(n) for n in ("burst-controller/control", "recover-runs/control")]
    for dep in control:  # one pass at a time: a pass due while the last one still runs is cancelled, not queued
        assert dep.work_pool_name == "control" and dep.global_concurrency_limit.limit == 1
        assert dep.concurrency_options.collision_strategy == "CANCEL_NEW"


def test_site_credentials_come_from_the_saved_blocks(boot):
    from blocks.site import SiteBlock, load_site_secrets

    ws, first, _ = boot
    catalog = SitesCatalog.load(ws.sites_file)
    keyed = SiteBlock.from_site(catalog.get(first.site_blocks[0]))
    keyed = keyed.model_copy(update={"name": "keyed-site", "aws_access_key_id": "AKIDKEYED",
                                     "aws_secret_access_key": "s3cr3t-keyed",
                                     "ssh_private_key": "-----BEGIN KEY-----",
                                     "ssh_known_hosts": "host ssh-ed25519 AAA"})
    keyed.save("keyed-site", overwrite=True)
    secrets = load_site_secrets(["keyed-site", first.site_blocks[1], "no-block-site"])
    assert list(secrets.sites) == ["keyed-site", first.site_blocks[1]]  # a site without a block has none
    got = secrets.sites["keyed-site"]
    assert got.aws_access_key_id == "AKIDKEYED" and got.aws_secret_access_key.get_secret_value() == "s3cr3t-keyed"
    assert got.ssh_private_key.get_secret_value() == "-----BEGIN KEY-----"
    assert got.ssh_known_hosts == "host ssh-ed25519 AAA"
    assert secrets.sites[first.site_blocks[1]].aws_secret_access_key is None


def test_no_site_has_credentials_before_the_block_type_is_registered(prefect_server, monkeypatch):
    from blocks.site import SiteBlock, load_site_secrets

    monkeypatch.setattr(SiteBlock, "_block_type_slug", "hybridtrain-site-never-registered")
    assert load_site_secrets(["onprem-dc1", "cloud-eu"]).sites == {}
