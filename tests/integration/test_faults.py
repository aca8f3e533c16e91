"""Fault drills with real processes, real signals and real servers: kill -9, SIGTERM, a stopped S3 server, SIGTERM
through SSH + torchrun, a stopped sshd. Each ends where an uninterrupted run ends, weight for weight.

How each fault is injected:

- kill -9: a training subprocess (``tests.integration.fault_worker``) is SIGKILLed once a checkpoint
  past step ``MID`` is in its store (the store is polled); a new process resumes.
- SIGTERM: the same subprocess gets SIGTERM at the same point; it must exit ``EXIT_PREEMPTED``
  within the grace with a verified checkpoint; the run moves to another store (``copy_latest``).
- S3 stopped: a second moto endpoint is stopped from botocore's ``before-send`` hook — right
  before the manifest's PutObject of one checkpoint, or before the second part of a multipart
  checkpoint upload — and restarted by the store's ``on_retry`` callback or by the test.
- SSH + torchrun: the job's process group on the host (the wrapper and torchrun) gets SIGTERM over
  a second SSH connection once the first epoch is logged, as a pool shutting down would do.
- sshd stopped: a throwaway sshd is stopped (listener and connections) once the first epoch is
  logged; its host's job is killed with it (the host is gone).

The corrupt-newest-checkpoint case is covered where the store is: ``tests/model/test_trainer.py``
(local), ``tests/integration/test_s3_store.py`` (S3) and ``tests/unit/test_checkpoint_copy.py``
(skipped when moving a run).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DvcRepo
from hybridtrain.errors import EXIT_PREEMPTED, Preempted, SiteUnavailable, is_retryable
from hybridtrain.placement.engine import HEALTH_RULE, Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.request import ResourceRequest
from hybridtrain.remote.remote_training import ssh_train
from hybridtrain.remote.site_health import check_site, unavailable
from hybridtrain.remote.ssh_site import SshSite, Timeouts
from hybridtrain.specs.job import Sensitivity, parse_spec
from hybridtrain.specs.sites import LocalStore, Site
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.s3 import MiB, S3ObjectStore, S3Options
from hybridtrain.training.checkpoint import CheckpointInfo, CheckpointStore
from hybridtrain.training.preemption import PreemptionReport
from hybridtrain.training.trainer import Trainer
from hybridtrain.workspace import Workspace
from tests.fixtures.processes import job_dir, kill_job, start_sshd, stop_sshd, wait_until
from tests.fixtures.training_data import (
    EVERY_10,
    LABEL,
    SPEC,
    TOTAL_STEPS,
    TRAIN,
    VAL,
    assert_same_weights,
    churn_frame,
)
from tests.fixtures.workspaces import ROOT
from tests.integration.fault_worker import setup

pytestmark = pytest.mark.slow  # real sshd, S3 server and killed training processes

WAIT_S = 90.0  # bound on every wait for a process or a job in this file
GRACE_S = 10.0
# The worker's run: 20000 rows / batch 64 = 313 steps per epoch, 4 epochs; a checkpoint every 25.
WORKER = {"rows": 20000, "epochs": 4, "batch_size": 64, "interval_steps": 25, "grace_s": GRACE_S}
WORKER_STEPS = 4 * 313
MID = 150  # faults strike once a checkpoint at this step or later exists: ~1100 steps (seconds) before the end
FAST_S3 = S3Options(connect_timeout_s=1, read_timeout_s=5, request_attempts=1, attempts=3, backoff_s=0.05,
                    backoff_max_s=0.2, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=2)
FAST_SSH = Timeouts(connect=3, command=20, reconnect=3)


# -- training subprocesses ----------------------------------------------------------------------------


def worker_config(tmp_path: Path, name: str, store: Path) -> dict[str, Any]:
    return {**WORKER, "store": str(store), "out": str(tmp_path / name)}


def start_worker(config: dict[str, Any]) -> tuple[subprocess.Popen, Path]:
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps(config))
    log = open(out / "log", "wb")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.fault_worker", str(path)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return proc, out


def finish(proc: subprocess.Popen, out: Path, timeout: float = WAIT_S) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def run_store(store: Path) -> CheckpointStore:
    return CheckpointStore.for_run(LocalObjectStore(store), "churn", "run", keep_last=3)


def checkpoint_at_least(store: CheckpointStore, step: int, proc: subprocess.Popen, out: Path) -> CheckpointInfo:
    def found() -> CheckpointInfo | None:
        assert proc.poll() is None, f"the worker ended early ({proc.returncode}):\n{(out / 'log').read_text()}"
        done = [c for c in store.list() if c.step >= step]
        return done[-1] if done else None

    return wait_until(found, f"a checkpoint at step >= {step}")


@pytest.fixture(scope="module")
def worker_reference(tmp_path_factory):
    """The worker's run, uninterrupted, in this process."""
    trainer, train, val = setup(worker_config(tmp_path_factory.mktemp("ref"), "ref",
                                              tmp_path_factory.mktemp("ref-store")))
    return trainer.fit(train, val)


