"""The lifecycle across two work pools with real process workers, a real sshd and a real S3 server.

Sites: ``onprem-dc1`` trains on an SSH host (the session's sshd on loopback) and keeps its store
in a directory; ``cloud-eu`` keeps its store in S3 (moto over HTTP) and trains in its worker.
Credentials live only in the site blocks. Preprocessing runs in the pool of the data's site and
training in the pool of the placed site — first on-prem → cloud, then the reverse.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import start_worker, wait_for_workers
from tests.fixtures.workspaces import ROOT, build_workspace, spec_writer

pytestmark = pytest.mark.slow
BUCKET = "hybridtrain-pools"
def write_sites(root: Path, sshd, endpoint: str) -> None:
    data = yaml.safe_load((root / "deployments" / "sites.yaml").read_text())
    onprem, cloud = data["sites"]
    onprem["hosts"] = [{**sshd.host.model_dump(mode="json"), "gpus": 1}]  # a GPU job there holds it (gpu_lease)
    onprem["store"] = {"kind": "local", "path": str(root / ".hybridtrain" / "stores" / "onprem-dc1")}
    cloud["store"] = {"kind": "s3", "bucket": BUCKET, "prefix": "cloud-eu", "endpoint_url": endpoint}
    (root / "deployments" / "sites.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def pools(prefect_server, pseudonym_key, sshd, s3_server, tmp_path_factory):
    import boto3

    from blocks.register import set_credentials
    from deployments.bootstrap import bootstrap

    s3_server.reset()
    boto3.client("s3", endpoint_url=s3_server.url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    base = tmp_path_factory.mktemp("pools")
    root = build_workspace(base / "ws", rows=3000)
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    write_sites(root, sshd, s3_server.url)
    ws = Workspace.resolve(root)
    bootstrap(ws)
    set_credentials("onprem-dc1", ssh_private_key=sshd.private_key, ssh_known_hosts=sshd.known_hosts)
    set_credentials("cloud-eu", aws_access_key_id="testing", aws_secret_access_key="testing")
    logs = [base / "worker-onprem.log", base / "worker-cloud.log"]
    procs = [start_worker("onprem", root, prefect_server, logs[0]), start_worker("cloud", root, prefect_server, logs[1])]
    try:
        wait_for_workers(["onprem", "cloud"], procs, logs)
        yield {"ws": ws, "write": spec_writer(root), "logs": logs, "sshd": sshd}
    finally:
        # A worker's graceful stop is not under test; in a long session it sometimes took 30 s.
        stop_with_children(*procs)


def stage_runs(summary) -> dict[str, str]:
    """Stage flow name -> work pool of its (last) run for this lifecycle."""
    from prefect.client.orchestration import get_client

    out = {}
    with get_client(sync_client=True) as client:
        for fr in client.read_flow_runs():
            if fr.parameters.get("run_id") == summary.mlflow_run_id and fr.work_pool_name:
                out[client.read_flow(fr.flow_id).name] = fr.work_pool_name
                assert fr.state.is_completed(), (fr.name, fr.state)
    return out


def cloud_gpus_held() -> int:
    """Slots of cloud-eu's ``gpu_count`` limit held now (by any test's run on this server)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from orchestration.gpu_lease import site_limit_name

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(site_limit_name("cloud-eu")).active_slots
        except ObjectNotFound:
            return 0


