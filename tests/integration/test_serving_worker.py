"""The serve-model deployments as users run them: deployed from prefect.yaml, started with `prefect deployment run`,
executed by a process worker of each serving site's pool against a served Prefect server, scoring over HTTP from a signed
release of a real MLflow model; a release switches it; `prefect flow-run cancel` stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import mlflow
import mlflow.pyfunc
import numpy as np
import pytest

from hybridtrain.drill.loopback import free_port
from hybridtrain.drill.processes import stop_with_children
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.stages.promotion import releaser_for
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import start_worker, wait_for_workers, wait_until
from tests.fixtures.record_models import MODEL, churn_records, register_version, release_bundle
from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = pytest.mark.slow
DEPLOYMENTS = {"onprem": "serve-model/onprem-serving", "cloud": "serve-model/cloud-serving"}  # pool -> deployment
SERVES_AT = {"onprem": ("onprem-dc1", "onprem-serving"), "cloud": ("cloud-eu", "cloud-serving")}  # site, target
SERVES = [target for _, target in SERVES_AT.values()]
START_TIMEOUT_S = 180.0


def prefect(api: str, root: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "prefect", *args], check=False, cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PREFECT_API_URL": api, "HYBRIDTRAIN_HOME": str(root)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def flow_run(run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def test_serving_deployments_run_in_their_pools_workers_and_serve_releases(prefect_server, tmp_path):
    """onprem-serving in the on-prem pool's worker (a directory target) and cloud-serving in the cloud pool's
    worker (the cloud site's object store), as `make deploy` and `make worker` set them up."""
    from blocks.register import release_key_pem
    from deployments.bootstrap import bootstrap

    root = make_workspace(tmp_path / "ws")
    # The worker's flow process imports from the workspace root (its working directory): this checkout's code.
    for pkg in ("flows", "tasks", "blocks", "workers", "hybridtrain", "orchestration"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    ws = Workspace.resolve(root)
    bootstrap(ws, deploy=False)  # pools and blocks (the release signing key), as `make deploy`
    # `make deploy` then runs `prefect deploy --all`; the serving deployments alone, from the same file:
    prefect(prefect_server, root, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml",
            *(arg for d in DEPLOYMENTS.values() for arg in ("--name", d)))
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    v1, v2 = register_version(registry, seed=0), register_version(registry, seed=1, champion=False)
    key = SigningKey.from_pem(release_key_pem(ws.release_key_block))  # the key promotion signs with
    bundles = {v: release_bundle(registry, v, tmp_path / "bundles" / v, key) for v in (v1, v2)}
    releaser = releaser_for(ws, load_spec(root / "jobs" / "churn.yaml"), ws.load_sites(), key.public)
    assert {t.name for t in releaser.targets} == set(SERVES)
    releaser.publish(bundles[v1])  # to every target: the directory and the cloud store

    logs = {pool: tmp_path / f"worker-{pool}.log" for pool in DEPLOYMENTS}
    workers = {pool: start_worker(pool, root, prefect_server, logs[pool]) for pool in DEPLOYMENTS}
    urls = {pool: f"http://127.0.0.1:{free_port()}" for pool in DEPLOYMENTS}
    run_ids: dict[str, str] = {}
    try:
        wait_for_workers(list(DEPLOYMENTS), list(workers.values()), list(logs.values()))
        for pool, deployment in DEPLOYMENTS.items():
            out = prefect(prefect_server, root, "deployment", "run", deployment, "--param",
                          f"port={urls[pool].rsplit(':', 1)[1]}", "--param", "poll_s=0.2", "--param", "host=127.0.0.1")
            run_ids[pool] = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)

        def up(pool: str) -> bool:
            state = flow_run(run_ids[pool]).state
            assert not state.is_final(), f"the {pool} serve-model run ended: {state}\n{logs[pool].read_text()[-3000:]}"
            try:
                return httpx.get(f"{urls[pool]}/ping", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        for pool in DEPLOYMENTS:
            wait_until(lambda pool=pool: up(pool), f"the {pool} pool's served model to answer /ping",
                       timeout=START_TIMEOUT_S, every=0.5)
            fr = flow_run(run_ids[pool])
            assert fr.work_pool_name == pool and fr.state.is_running()

        frame = churn_records(6, seed=4)
        payload = {"dataframe_records": json.loads(frame.to_json(orient="records"))}
        mlflow.set_tracking_uri(ws.tracking_uri)
        expected = mlflow.pyfunc.load_model(f"models:/{MODEL}/{v1}").predict(frame)
        for pool, url in urls.items():
            r = httpx.post(f"{url}/invocations", json=payload, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["version"] == v1
            np.testing.assert_allclose(r.json()["predictions"], expected, rtol=0, atol=1e-7)
            status = httpx.get(f"{url}/version", timeout=10).json()
            assert (status["version"], status["site"], status["target"]) == (v1, *SERVES_AT[pool])

        bad = dict(payload["dataframe_records"][0], contract="lifetime")
        r = httpx.post(f"{urls['onprem']}/invocations", json={"dataframe_records": [bad]}, timeout=30)
        assert r.status_code == 400 and "lifetime" in r.json()["message"]

        releaser.publish(bundles[v2])  # a release moves each target's pointer; the running deployments follow
        for pool, url in urls.items():
            wait_until(lambda url=url: httpx.post(f"{url}/invocations", json=payload, timeout=30).json()["version"]
                       == v2, f"the {pool} deployment to serve the new release", timeout=60, every=0.2)
        for site in ("onprem-dc1", "cloud-eu"):
            wait_until(lambda site=site: f"switched v{v1} -> v{v2} at {site}" in [
                rec.outcome for rec in AuditLog.in_workspace(root).records() if rec.action == "serve"],
                f"the switch's audit record at {site} (written right after the swap)", timeout=30, every=0.2)

        for pool in DEPLOYMENTS:
            prefect(prefect_server, root, "flow-run", "cancel", run_ids[pool])
        for pool, url in urls.items():
            final = wait_until(lambda pool=pool: (s := flow_run(run_ids[pool]).state).is_final() and s,
                               f"the cancelled {pool} run to end", timeout=90, every=0.5)
            assert final.is_cancelled(), final

            def closed(url=url) -> bool:
                try:
                    httpx.get(f"{url}/ping", timeout=2)
                    return False
                except httpx.TransportError:
                    return True

            wait_until(closed, f"the {pool} server's port to close after the cancel", timeout=60, every=0.5)
            target = next(t for t in releaser.targets if t.name == SERVES_AT[pool][1])
            wait_until(lambda target=target: not list(target.meta.list(f"serving/{MODEL}/")),
                       f"the cancelled {pool} server's status to be removed from {target.name}", timeout=30, every=0.2)
            del run_ids[pool]
    finally:
        for run_id in run_ids.values():
            subprocess.run([sys.executable, "-m", "prefect", "flow-run", "cancel", run_id], check=False,
                           capture_output=True, timeout=60, env={**os.environ, "PREFECT_API_URL": prefect_server})
        for worker in workers.values():
            stop_with_children(worker)