def finished_result(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "result.json").read_text()), torch.load(out / "weights.pt", weights_only=True)


def assert_same_state(state: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    expected = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), f"parameter {name} differs"


def test_kill_9_mid_training_then_a_new_process_ends_with_the_same_weights(tmp_path, worker_reference):
    store = tmp_path / "store"
    proc, out = start_worker(worker_config(tmp_path, "first", store))
    try:
        seen = checkpoint_at_least(run_store(store), MID, proc, out)
        proc.send_signal(signal.SIGKILL)
    finally:
        status = finish(proc, out)
    assert status == -signal.SIGKILL and not (out / "result.json").exists()
    _, info = run_store(store).latest_valid()
    assert MID <= seen.step <= info.step < WORKER_STEPS  # whatever was being written when it died is ignored

    proc, out = start_worker(worker_config(tmp_path, "second", store))
    assert finish(proc, out) == 0, (out / "log").read_text()
    result, weights = finished_result(out)
    assert result["resumed_from_step"] == info.step and result["global_step"] == WORKER_STEPS
    assert_same_state(weights, worker_reference.model)  # bit-identical on the CPU
    assert result["history"] == worker_reference.history


def test_sigterm_checkpoints_within_the_grace_exits_75_and_resumes_at_another_store(tmp_path, worker_reference):
    here, there = tmp_path / "site-a", tmp_path / "site-b"
    proc, out = start_worker(worker_config(tmp_path, "first", here))
    try:
        checkpoint_at_least(run_store(here), MID, proc, out)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=GRACE_S)  # TimeoutExpired here would be a missed grace
        took = time.monotonic() - sent
    finally:
        finish(proc, out)
    assert status == EXIT_PREEMPTED, (out / "log").read_text()
    assert took < GRACE_S
    report = PreemptionReport.read(out)
    assert report.reason == "SIGTERM" and report.within_grace and report.seconds_after_notice < GRACE_S
    assert MID <= report.step < WORKER_STEPS and report.grace_s == GRACE_S
    state, info = run_store(here).latest_valid()  # complete, and its SHA-256 matches the manifest
    assert (info.step, info.key) == (report.step, report.checkpoint)
    assert state["progress"]["global_step"] == report.step
    assert report.checkpoint_uri.endswith(report.checkpoint)

    copy = run_store(here).copy_latest(run_store(there))
    assert copy.source == info and copy.bytes > info.size
    proc, out = start_worker(worker_config(tmp_path, "elsewhere", there))
    assert finish(proc, out) == 0, (out / "log").read_text()
    result, weights = finished_result(out)
    assert result["resumed_from_step"] == report.step and result["global_step"] == WORKER_STEPS
    assert_same_state(weights, worker_reference.model)
    assert [c.step for c in run_store(here).list()][-1] == report.step  # the first site's store is untouched


# -- S3 stopped during a checkpoint upload ----------------------------------------------------------------


@pytest.fixture
def flaky_s3(s3):
    """A second moto endpoint (same in-process state as ``s3``) that a test may stop and start."""
    from tests.fixtures.s3_server import MotoS3Server

    server = MotoS3Server()
    server.start()
    yield server
    server.close()


