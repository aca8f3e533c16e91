"""Several GPUs at a site without SSH hosts: torchrun on the worker's machine (gloo here), and which GPUs it holds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hybridtrain.datasets import partitioned
from hybridtrain.errors import NoFeasiblePlacement, Preempted, RemoteJobFailed, SpecError
from hybridtrain.remote.job_bundle import SECRETS_FILE
from hybridtrain.remote.local_training import WORKDIR, local_train
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR, LocalStore, Site
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.local_gpus import LocalGpus, visible_gpus
from hybridtrain.training.preemption import PreemptionReport
from hybridtrain.training.trainer import Trainer
from tests.fixtures.ssh_job import SPEC, pushed_data_env

pytestmark = pytest.mark.slow  # torchrun and its ranks

#: Two processes, one global batch of 128 split between them; 16 steps an epoch.
JOB = SPEC.model_copy(update={"resources": SPEC.resources.model_copy(update={"gpus": 2})})
STEPS = JOB.model.epochs * 16


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A workspace and a site without SSH hosts whose store (a directory) holds the approved data."""
    root = tmp_path_factory.mktemp("local-env")
    site = Site(name="cloud-local", kind="cloud", region="eu", jurisdiction="EU", price_per_gpu_hour=2.0,
                work_pool="cloud", gpu_count=4, store=LocalStore(path=str(root / "store")))
    return pushed_data_env(root, site)

def checkpoints(env, run_key: str) -> CheckpointStore:
    ws, site, _ = env
    return CheckpointStore.for_run(open_store(site.store, ws.root, CHECKPOINT_SUBDIR), JOB.name, run_key)


@pytest.fixture(scope="module")
def single(env, tmp_path_factory):
    """The same job trained by one process on the same rows, same global batch and seed."""
    data = env[0].path("data/approved/churn-ssh")
    train, val = partitioned.read(data, ["train"]), partitioned.read(data, ["val"])
    store = CheckpointStore.for_run(LocalObjectStore(tmp_path_factory.mktemp("single")), JOB.name, "single")
    return Trainer(JOB.model, JOB.checkpoint, store, JOB.data_schema.label, device="cpu", threads=1,
                   job=JOB.name).fit(train, val)


def run(env, run_key: str, **kw):
    ws, site, approved = env
    lines: list[str] = []
    kw.setdefault("timeout", 240.0)
    files = local_train(ws, JOB, approved, site, run_key, f"local-{run_key}", lines.append, nproc=2,
                        mlflow_run_id="r1", poll_interval=0.1, **kw)
    return files, lines


def test_two_processes_on_this_machine_train_like_one_with_the_same_global_batch(env, single):
    files, lines = run(env, "together")
    r = files.result
    assert (r.world_size, r.global_step, r.resumed_from_step) == (2, STEPS, None)
    assert r.device == "cpu"  # no CUDA here: gloo ranks on the CPU
    two = files.model().state_dict()
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)
    assert any("2 process(es)" in line for line in lines) and any("hybridtrain: epoch 4/4" in line for line in lines)
    # Rank 0 wrote the checkpoints to the site's store, where an in-process run of the run key would look.
    assert [c.step for c in checkpoints(env, "together").list()][-1] == STEPS
    job_dir = env[0].state_dir / "jobs" / "local-together"
    assert not (job_dir / "bundle" / SECRETS_FILE).exists() and not (job_dir / WORKDIR).exists()
    assert "hybridtrain: done" in (job_dir / "log").read_text()


def test_a_preemption_notice_stops_every_rank_after_a_checkpoint_and_the_next_attempt_resumes(env, single):
    store = checkpoints(env, "notice")
    notice = threading.Event()

    def stop_once_a_checkpoint_is_stored() -> None:
        deadline = time.monotonic() + 240
        while not store.list() and time.monotonic() < deadline:
            time.sleep(0.05)
        notice.set()

    threading.Thread(target=stop_once_a_checkpoint_is_stored, daemon=True).start()
    with pytest.raises(Preempted) as caught:
        run(env, "notice", should_stop=notice.is_set)
    assert caught.value.site == "cloud-local" and 0 < caught.value.step < STEPS
    assert store.list()[-1].step == caught.value.step  # the checkpoint of the step it stopped at
    files, _ = run(env, "notice")
    assert files.result.resumed_from_step == caught.value.step and files.result.global_step == STEPS
    two = files.model().state_dict()
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)


def test_a_failing_job_reports_its_own_error_and_leaves_no_secrets(env):
    ws, site, approved = env
    missing = approved.model_copy(update={"md5": "f" * 32})  # a version the store does not hold
    with pytest.raises(RemoteJobFailed) as caught:
        local_train(ws, JOB, missing, site, "broken", "local-broken", lambda line: None, nproc=2, timeout=240.0)
    assert caught.value.exit_status not in (0, None)
    said = str(caught.value).split("Last lines")[0]
    assert "the worker's machine" in said and "it reported: dataset data/approved/churn-ssh" in said
    assert "Connection closed by peer" not in said  # the rank that failed first, not the echo of its peer
    job_dir = ws.state_dir / "jobs" / "local-broken"
    assert not (job_dir / "bundle" / SECRETS_FILE).exists() and not (job_dir / WORKDIR).exists()


