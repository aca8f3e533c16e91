"""Recovery end to end: the lifecycle survives a preemption signal and a lost site; crashed runs are resubmitted.

- SIGTERM to a real ``hybridtrain run`` process mid-training: the step ends, a checkpoint is
  written, the attempt is recorded as preempted (not failed), training resumes from it and the
  run completes; the wasted attempt is in the audit log and the cost ledger.
- A restricted job (its data may not leave on-prem) trains on an SSH host; its sshd is stopped
  mid-run: the site is lost, health says so, the cloud is healthy but forbidden by policy, so the
  run waits with a visible reason (MLflow tag, artifact) instead of failing over; when sshd is
  back it resumes on the same site from its checkpoint.
- A lifecycle run started from a deployment whose process is SIGKILLed (state CRASHED) is
  resubmitted once by the recovery flow with its run key, and resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridtrain.drill.processes import stop_with_children
from tests.fixtures.processes import flow_run_pids
from tests.fixtures.processes import wait_until as wait_for
from tests.fixtures.workspaces import build_workspace, checkpoint_steps, spec_writer

pytestmark = pytest.mark.slow
WAIT_S = 240.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    return wait_for(predicate, what, timeout=timeout, every=0.05)


def audit_records(root: Path) -> list[dict]:
    from hybridtrain.governance.audit_log import AuditLog

    return [r.model_dump(mode="json") if hasattr(r, "model_dump") else dict(r)
            for r in AuditLog.in_workspace(root).records()]


@pytest.fixture()
def workspace(prefect_server, pseudonym_key, tmp_path):
    return build_workspace(tmp_path / "ws")


def test_sigterm_mid_training_is_a_preemption_and_the_run_resumes_to_the_end(workspace, prefect_server):
    root = workspace
    spec = spec_writer(root)("preempt", model__epochs=20, checkpoint__interval_steps=25)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "HYBRIDTRAIN_HOME": str(root), "CI": "true"}
    out = root / "run.log"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "run", str(spec), "--run-key", "rk-pre",
                                 "--dispatch", "inline"], cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: any(s >= 25 for s in checkpoint_steps(root, "*", "churn", "rk-pre"))
                   or proc.poll() is not None, "a checkpoint at step >= 25")
        assert proc.poll() is None, out.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert rc == 0, text[-4000:]
    assert "preempted" in text, text[-3000:]  # the summary table lists the earlier attempt
    attempts = [r for r in audit_records(root) if r["action"] == "training_attempt"]
    assert [a["outcome"].split(":")[0] for a in attempts] == ["preempted", "succeeded"]
    step = attempts[0]["inputs"]["step"]
    assert step >= 25
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    run = Registry(ws.tracking_uri).job_runs(ws.experiment, "churn", limit=1)[0]
    record = json.loads(Registry(ws.tracking_uri).read_text(run.info.run_id, "ledger/run_record.json"))
    assert [a["outcome"] for a in record["attempts"]] == ["preempted", "succeeded"]
    trained = json.loads(Registry(ws.tracking_uri).read_text(run.info.run_id, "stages/train-stage.json"))["trained"]
    assert trained["resumed_from_step"] == step  # the checkpoint written on the notice, nothing lost


def test_a_job_whose_data_may_not_leave_waits_for_its_site_instead_of_failing_over(workspace, tmp_path):
    from blocks.register import register_sites, set_credentials
    from flows.lifecycle import lifecycle
    from hybridtrain.specs.sites import SitesCatalog
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace
    from tests.fixtures.processes import kill_job, start_sshd, stop_sshd

    root = workspace
    proc, server = start_sshd(tmp_path / "sshd-wait")
    data = yaml.safe_load((root / "deployments" / "sites.yaml").read_text())
    data["sites"][0]["hosts"] = [{**server.host.model_dump(mode="json"), "connect_timeout_s": 2,
                                  "command_timeout_s": 10, "reconnect_s": 3}]
    (root / "deployments" / "sites.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    register_sites(SitesCatalog.load(root / "deployments" / "sites.yaml"))
    set_credentials("onprem-dc1", ssh_private_key=server.private_key, ssh_known_hosts=server.known_hosts)
    spec = spec_writer(root)("stays", model__epochs=20, checkpoint__interval_steps=25,
                             data_policy__sensitivity="restricted", placement__site=None,
                             recovery__health_poll_s=0.5, recovery__wait_for_site_s=WAIT_S)
    ws = Workspace.resolve(root)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = lifecycle(spec_path=str(spec), workspace=str(root), run_key="rk-wait",
                                          dispatch="inline")
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(lambda: checkpoint_steps(root, "onprem-dc1", "churn", "rk-wait") or "error" in result,
                   "the first checkpoint on the SSH host")
        assert "error" not in result, result
        stop_sshd(proc)  # the gateway goes away, and with it the job running on it
        kill_job(server.host.workdir, "churn-rk-wait")

        def waiting() -> str:  # the lifecycle's MLflow run, still RUNNING (logging to it never ends it)
            runs = [r for r in Registry(ws.tracking_uri).recent_runs(ws.experiment, limit=5)
                    if r.data.tags.get("hybridtrain.job") == "churn" and r.info.status == "RUNNING"]
            return runs[0].data.tags.get("hybridtrain.waiting", "") if runs else ""

        reason = wait_until(lambda: waiting() or "error" in result, "the run to say it is waiting")
        assert "error" not in result, result
        assert "is waiting" in reason and "onprem-dc1" in reason and "cloud-eu" in reason
        assert "restricted" in reason or "policy" in reason.lower()
        assert not (root / ".hybridtrain" / "stores" / "cloud-eu" / "objects" / "checkpoints").exists()
        proc, _ = start_sshd(tmp_path / "sshd-wait", port=server.host.port)  # the same host is back
        t.join(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            stop_sshd(proc)
    assert not t.is_alive() and "error" not in result, result
    summary = result["summary"]
    assert summary.train_site == "onprem-dc1" if hasattr(summary, "train_site") else True
    train_row = next(s for s in summary.stages if s.stage == "train")
    assert train_row.site == "onprem-dc1" and "resumed from step" in train_row.detail
    assert not (root / ".hybridtrain" / "stores" / "cloud-eu" / "objects" / "checkpoints").exists()
    lost = [r for r in audit_records(root) if r["action"] == "training_attempt"]
    assert lost[0]["outcome"].startswith("site-lost") and lost[-1]["outcome"] == "succeeded"


def test_a_crashed_lifecycle_run_is_resubmitted_once_and_resumes(workspace, prefect_server, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from deployments.bootstrap import bootstrap
    from flows.recovery import RECOVERED, recover_runs
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace
    from tests.fixtures.processes import start_worker, wait_for_workers
    from tests.fixtures.workspaces import ROOT

    root = workspace
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    spec = spec_writer(root)("crash", model__epochs=20, checkpoint__interval_steps=25)
    ws = Workspace.resolve(root)
    bootstrap(ws)
    # The test server is ephemeral (no lease reaper): the resubmitted run frees the dead holder's
    # lease itself once it is REAP_AFTER_S old; a short one keeps this test short.
    monkeypatch.setenv("HYBRIDTRAIN_TRAIN_LEASE_REAP_S", "5")
    log = root / "worker-onprem.log"
    worker = start_worker("onprem", root, prefect_server, log)
    try:
        wait_for_workers(["onprem"], [worker], [log])
        run = run_deployment("training-lifecycle/churn-nightly-cloud-eu", timeout=0,
                             parameters={"spec_path": str(spec.relative_to(root)), "dispatch": "inline"})
        key = str(run.id)
        wait_until(lambda: any(s >= 25 for s in checkpoint_steps(root, "*", "churn", key)), "a checkpoint at >= 25")
        pids = wait_until(lambda: flow_run_pids(key), "the flow run's processes")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # the host dies under the run: no checkpoint on the way out

        with get_client(sync_client=True) as client:
            crashed = wait_until(lambda: (r := client.read_flow_run(run.id)).state.is_crashed() and r,
                                 "the worker to mark the run CRASHED")
            rows = recover_runs(workspace=str(root))
            mine = [r for r in rows if r["flow_run"] == key]
            assert len(mine) == 1 and mine[0]["action"].startswith("resubmitted"), rows
            assert not [r for r in recover_runs(workspace=str(root)) if r["flow_run"] == key]  # never twice
            assert RECOVERED in client.read_flow_run(run.id).tags
            new_id = mine[0]["resubmitted"]
            new = wait_until(lambda: (r := client.read_flow_run(new_id)).state.is_final() and r,
                             "the resubmitted run to finish")
        assert new.state.is_completed(), (new.state, log.read_text()[-3000:])
        assert new.parameters["run_key"] == key and f"recovered-from:{key}" in new.tags
        assert crashed.state.is_crashed()
        reg = Registry(ws.tracking_uri)
        runs = [r for r in reg.job_runs(ws.experiment, "churn", limit=5) if r.info.status == "FINISHED"]
        trained = json.loads(reg.read_text(runs[0].info.run_id, "stages/train-stage.json"))["trained"]
        killed_at = max(checkpoint_steps(root, "*", "churn", key))
        assert 25 <= trained["resumed_from_step"] <= killed_at and trained["run_key"] == key
        assert "freed the training lease of job 'churn'" in log.read_text()
    finally:
        stop_with_children(worker)