def stop_before(client: Any, operation: str, server: Any, when: Callable[[str], bool]) -> threading.Event:
    """Stop ``server`` right before the first ``operation`` request whose URL satisfies ``when``."""
    stopped = threading.Event()
    lock = threading.Lock()

    def hook(request: Any, **kwargs: Any) -> None:
        with lock:
            if not stopped.is_set() and when(request.url):
                stopped.set()
                server.stop()

    client.meta.events.register(f"before-send.s3.{operation}", hook)
    return stopped


def test_s3_stopped_before_a_manifest_leaves_no_partial_checkpoint_and_the_retry_resumes(s3, flaky_s3,
                                                                                         reference):
    flaky = s3.store("site").model_copy(update={"endpoint_url": flaky_s3.url})
    store = CheckpointStore.for_run(S3ObjectStore(flaky, site="cloud-test", options=FAST_S3), "churn", "run")
    stopped = stop_before(store.store.client, "PutObject", flaky_s3, lambda url: "ckpt-000000000020-000.json" in url)
    trainer = Trainer(SPEC, EVERY_10, store, LABEL, device="cpu", threads=1, job="churn")
    with pytest.raises(SiteUnavailable) as err:
        trainer.fit(TRAIN, VAL)
    assert stopped.is_set() and err.value.site == "cloud-test" and is_retryable(err.value)
    assert "ckpt-000000000020-000.json" in str(err.value)

    # While it is down nothing can be read; once it is back, the data of step 20 is there without a
    # manifest, which no reader counts.
    flaky_s3.start()
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert any(k.endswith("ckpt-000000000020-000.pt") for k in keys)
    assert not any(k.endswith("ckpt-000000000020-000.json") for k in keys)
    again = CheckpointStore.for_run(S3ObjectStore(flaky, site="cloud-test", options=FAST_S3), "churn", "run")
    assert [c.step for c in again.list()] == [10] and again.latest_valid()[1].step == 10
    # The retry of the stage resumes from step 10 and ends where an uninterrupted run ends.
    resumed = Trainer(SPEC, EVERY_10, again, LABEL, device="cpu", threads=1, job="churn").fit(TRAIN, VAL)
    assert resumed.resumed_from_step == 10 and resumed.global_step == TOTAL_STEPS
    assert_same_weights(resumed.model, reference[0].model)
    assert [c.step for c in again.list()][-1] == TOTAL_STEPS  # step 20's leftover was cleaned by retention


def test_s3_stopped_mid_multipart_checkpoint_the_retry_completes_and_training_goes_on(s3, flaky_s3):
    flaky = s3.store("site").model_copy(update={"endpoint_url": flaky_s3.url})
    observed: list[list[int]] = []
    session = CheckpointStore.for_run(S3ObjectStore(s3.store("site"), site="cloud-test", options=FAST_S3),
                                      "churn", "big")

    def on_retry(attempt: int, exc: BaseException) -> None:
        flaky_s3.start()  # the server is back as the retry begins
        observed.append([c.step for c in session.list()])

    objects = S3ObjectStore(flaky, site="cloud-test", options=FAST_S3, on_retry=on_retry)
    store = CheckpointStore.for_run(objects, "churn", "big", file_upload_bytes=5 * MiB)
    store.save({"w": torch.zeros(16)}, 1)
    big = {"w": torch.arange(4 * 1024 * 1024, dtype=torch.float32)}  # 16 MiB: 4 parts of 5 MiB or less
    parts: list[str] = []
    objects.client.meta.events.register("before-send.s3.UploadPart", lambda request, **kw: parts.append(request.url))
    stopped = stop_before(objects.client, "UploadPart", flaky_s3, lambda url: len(parts) >= 2)
    info = store.save(big, 2)
    assert stopped.is_set() and observed == [[1]]  # after the failed attempt only step 1 was visible
    loaded, latest = session.latest_valid()
    assert latest == info and torch.equal(loaded["w"], big["w"])
    assert s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []  # aborted, none left


# -- through SSH and torchrun -------------------------------------------------------------------------------