def test_a_job_past_its_time_is_stopped_and_fails_instead_of_counting_as_a_preemption(env):
    ws, site, approved = env
    # Long enough to be training when its time runs out: the stop stores a checkpoint and preempted.json,
    # as a notice would, but running too long is a failure, not a preemption to resume.
    slow = JOB.model_copy(update={"model": JOB.model.model_copy(update={"epochs": 400, "batch_size": 4})})
    lines: list[str] = []
    with pytest.raises(RemoteJobFailed, match=r"still running after 25 s \(resources.max_hours plus setup\) and "
                                              r"was stopped") as caught:
        local_train(ws, slow, approved, site, "too-long", "local-too-long", lines.append, nproc=2, timeout=25.0,
                    poll_interval=0.1)
    # It was under way: its ranks stored a checkpoint and preempted.json on the way out.
    assert PreemptionReport.read(ws.state_dir / "jobs" / "local-too-long" / "bundle") is not None
    assert not caught.value.retryable  # a retry would run just as long


def test_the_job_dies_with_the_process_that_started_it(env, tmp_path):
    """A worker killed with SIGKILL takes its torchrun and ranks with it, as a preemption notice would: nothing
    trains on without a lease, and the progress so far is in a checkpoint."""
    ws, site, approved = env
    script = tmp_path / "starter.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.fixtures.ssh_job import SPEC
from hybridtrain.remote.local_training import local_train
from hybridtrain.workspace import Workspace
from hybridtrain.specs.sites import Site
from hybridtrain.datasets.dvc_repo import DatasetVersion
site = Site.model_validate_json({site.model_dump_json()!r})
approved = DatasetVersion.model_validate_json({approved.model_dump_json()!r})
# Long epochs that print nothing between them: the job must not learn of its starter's death from a broken pipe.
slow = SPEC.model_copy(update={{"model": SPEC.model.model_copy(update={{"epochs": 400, "batch_size": 4}}),
                               "checkpoint": SPEC.checkpoint.model_copy(update={{"interval_steps": 100000}}),
                               "resources": SPEC.resources.model_copy(update={{"gpus": 2}})}})
local_train(Workspace.resolve({str(ws.root)!r}), slow, approved, site, "orphan", "local-orphan",
            lambda line: print(line, flush=True), nproc=2, timeout=600)
