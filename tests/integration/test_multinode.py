"""Multi-node training over two loopback OpenSSH "hosts": torchrun on each, c10d rendezvous, gloo DDP, a lost node."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from hybridtrain.datasets import partitioned
from hybridtrain.placement.node_fit import host_key
from hybridtrain.remote.multinode_training import ssh_train_nodes
from hybridtrain.remote.ssh_site import Timeouts, known_hosts_name
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.trainer import Trainer
from tests.fixtures.processes import start_sshd, stop_sshd
from tests.fixtures.ssh_job import MULTI, MULTI_EPOCHS

pytestmark = pytest.mark.slow  # real sshd hosts and torchrun ranks

FAST = Timeouts(connect=3, command=20, reconnect=30)
WAIT_S = 240.0
EPOCHS = MULTI_EPOCHS


@pytest.fixture(scope="module")
def second_host(sshd, tmp_path_factory):
    """Another OpenSSH server: its own port, host key and working directory — a second "host" that accepts
    the first one's user key (a site block holds one key for all its hosts)."""
    d = tmp_path_factory.mktemp("sshd-b")
    first = Path(sshd.host.workdir).parent
    for name in ("user_key", "user_key.pub"):
        shutil.copy(first / name, d / name)
    proc, server = start_sshd(d)
    try:
        yield server
    finally:
        stop_sshd(proc)


@pytest.fixture(scope="module")
def cluster(sshd, second_host, env):  # noqa: F811
    """The SSH site of ``test_ssh_site`` with both hosts, and the known_hosts lines of both."""
    ws, site, approved = env
    assert sshd.host.port != second_host.host.port and sshd.host.workdir != second_host.host.workdir
    return ws, site.model_copy(update={"hosts": (sshd.host, second_host.host)}), approved, \
        sshd.known_hosts + second_host.known_hosts


def run_job(sshd, cluster, run_key: str, **kw):
    ws, site, approved, known = cluster
    lines: list[str] = []
    files = ssh_train_nodes(ws, MULTI, approved, site, site.hosts, sshd.private_key, known, run_key=run_key,
                            job_id=f"multi-{run_key}", on_line=lines.append, poll_interval=0.2, timeout=WAIT_S,
                            timeouts=FAST, **kw)
    return files, lines


def checkpoints(cluster, run_key: str) -> CheckpointStore:
    ws, site, _, _ = cluster
    return CheckpointStore.for_run(open_store(site.store, ws.root, CHECKPOINT_SUBDIR), MULTI.name, run_key)


@pytest.fixture(scope="module")
def single(cluster, tmp_path_factory):
    """The same job trained by one process (world of one) on the same rows, same global batch and seed."""
    ws = cluster[0]
    data = ws.path("data/approved/churn-ssh")
    train, val = partitioned.read(data, ["train"]), partitioned.read(data, ["val"])
    store = CheckpointStore.for_run(LocalObjectStore(tmp_path_factory.mktemp("single")), MULTI.name, "single")
    return Trainer(MULTI.model, MULTI.checkpoint, store, MULTI.data_schema.label, device="cpu", threads=1,
                   job=MULTI.name).fit(train, val)


def assert_close_weights(files, single) -> None:
    two = files.model().state_dict()
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)


def test_a_two_node_job_trains_like_one_process_with_the_same_global_batch(sshd, cluster, single):
    # Each node sees only the GPUs held for the job there (orchestration.gpu_lease): index 1 on the first, 0 on the second.
    held = {host_key(h): (i,) for i, h in zip((1, 0), cluster[1].hosts, strict=True)}
    files, lines = run_job(sshd, cluster, "together", devices=held)
    r = files.result
    assert (r.world_size, r.global_step, r.epochs_completed) == (2, EPOCHS * 16, EPOCHS)
    assert r.resumed_from_step is None
    assert_close_weights(files, single)
    assert [h["train_loss"] for h in r.history] == pytest.approx([h["train_loss"] for h in single.history], rel=1e-4)
    # Both nodes ran: one launch over both hosts, each host with its own data copy.
    labels = [f"{h.username}@{known_hosts_name(h.hostname, h.port)}" for h in cluster[1].hosts]
    assert any("launched on 2 nodes" in line and all(label in line for label in labels) for line in lines), lines
    assert any(line.startswith("[node 0] hybridtrain: epoch") for line in lines) or \
        any(line.startswith("[node 1] hybridtrain: epoch") for line in lines)  # rank 0's lines, wherever it ran
    for host in cluster[1].hosts:
        assert (Path(host.workdir) / "data-copy").is_dir()
        run_sh = (Path(host.workdir) / "jobs" / "multi-together" / "run.sh").read_text()
        assert f"CUDA_VISIBLE_DEVICES={held[host_key(host)][0]} " in run_sh
    assert [c.step for c in checkpoints(cluster, "together").list()][-1] == EPOCHS * 16  # rank 0 wrote them


def test_a_node_killed_mid_run_stops_every_rank_and_the_job_resumes_from_the_checkpoint(sshd, cluster, single):
    store = checkpoints(cluster, "killed")
    killed: list[int] = []

    def kill_node_1(attempt: int, jobs) -> None:
        if attempt > 0:
            return

        def kill() -> None:
            deadline = time.monotonic() + WAIT_S
            while not store.list():  # mid-run: once a checkpoint is stored
                assert time.monotonic() < deadline, "no checkpoint appeared"
                time.sleep(0.05)
            # Node 1's training process (torchrun's worker, found by its bundle path on that host).
            bundle = f"{jobs[1].dir}/bundle"
            out = subprocess.run(["pgrep", "-f", f"hybridtrain.remote.host_training {bundle}"],
                                 capture_output=True, text=True, check=False).stdout.split()
            for pid in map(int, out):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        threading.Thread(target=kill, daemon=True).start()

    files, lines = run_job(sshd, cluster, "killed", on_launch=kill_node_1, restarts=1)
    assert killed, "node 1's worker was never found"
    r = files.result
    assert r.resumed_from_step is not None and 0 < r.resumed_from_step < EPOCHS * 16
    assert r.global_step == EPOCHS * 16
    assert any("relaunching (attempt 2 of 2) from the newest checkpoint" in line for line in lines)
    # Resuming every rank from rank 0's checkpoint (RNG states included) changes nothing but the time.
    assert_close_weights(files, single)