SSH_SPEC = parse_spec({
    "apiVersion": "hybridtrain/v1",
    "metadata": {"name": "churn-faults"},
    "dataset": {"path": "data/raw/churn.csv", "md5": "0" * 32, "site": "onprem-a"},
    "schema": {"label": LABEL, "entity_key": "account_id",
               "columns": {"account_id": "string", "tenure": "float", "charges": "float", "contract": "category",
                           LABEL: "int"}},
    "model": {"features": {"numeric": ["tenure", "charges"], "categorical": ["contract"]}, "hidden_layers": [16, 8],
              "dropout": 0.0, "epochs": 12, "batch_size": 128, "learning_rate": 0.01, "seed": 5, "threads": 1},
    "checkpoint": {"interval_steps": 50, "keep_last": 2, "max_overhead": None, "preemption_grace_s": GRACE_S},
    "resources": {"max_hours": 0.1},
    "registry": {"model_name": "churn-faults"},
})
SSH_STEPS = 12 * 157  # 20000 train rows / batch 128 = 157 steps per epoch


def local_site(name: str, store: Path, hosts=(), price: float = 1.0) -> Site:
    return Site(name=name, kind="onprem", region="eu", jurisdiction="EU", price_per_gpu_hour=price, work_pool="onprem",
                store=LocalStore(path=str(store)), hosts=tuple(hosts))


@pytest.fixture(scope="module")
def ssh_env(tmp_path_factory):
    """A workspace, one store holding the approved data (DVC), the frames as training reads them, the reference."""
    root = tmp_path_factory.mktemp("faults-env")
    store = root / "store-a"
    ws = Workspace.resolve(root / "ws")
    remote = {"onprem-a": f"{store}/dvc", "onprem-x": f"{store}/dvc"}  # two site names, one store
    repo = DvcRepo.ensure(ws.root, remote, default_remote="onprem-a", scm=False)
    frame = pd.concat([churn_frame(20000, 11).assign(split="train"), churn_frame(500, 12).assign(split="val")],
                      ignore_index=True)
    frame["partition"] = np.arange(len(frame)) % 2
    partitioned.write(frame, ws.path("data/approved/churn-faults"), sort_by="account_id")
    approved = repo.add("data/approved/churn-faults", "approved", "onprem-a")
    repo.push(approved, remote="onprem-a")
    data = ws.path(approved.path)
    train_df, val_df = partitioned.read(data, ["train"]), partitioned.read(data, ["val"])
    ref = Trainer(SSH_SPEC.model, SSH_SPEC.checkpoint, CheckpointStore(LocalObjectStore(root / "ref"), "ref"), LABEL,
                  device="cpu", threads=1).fit(train_df, val_df)
    return ws, store, approved, (train_df, val_df), ref


def test_sigterm_through_ssh_and_torchrun_is_a_preemption_that_resumes(sshd, ssh_env):
    ws, store, approved, _, ref = ssh_env
    site = local_site("onprem-a", store, hosts=(sshd.host,))
    job_id, run_key = "faults-term", "run-term"
    signalled: list[int] = []

    # The pool's own connection, opened beforehand: on a loaded machine a new SSH handshake can take
    # longer than the rest of this short run, and the notice must land mid-run.
    other = SshSite(sshd.host, sshd.private_key, sshd.known_hosts, site="onprem-a", timeouts=FAST_SSH)

    def on_line(line: str) -> None:
        # The pool shuts the job down: SIGTERM to its process group (the wrapper and torchrun), over SSH.
        if line.startswith("hybridtrain: epoch 1/") and not signalled:
            signalled.append(other.run(f"kill -TERM -{other.attach(job_id).pid}")[0])

    def train(lines: list[str]):
        return ssh_train(ws, SSH_SPEC, approved, site, sshd.host, sshd.private_key, sshd.known_hosts,
                         run_key=run_key, job_id=job_id, on_line=lambda x: (lines.append(x), on_line(x)),
                         poll_interval=0.2, timeout=WAIT_S, timeouts=FAST_SSH)

    lines: list[str] = []
    with other, pytest.raises(Preempted) as err:
        train(lines)
    exc = err.value
    assert signalled == [0]
    assert exc.job == SSH_SPEC.name and exc.site == "onprem-a" and is_retryable(exc)
    ckpts = CheckpointStore.for_run(LocalObjectStore(store / "objects"), SSH_SPEC.name, run_key)
    _, newest = ckpts.latest_valid()
    assert (newest.step, newest.key) == (exc.step, exc.checkpoint) and 157 <= exc.step < SSH_STEPS
    d = job_dir(sshd.host.workdir, job_id)
    report = PreemptionReport.read(d / "bundle")
    assert report.reason == "SIGTERM" and report.within_grace and report.step == exc.step
    # torchrun died of the forwarded signal (status 1); the report, not the status, says "preempted".
    assert (d / "exit_code").read_text().strip() not in ("0", str(EXIT_PREEMPTED))
    assert any(f"preempted at step {exc.step}" in x for x in lines)

    lines = []
    files = train(lines)  # the same job id again: the preempted attempt is moved aside, training resumes
    assert "moved to" in lines[0] and "launching again" in lines[0]
    assert files.result.resumed_from_step == exc.step and files.result.global_step == SSH_STEPS
    assert_same_weights(files.model(), ref.model)
    assert files.result.history == ref.history