""")
    bundle = ws.state_dir / "jobs" / "local-orphan" / "bundle"

    def ranks() -> list[int]:
        out = subprocess.run(["pgrep", "-f", f"hybridtrain.remote.host_training {bundle}"], capture_output=True,
                             text=True, check=False).stdout.split()
        return [int(p) for p in out]

    starter = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        for line in starter.stdout:  # training under way: the ranks exist
            if "hybridtrain: epoch 1/400" in line:
                break
        assert len(ranks()) >= 2
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 60
        while ranks() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ranks() == []
        report = PreemptionReport.read(bundle)
        assert report is not None and report.step > 0 and report.checkpoint  # stopped as on a notice, progress stored
    finally:  # a failed run leaves nothing burning the CPU for the rest of the suite
        starter.kill()
        subprocess.run(["pkill", "-9", "-f", str(bundle)], check=False)


# -- which GPUs of this machine a job holds (real flocks, in separate processes) ------------------


HOLD = """
import sys, time
from hybridtrain.training.local_gpus import LocalGpus
held = LocalGpus(["0", "1", "2", "3"], sys.argv[1]).claim(int(sys.argv[2]), job="other", site="s", wait_s=0)
print(",".join(held.names), flush=True)
time.sleep(600)
"""


def hold_in_another_process(lock_dir: Path, n: int) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_dir), str(n)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip().split(",")


def test_jobs_on_one_machine_hold_disjoint_gpus_and_a_killed_holders_gpus_come_free(tmp_path):
    machine = LocalGpus(["0", "1", "2", "3"], tmp_path)
    other, theirs = hold_in_another_process(tmp_path, 2)
    try:
        assert theirs == ["0", "1"]
        mine = machine.claim(2, job="j", site="s", wait_s=0)
        assert (mine.names, mine.positions) == (["2", "3"], [2, 3])
        theirs_held = rf"job other at site s \(pid {other.pid}, since [-0-9]+ [:0-9]+ UTC\)"
        with pytest.raises(NoFeasiblePlacement, match=r"0 of the 4 GPUs of site s's worker machine free; the job "
                                                      r"needs 1 \(waited 0 s\); held: GPU 0, 1: " + theirs_held +
                                                      rf"; GPU 2, 3: job j at site s \(pid {os.getpid()},"):
            machine.claim(1, job="j", site="s", wait_s=0)
        mine.release()
        waited: list[str] = []
        started = time.monotonic()
        threading.Timer(0.5, lambda: os.kill(other.pid, signal.SIGKILL)).start()
        got = machine.claim(3, job="j", site="s", wait_s=30, poll_s=0.05, say=waited.append)
        assert got.names == ["0", "1", "2"] and time.monotonic() - started >= 0.4  # once the holder was gone
        assert len(waited) == 1
        assert re.fullmatch(r"waiting for GPUs on this machine: 2 of 4 free; the job needs 3; held: GPU 0, 1: "
                            + theirs_held, waited[0])
        # the killed holder's record is still in its files, but a free lock is a free GPU
        held = machine.holders()
        assert held["3"] is None and {held[g].pid for g in "012"} == {os.getpid()}  # type: ignore[union-attr]
        got.release()
        assert machine.holders() == dict.fromkeys("0123")
    finally:
        other.kill()
        other.wait()


def test_a_job_larger_than_the_machine_is_refused_at_once(tmp_path):
    with pytest.raises(NoFeasiblePlacement, match="site s trains on its worker's machine, which has 2 GPU"):
        LocalGpus(["0", "1"], tmp_path).claim(3, job="j", site="s", wait_s=60)


def test_gpus_are_named_as_the_workers_cuda_visible_devices_names_them():
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "5,7"}) == ["5", "7"]
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}) == ["GPU-aa", "GPU-bb"]
    assert visible_gpus(3, {}) == ["0", "1", "2"] and visible_gpus(0, {"CUDA_VISIBLE_DEVICES": "1"}) == []


def test_a_lock_directory_no_worker_may_write_is_one_line_naming_the_setting(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the lock directory should be")
    with pytest.raises(SpecError, match=r"HYBRIDTRAIN_GPU_LOCK_DIR: cannot use .*not-a-dir/gpu-0.lock to claim GPU 0 "
                                        r"of this machine .*: set HYBRIDTRAIN_GPU_LOCK_DIR to a directory"):
        LocalGpus(["0"], blocked).claim(1, job="j", site="s", wait_s=0)


def test_lock_files_are_shared_by_every_user_of_the_machine(tmp_path):
    lock_dir = tmp_path / "locks"
    LocalGpus(["0"], lock_dir).claim(1, job="j", site="s", wait_s=0).release()
    assert lock_dir.stat().st_mode & 0o7777 == 0o1777 and (lock_dir / "gpu-0.lock").stat().st_mode & 0o777 == 0o666


# `hybridtrain gpus` in a subprocess; the machine's 4 GPUs are the one thing faked (torch's CUDA count).
FOUR_GPUS = """
import sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 4
from hybridtrain.cli.main import main
sys.argv = ["hybridtrain", *sys.argv[1:]]
main()
"""


def gpus_cli(*args: str, four: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", FOUR_GPUS] if four else [sys.executable, "-m", "hybridtrain.cli.main"]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run([*argv, "gpus", *args], check=False, capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


def test_the_gpus_command_lists_who_holds_each_gpu(tmp_path):
    fresh = tmp_path / "no-claims-yet"
    assert json.loads(gpus_cli("--lock-dir", str(fresh), "--json").stdout) == dict.fromkeys("0123")
    assert not fresh.exists()  # listing creates nothing
    other, theirs = hold_in_another_process(tmp_path, 2)
    try:
        assert theirs == ["0", "1"]
        out = gpus_cli("--lock-dir", str(tmp_path))
        assert out.returncode == 0, out.stderr
        rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") >= 4
                and line.split("│")[1].strip() in "0123"}
        assert set(rows) == {"0", "1", "2", "3"}
        for g in "01":
            assert "job other at site s" in rows[g] and str(other.pid) in rows[g]
        for g in "23":
            assert "free" in rows[g]
        assert out.stdout.rstrip().endswith("2 of 4 free")
        listed = json.loads(gpus_cli("--lock-dir", str(tmp_path), "--json").stdout)
        assert listed["2"] is None and listed["0"]["job"] == "other" and listed["1"]["pid"] == other.pid
    finally:
        other.kill()
        other.wait()
    assert json.loads(gpus_cli("--lock-dir", str(tmp_path), "--json").stdout) == dict.fromkeys("0123")


def test_the_gpus_command_on_a_machine_without_cuda_and_with_an_unusable_lock_dir(tmp_path):
    out = gpus_cli(four=False)
    assert out.returncode == 0 and "no CUDA GPU visible here" in out.stdout
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    out = gpus_cli("--lock-dir", str(blocked))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"HYBRIDTRAIN_GPU_LOCK_DIR: {blocked} is not a directory" in out.stderr
