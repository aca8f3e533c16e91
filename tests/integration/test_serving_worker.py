"""The serve-model deployment as users run it: deployed from prefect.yaml, started with `prefect deployment run`,
executed by a process worker of the on-prem pool against a served Prefect server, scoring over HTTP from a signed
release of a real MLflow model; a release switches it; `prefect flow-run cancel` stops it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import mlflow
import mlflow.pyfunc
import numpy as np
import pytest

from hybridtrain.drill.processes import stop_with_children
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.stages.promotion import releaser_for
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import start_worker, wait_for_workers, wait_until
from tests.fixtures.workspaces import ROOT, make_workspace
from tests.fixtures.record_models import MODEL, churn_records, register_version, release_bundle

pytestmark = pytest.mark.slow
DEPLOYMENT = "serve-model/onprem-serving"
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect(api: str, root: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "prefect", *args], check=False, cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PREFECT_API_URL": api, "HYBRIDTRAIN_HOME": str(root)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def flow_run(run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def test_serve_model_deployment_runs_in_the_pool_worker_and_serves_releases(prefect_server, tmp_path):
    from blocks.register import release_key_pem
    from deployments.bootstrap import bootstrap

    root = make_workspace(tmp_path / "ws")
    # The worker's flow process imports from the workspace root (its working directory): this checkout's code.
    for pkg in ("flows", "tasks", "blocks", "workers", "hybridtrain", "orchestration"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    ws = Workspace.resolve(root)
    bootstrap(ws, deploy=False)  # pools and blocks (the release signing key), as `make deploy`
    # `make deploy` then runs `prefect deploy --all`; the serving deployment alone, from the same file:
    prefect(prefect_server, root, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml",
            "--name", DEPLOYMENT)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    v1, v2 = register_version(registry, seed=0), register_version(registry, seed=1, champion=False)
    key = SigningKey.from_pem(release_key_pem(ws.release_key_block))  # the key promotion signs with
    bundles = {v: release_bundle(registry, v, tmp_path / "bundles" / v, key) for v in (v1, v2)}
    releaser = releaser_for(ws, load_spec(root / "jobs" / "churn.yaml"), ws.load_sites(), key.public)
    releaser.publish(bundles[v1])

    log = tmp_path / "worker-onprem.log"
    worker = start_worker("onprem", root, prefect_server, log)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_id = None
    try:
        wait_for_workers(["onprem"], [worker], [log])
        out = prefect(prefect_server, root, "deployment", "run", DEPLOYMENT, "--param", f"port={port}",
                      "--param", "poll_s=0.2", "--param", "host=127.0.0.1")
        run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)

        def up() -> bool:
            state = flow_run(run_id).state
            assert not state.is_final(), f"the serve-model run ended: {state}\n{log.read_text()[-3000:]}"
            try:
                return httpx.get(f"{url}/ping", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, "the served model to answer /ping", timeout=START_TIMEOUT_S, every=0.5)
        fr = flow_run(run_id)
        assert fr.work_pool_name == "onprem" and fr.state.is_running()

        frame = churn_records(6, seed=4)
        payload = {"dataframe_records": json.loads(frame.to_json(orient="records"))}
        mlflow.set_tracking_uri(ws.tracking_uri)
        r = httpx.post(f"{url}/invocations", json=payload, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["version"] == v1
        expected = mlflow.pyfunc.load_model(f"models:/{MODEL}/{v1}").predict(frame)
        np.testing.assert_allclose(r.json()["predictions"], expected, rtol=0, atol=1e-7)
        status = httpx.get(f"{url}/version", timeout=10).json()
        assert (status["version"], status["site"], status["target"]) == (v1, "onprem-dc1", "onprem-serving")

        bad = dict(payload["dataframe_records"][0], contract="lifetime")
        r = httpx.post(f"{url}/invocations", json={"dataframe_records": [bad]}, timeout=30)
        assert r.status_code == 400 and "lifetime" in r.json()["message"]

        releaser.publish(bundles[v2])  # a release moves the target's pointer; the running deployment follows
        wait_until(lambda: httpx.post(f"{url}/invocations", json=payload, timeout=30).json()["version"] == v2,
                   "the deployment to serve the new release", timeout=60, every=0.2)
        wait_until(lambda: f"switched v{v1} -> v{v2} at onprem-dc1" in [
            rec.outcome for rec in AuditLog.in_workspace(root).records() if rec.action == "serve"],
            "the switch's audit record (written right after the swap)", timeout=30, every=0.2)

        prefect(prefect_server, root, "flow-run", "cancel", run_id)
        final = wait_until(lambda: (s := flow_run(run_id).state).is_final() and s, "the cancelled run to end",
                           timeout=90, every=0.5)
        assert final.is_cancelled(), final

        def closed() -> bool:
            try:
                httpx.get(f"{url}/ping", timeout=2)
                return False
            except httpx.TransportError:
                return True

        wait_until(closed, "the server's port to close after the cancel", timeout=60, every=0.5)
        run_id = None
    finally:
        if run_id is not None:
            subprocess.run([sys.executable, "-m", "prefect", "flow-run", "cancel", run_id], check=False, capture_output=True,
                           timeout=60, env={**os.environ, "PREFECT_API_URL": prefect_server})
        stop_with_children(worker)