def test_sshd_stopped_mid_run_the_job_is_replaced_on_the_next_healthy_site(tmp_path, ssh_env):
    ws, store_a, approved, (train_df, val_df), ref = ssh_env
    proc, server = start_sshd(tmp_path / "sshd-x")
    site_a = local_site("onprem-x", store_a, hosts=(server.host,), price=1.0)
    site_b = local_site("onprem-y", tmp_path / "store-b", price=2.0)
    engine = Placement([site_a, site_b], Policy(apiVersion="hybridtrain/v1"))
    request = ResourceRequest(job=SSH_SPEC.name, gpus=0, run_hours=0.1, max_run_hours=1.0, submitted_at=0.0,
                              data_site="onprem-x", sensitivity=Sensitivity.internal)
    assert engine.decide(request, now=0.0).site == "onprem-x"  # the cheaper site, while it is healthy
    stopped: list[float] = []

    def on_line(line: str) -> None:
        if line.startswith("hybridtrain: epoch 1/") and not stopped:
            # The host goes down: its sshd and its job together. (A job left running would finish all
            # its epochs while the client gives up on the link, on a fast machine, and leave nothing
            # to resume.)
            stop_sshd(proc)
            kill_job(server.host.workdir, "faults-x")
            stopped.append(time.monotonic())

    try:
        with pytest.raises(SiteUnavailable) as err:
            ssh_train(ws, SSH_SPEC, approved, site_a, server.host, server.private_key, server.known_hosts,
                      run_key="run-x", job_id="faults-x", on_line=on_line, poll_interval=0.2, timeout=WAIT_S,
                      timeouts=FAST_SSH)
    finally:
        kill_job(server.host.workdir, "faults-x")  # in case the test failed before the host went down
        if proc.poll() is None:
            stop_sshd(proc)
    assert stopped and err.value.site == "onprem-x" and "could not get it back" in str(err.value)

    healths = [check_site(site_a, ws.root, private_key=server.private_key, known_hosts=server.known_hosts,
                          timeout_s=2),
               check_site(site_b, ws.root, workers_online=1, timeout_s=2)]
    assert [h.healthy for h in healths] == [False, True]
    assert healths[0].reason.startswith(f"ssh {server.host.username}@[127.0.0.1]:{server.host.port}: ")
    assert "cannot connect" in healths[0].reason
    decision = engine.decide(request, now=0.0, unavailable=unavailable(healths))
    assert decision.site == "onprem-y"
    assert decision.rejected["onprem-x (fixed)"] == f"{HEALTH_RULE}: {healths[0].reason}"

    # Re-placed: the newest valid checkpoint moves to the new site's store, and training resumes there.
    here = CheckpointStore.for_run(LocalObjectStore(store_a / "objects"), SSH_SPEC.name, "run-x")
    there = CheckpointStore.for_run(LocalObjectStore(tmp_path / "store-b" / "objects"), SSH_SPEC.name, "run-x")
    copy = here.copy_latest(there)
    assert copy is not None and 0 < copy.source.step < SSH_STEPS
    resumed = Trainer(SSH_SPEC.model, SSH_SPEC.checkpoint, there, LABEL, device="cpu", threads=1,
                      job=SSH_SPEC.name).fit(train_df, val_df)
    assert resumed.resumed_from_step == copy.source.step and resumed.global_step == SSH_STEPS
    assert_same_weights(resumed.model, ref.model)