def test_preprocess_on_prem_train_in_the_cloud(pools):
    from flows.lifecycle import lifecycle

    # Two GPUs at a site without SSH hosts: two processes under torchrun on the cloud worker's machine.
    spec = pools["write"]("to-cloud", placement__site="cloud-eu", resources__gpus=2)
    held_before = cloud_gpus_held()
    summary = lifecycle(spec_path=str(spec), workspace=str(pools["ws"].root), dispatch="pools")
    assert stage_runs(summary) == {"prepare-data": "onprem", "sync-data": "onprem", "train-stage": "cloud"}
    assert summary.sync_route == "onprem-dc1->cloud-eu" and summary.bytes_synced > 0
    import boto3

    s3 = boto3.client("s3", endpoint_url=_endpoint(pools), aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="cloud-eu/").get("Contents", [])]
    assert any("/dvc/files/md5/" in k for k in keys), "approved data not in the cloud store"
    assert any("/objects/checkpoints/churn/" in k for k in keys), "no checkpoints in the cloud store"
    # The cloud worker's training held one of cloud-eu's GPUs (a site without SSH hosts lends its gpu_count)
    # and gave it back: its holder record is gone and no more slots are held than before it.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from orchestration.gpu_lease import _holders

    with get_client(sync_client=True) as client:
        train = next(fr for fr in client.read_flow_runs() if fr.parameters.get("run_id") == summary.mlflow_run_id
                     and client.read_flow(fr.flow_id).name == "train-stage")
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[train.id])), limit=200)]
    # The train run the lifecycle queued carries its placement, due time included (churn.yaml: due 6 h after
    # it was placed), as the burst controller and every queue snapshot read it.
    from orchestration.queues import PoolRun

    tagged = PoolRun(str(train.id), "COMPLETED", "Completed", None, {}, None, None, None, tags=tuple(train.tags))
    assert tagged.run_hours is not None and tagged.due is not None, train.tags
    placed_by = train.created.timestamp()
    assert placed_by - 15 * 60 <= tagged.due - 6 * 3600 <= placed_by + 60, (train.created, train.tags)
    gpu_count = pools["ws"].load_sites().get("cloud-eu").gpu_count
    assert f"holding 2 of its {gpu_count} GPUs at site cloud-eu" in logs
    assert any("2 process(es)" in line for line in logs) and any(line.startswith("train epoch 1/") for line in logs)
    assert summary.training["device"] == "cpu"  # gloo ranks: this machine has no CUDA
    assert not [r for _, r in _holders() if r.get("flow_run") == str(train.id)]
    assert cloud_gpus_held() <= held_before, _holders()


def _endpoint(pools) -> str:
    return yaml.safe_load((pools["ws"].root / "deployments" / "sites.yaml").read_text())["sites"][1]["store"][
        "endpoint_url"]


def test_the_reverse_preprocess_in_the_cloud_train_on_prem_over_ssh(pools):
    from flows.lifecycle import lifecycle
    from hybridtrain import stages
    ws = pools["ws"]
    from blocks.site import with_site_secrets

    secret_ws = with_site_secrets(ws)
    sites = secret_ws.load_sites()
    repo = stages.workspace_repo(secret_ws, sites, "onprem-dc1")
    raw = repo.version("data/raw/churn.csv", "raw", "cloud-eu")
    repo.push(raw, "cloud-eu")  # the raw data of this job lives in the cloud site's store
    spec = pools["write"]("to-onprem", dataset__site="cloud-eu", placement__site="onprem-dc1",
                          metadata__name="reverse", registry__model_name="reverse-model")
    summary = lifecycle(spec_path=str(spec), workspace=str(ws.root), dispatch="pools")
    assert stage_runs(summary) == {"prepare-data": "cloud", "sync-data": "cloud", "train-stage": "onprem"}
    assert summary.sync_route == "cloud-eu->onprem-dc1"
    assert [s.site for s in summary.stages if s.stage == "train"] == ["onprem-dc1"]
    # Training ran on the SSH host: its job directory and complete log are there.
    jobs = list(Path(pools["sshd"].host.workdir).glob("jobs/reverse-*"))
    assert jobs, "no job directory on the SSH host"
    assert "epoch" in (jobs[0] / "log").read_text()
    # The onprem worker held the host's one GPU while the job trained on it, and gave it back.
    from prefect.client.orchestration import get_client

    from hybridtrain.placement.node_fit import host_key
    from orchestration.gpu_lease import gpu_limit_name

    assert "CUDA_VISIBLE_DEVICES=0 " in (jobs[0] / "run.sh").read_text()
    with get_client(sync_client=True) as client:
        gpu = client.read_global_concurrency_limit_by_name(gpu_limit_name("onprem-dc1", host_key(pools["sshd"].host), 0))
    assert gpu.limit == 1 and gpu.active_slots == 0
