"""Serving: `hybridtrain serve` and `mlflow models serve` as real processes over HTTP, fed by real signed releases."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import mlflow
import mlflow.pyfunc
import numpy as np
import pytest

from hybridtrain.drill.loopback import free_port
from hybridtrain.governance.audit_key import workspace_log
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.serving import canary
from hybridtrain.specs.job import load_spec
from hybridtrain.stages.promotion import releaser_for
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.gate_cases import MODEL
from tests.fixtures.record_models import churn_records, register_version, release_bundle
from tests.fixtures.workspaces import make_workspace

START_TIMEOUT_S = 120


def wait_for(check, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def cli(*args: str, **kw) -> list[str]:
    return [sys.executable, "-m", "orchestration.cli", *args]


@contextmanager
def serving(ws_root: Path, target: str) -> Iterator[str]:
    """Run `hybridtrain serve TARGET --port 0` and yield its URL once it printed that it is serving."""
    proc = subprocess.Popen(cli("serve", target, "--spec", "jobs/churn.yaml", "--port", "0", "--poll", "0.2",
                                "--home", str(ws_root)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        try:
            first = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"`hybridtrain serve {target}` printed nothing in {START_TIMEOUT_S} s") from None
        assert first.startswith("serving "), first + proc.stderr.read()
        yield first.split(" at ")[1].split()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def records_payload(rows: int = 5, seed: int = 5) -> tuple[dict, object]:
    frame = churn_records(rows, seed=seed)
    return {"dataframe_records": json.loads(frame.to_json(orient="records"))}, frame


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = make_workspace(tmp_path_factory.mktemp("serve") / "ws")
    # A lifecycle has run here: the audit log's head is signed by the workspace's audit key, which every later
    # writer (serve and canary too) must sign with.
    workspace_log(root).append(actor="test", action="gate", subject=f"model {MODEL} v0", outcome="passed")
    ws = Workspace.resolve(root)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    versions = {
        "v1": register_version(registry, seed=0),
        "v2": register_version(registry, seed=1),
        "tampered": register_version(registry, seed=2, champion=False),
        "good_canary": register_version(registry, seed=0, champion=False),  # scores exactly like v1
        "bad_canary": register_version(registry, seed=0, champion=False, shift=4.0),  # scores everyone high
    }
    registry.move_champion(MODEL, versions["v1"])
    key = SigningKey.generate()
    ws.release_public_key.parent.mkdir(parents=True, exist_ok=True)
    ws.release_public_key.write_bytes(key.public.to_pem())
    bundles = {name: release_bundle(registry, v, tmp_path_factory.mktemp("bundles") / v, key)
               for name, v in versions.items()}
    spec = load_spec(root / "jobs" / "churn.yaml")
    releaser = releaser_for(ws, spec, ws.load_sites(), key.public)
    releaser.publish(bundles["v1"])
    mlflow.set_tracking_uri(ws.tracking_uri)
    mlflow.set_registry_uri(ws.tracking_uri)
    return {"root": root, "ws": ws, "registry": registry, "versions": versions, "bundles": bundles,
            "releaser": releaser, "targets": {t.name: t for t in releaser.targets}, "key": key}


@pytest.fixture(scope="module")
def onprem(env) -> Iterator[str]:
    with serving(env["root"], "onprem-serving") as url:
        yield url


def audit_outcomes(env) -> list[str]:
    return [r.outcome for r in AuditLog.in_workspace(env["root"]).records() if r.action in ("serve", "canary")]


def version_of(url: str) -> dict:
    return httpx.get(f"{url}/version", timeout=10).json()


def test_serves_the_current_version_and_scores_records(env, onprem):
    payload, frame = records_payload(8)
    r = httpx.post(f"{onprem}/invocations", json=payload, timeout=30)
    assert r.status_code == 200, r.text
    v1 = env["versions"]["v1"]
    assert r.json()["version"] == v1 and r.headers["x-model-version"] == v1
    expected = mlflow.pyfunc.load_model(f"models:/{MODEL}/{v1}").predict(frame)
    np.testing.assert_allclose(r.json()["predictions"], expected, rtol=0, atol=1e-7)

    status = version_of(onprem)
    assert (status["version"], status["site"], status["target"]) == (v1, "onprem-dc1", "onprem-serving")
    served = list((env["targets"]["onprem-serving"].root / "serving" / MODEL).glob("onprem-dc1-*.json"))
    assert len(served) == 1 and json.loads(served[0].read_text())["version"] == v1
    assert f"serving v{v1} at onprem-dc1" in audit_outcomes(env)


@pytest.mark.parametrize("change, needle", [
    (lambda recs: [r.pop("contract") for r in recs], "contract"),  # the column is missing
    (lambda recs: recs[1].update(monthly_charges="lots"), "monthly_charges"),
    (lambda recs: recs[1].update(payment_method="barter"), "barter"),
])
def test_bad_records_get_a_400_naming_the_problem(onprem, change, needle):
    payload, _ = records_payload(2)
    change(payload["dataframe_records"])
    r = httpx.post(f"{onprem}/invocations", json=payload, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"]
    assert "Traceback" not in r.text


def test_release_and_rollback_switch_versions_without_dropping_requests(env, onprem):
    v1, v2 = env["versions"]["v1"], env["versions"]["v2"]
    payload, _ = records_payload(1)
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                r = client.post(f"{onprem}/invocations", json=payload)
                seen.append((r.status_code, r.headers.get("x-model-version")))

    t = threading.Thread(target=hammer)
    t.start()
    try:
        env["releaser"].publish(env["bundles"]["v2"])
        wait_for(lambda: version_of(onprem)["version"] == v2, what="the server to switch to v2")
        wait_for(lambda: seen and seen[-1][1] == v2, what="a request answered by v2")
        env["releaser"].restore(MODEL, v1)
        wait_for(lambda: version_of(onprem)["version"] == v1, what="the server to roll back to v1")
        n = len(seen)
        wait_for(lambda: len(seen) > n + 3, what="requests after the rollback")
    finally:
        stop.set()
        t.join()
    assert seen and all(code == 200 for code, _ in seen), [s for s in seen if s[0] != 200][:3]
    order = [v for _, v in seen]
    first_v2, last_v2 = order.index(v2), len(order) - 1 - order[::-1].index(v2)
    assert set(order[:first_v2]) == {v1} and set(order[first_v2:last_v2 + 1]) == {v2}
    assert set(order[last_v2 + 1:]) == {v1}
    outcomes = audit_outcomes(env)
    assert f"switched v{v1} -> v{v2} at onprem-dc1" in outcomes
    assert f"switched v{v2} -> v{v1} at onprem-dc1" in outcomes


def test_object_store_target_serves_at_the_cloud_site_and_refuses_tampered_bundles(env):
    cloud = env["targets"]["cloud-serving"]
    v1, bad = env["versions"]["v1"], env["versions"]["tampered"]
    cloud.accept(env["bundles"]["tampered"])
    key = f"versions/{MODEL}/{bad}/weights/artifacts/network.pt"
    blob = bytearray(cloud.store.get_bytes(key))
    blob[len(blob) // 2] ^= 0xFF
    cloud.store.put_bytes(key, bytes(blob))

    cloud.set_current(MODEL, bad)
    out = subprocess.run(cli("serve", "cloud-serving", "--spec", "jobs/churn.yaml", "--port", "0",
                             "--home", str(env["root"])), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.startswith("error: model bundle"), out.stderr
    assert "weights/artifacts/network.pt: content changed since signing" in out.stderr
    assert "Traceback" not in out.stderr

    cloud.set_current(MODEL, v1)
    with serving(env["root"], "cloud-serving") as url:
        status = version_of(url)
        assert (status["version"], status["site"]) == (v1, "cloud-eu")
        cloud.set_current(MODEL, bad)
        refused = wait_for(lambda: version_of(url)["refused"], what="the tampered version to be refused")
        assert refused["version"] == bad and any("network.pt" in p for p in refused["problems"])
        payload, _ = records_payload(2)
        r = httpx.post(f"{url}/invocations", json=payload, timeout=30)
        assert r.status_code == 200 and r.json()["version"] == v1
        cloud.set_current(MODEL, v1)
    assert any(o.startswith(f"refused: bundle does not verify; still serving v{v1}") for o in audit_outcomes(env))


def _canary(env, version: str) -> None:
    # A loose latency limit: on a shared 2-core machine the p99 of 20 requests is one scheduler hiccup.
    out = subprocess.run(cli("canary", "onprem-serving", version, "--spec", "jobs/churn.yaml", "--share", "0.5",
                             "--max-p99-ratio", "20", "--min-requests", "20", "--home", str(env["root"])),
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr


def _drive_until_concluded(url: str) -> list[str]:
    payload, _ = records_payload(3)
    wait_for(lambda: version_of(url)["canary"] is not None, what="the server to pick up the canary")
    versions = []
    with httpx.Client(timeout=30) as client:
        for _ in range(400):
            r = client.post(f"{url}/invocations", json=payload)
            assert r.status_code == 200, r.text
            versions.append(r.json()["version"])
            if version_of(url)["canary"] is None:
                return versions
    raise AssertionError("the canary was not concluded after 400 requests")


def test_canary_of_a_healthy_version_is_promoted_by_the_server(env, onprem):
    good, v1 = env["versions"]["good_canary"], env["versions"]["v1"]
    env["releaser"].stage(env["bundles"]["good_canary"])  # every target holds it; none serves it yet
    _canary(env, good)
    versions = _drive_until_concluded(onprem)
    assert {v1, good} <= set(versions)
    verdicts = [(r.outcome, r.inputs.get("reasons")) for r in AuditLog.in_workspace(env["root"]).records()
                if r.action == "canary"]
    assert verdicts and verdicts[-1][0].startswith("promoted:"), verdicts
    wait_for(lambda: version_of(onprem)["version"] == good, what="the promoted canary to be served")
    assert env["targets"]["onprem-serving"].current(MODEL) == good
    assert env["targets"]["cloud-serving"].current(MODEL) == v1  # a canary goes to one target only
    outcomes = audit_outcomes(env)
    assert any(o.startswith("started: 50% of onprem-serving") for o in outcomes)
    assert f"promoted: onprem-serving serves v{good} (was v{v1})" in outcomes


def test_canary_whose_scores_shift_is_rolled_back_by_the_server(env, onprem):
    bad = env["versions"]["bad_canary"]
    current = version_of(onprem)["version"]
    env["releaser"].stage(env["bundles"]["bad_canary"])
    _canary(env, bad)
    # While the audit log cannot take the verdict's record, nothing moves and every request is still served.
    wait_for(lambda: version_of(onprem)["canary"] is not None, what="the server to pick up the canary")
    audit_dir = env["root"] / ".hybridtrain" / "audit"
    aside = audit_dir.with_name("audit-aside")
    audit_dir.rename(aside)
    audit_dir.write_text("a file where the audit log's directory belongs\n")
    try:
        payload, _ = records_payload(3)
        with httpx.Client(timeout=30) as client:
            for _ in range(120):  # ~60 per version: three times the canary's --min-requests
                r = client.post(f"{onprem}/invocations", json=payload)
                assert r.status_code == 200, r.text
        assert version_of(onprem)["canary"]["version"] == bad
        assert canary.plan_of(env["targets"]["onprem-serving"], MODEL).version == bad
        assert env["targets"]["onprem-serving"].current(MODEL) == current
    finally:
        audit_dir.unlink()
        aside.rename(audit_dir)
    _drive_until_concluded(onprem)
    assert version_of(onprem)["version"] == current
    assert env["targets"]["onprem-serving"].current(MODEL) == current
    records = [r for r in AuditLog.in_workspace(env["root"]).records() if r.action == "canary"]
    assert records[-1].outcome == f"rolled back: onprem-serving keeps v{current}"
    assert any("shifted" in reason for reason in records[-1].inputs["reasons"])


def test_mlflow_models_serve_scores_records_of_the_champion(env, tmp_path):
    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow_bin), "models", "serve", "--env-manager", "local", "-m",
                             f"models:/{MODEL}@champion", "--host", "127.0.0.1", "-p", str(port), "-w", "1"],
                            # It runs `uvicorn` from PATH, as in an activated virtualenv.
                            env={**os.environ, "MLFLOW_TRACKING_URI": env["ws"].tracking_uri,
                                 "PATH": f"{mlflow_bin.parent}{os.pathsep}{os.environ.get('PATH', '')}"},
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "mlflow.log", "w"),
                            start_new_session=True)  # its uvicorn workers are children: stop the whole group
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-3000:]
            try:
                return httpx.get(f"{url}/ping", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout=START_TIMEOUT_S, what="mlflow models serve to answer /ping")
        payload, frame = records_payload(4)
        r = httpx.post(f"{url}/invocations", json=payload, timeout=30)
        assert r.status_code == 200, r.text
        champion = env["registry"].by_alias(MODEL, "champion").version
        expected = mlflow.pyfunc.load_model(f"models:/{MODEL}/{champion}").predict(frame)
        np.testing.assert_allclose(r.json()["predictions"], expected, rtol=0, atol=1e-7)
        payload["dataframe_records"][0]["contract"] = "lifetime"
        r = httpx.post(f"{url}/invocations", json=payload, timeout=30)
        assert r.status_code == 400 and "lifetime" in r.json()["message"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
