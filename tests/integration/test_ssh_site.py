"""On-prem execution over SSH against a real OpenSSH server on loopback: files, detached jobs, training, faults."""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
import torch

from hybridtrain.datasets import partitioned
from hybridtrain.errors import AuthRefused, HostKeyRejected, RemoteJobFailed, SiteUnavailable, is_retryable
from hybridtrain.remote.job_bundle import JobBundle
from hybridtrain.remote.remote_training import ssh_train
from hybridtrain.remote.ssh_site import SshSite, Timeouts
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.training.checkpoint import CheckpointStore
from hybridtrain.training.trainer import Trainer
from tests.fixtures.ssh_job import SPEC

pytestmark = pytest.mark.slow  # a real sshd on loopback

FAST = Timeouts(connect=3, command=20, reconnect=30)
WAIT_S = 60.0  # bound on every job wait in this file
LABEL = "churned"


def site_for(server, **kw) -> SshSite:
    return SshSite(server.host, kw.pop("private_key", server.private_key), kw.pop("known_hosts", server.known_hosts),
                   site="onprem-ssh", timeouts=kw.pop("timeouts", FAST), **kw)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


# -- a site with approved data in its store, and a job spec ---------------------------------------


STEPS = 4 * 16  # 2000 train rows / batch 128 = 16 steps per epoch


def train_over_ssh(sshd, env, job_id: str, run_key: str, on_line=None, **kw):
    ws, site, approved = env
    return ssh_train(ws, kw.pop("spec", SPEC), approved, site, kw.pop("host", sshd.host), sshd.private_key,
                     sshd.known_hosts,
                     run_key=run_key, job_id=job_id, on_line=on_line, poll_interval=0.2, timeout=WAIT_S,
                     timeouts=FAST, **kw)


def remote_log(sshd, job_id: str) -> list[str]:
    """The job's log as the host has it (the host is this machine)."""
    return (Path(sshd.host.workdir) / "jobs" / job_id / "log").read_text().splitlines()


# -- commands and files ---------------------------------------------------------------------------


def test_run_quotes_arguments_and_reports_status_and_output(sshd, tmp_path):
    marker = tmp_path / "injected"
    with site_for(sshd) as s:
        status, out = s.run(["echo", f"a b; touch {marker}", "$(id)"])
        assert (status, out) == (0, f"a b; touch {marker} $(id)\n")
        status, out = s.run("echo to-stderr >&2; exit 3")
        assert (status, out) == (3, "to-stderr\n")
    assert not marker.exists()


def test_upload_dir_is_atomic_keeps_modes_and_download_round_trips(sshd, tmp_path):
    src = tmp_path / "bundle"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    (src / "secrets.json").write_text("{}")
    (src / "secrets.json").chmod(0o600)
    with site_for(sshd) as s:
        target = s.upload_dir(src, "uploads/bundle")
        assert target == f"{sshd.host.workdir}/uploads/bundle"
        here = Path(target)  # loopback: the host's files are visible here
        assert (here / "a.txt").read_text() == "alpha"
        assert stat.S_IMODE((here / "secrets.json").stat().st_mode) == 0o600
        assert stat.S_IMODE(here.stat().st_mode) == 0o700
        (src / "a.txt").write_text("second version")
        s.upload_dir(src, "uploads/bundle")  # replaces the previous upload
        assert sorted(p.name for p in here.parent.iterdir()) == ["bundle"]  # no temp or old dirs left
        got = s.download("uploads/bundle/sub/b.bin", tmp_path / "back" / "b.bin")
        assert got.read_bytes() == (src / "sub" / "b.bin").read_bytes()
        assert s.download(f"{target}/a.txt", tmp_path / "a.txt").read_text() == "second version"
        with pytest.raises(FileNotFoundError, match="uploads/bundle/nope"):
            s.download("uploads/bundle/nope", tmp_path / "nope")
        assert list((tmp_path / "back").iterdir()) == [tmp_path / "back" / "b.bin"]


def test_a_short_command_past_its_timeout_is_stopped_and_reported(sshd):
    with site_for(sshd) as s:
        started = time.monotonic()
        with pytest.raises(SiteUnavailable, match="did not finish within 1 s"):
            s.run("sleep 30", timeout=1)
        assert time.monotonic() - started < 5


# -- detached jobs ----------------------------------------------------------------------------------


def test_failing_job_raises_with_exit_status_and_log_tail(sshd):
    lines: list[str] = []
    with site_for(sshd) as s:
        job = s.launch("fails", ["sh", "-c", "for i in $(seq 1 50); do echo line $i; done; echo boom >&2; exit 7"])
        with pytest.raises(RemoteJobFailed) as exc:
            s.stream(job, lines.append, poll_interval=0.1, timeout=WAIT_S)
        assert s.poll(job) == 7
    err = exc.value
    assert err.exit_status == 7 and not is_retryable(err)
    assert err.log_tail.splitlines()[-2:] == ["line 50", "boom"]
    assert "exit status 7" in str(err) and "| boom" in str(err) and "fails" in str(err)
    assert lines == [f"line {i}" for i in range(1, 51)] + ["boom"]


def test_job_survives_a_dropped_connection_and_stream_reattaches_without_loss(sshd, tmp_path):
    go = tmp_path / "go"
    # "ready" sits in the middle of what one read returns: the drop happens half-way through a chunk.
    script = ("for i in $(seq 1 30); do echo before $i; done; echo ready; for i in $(seq 1 30); do echo mid $i; "
              f"done; while [ ! -e {go} ]; do sleep 0.05; done; "
              "for i in $(seq 1 200); do echo after $i; done; printf 'no newline at the end'")
    lines: list[str] = []
    checked = threading.Event()
    with site_for(sshd) as s:
        job = s.launch("survives-drop", ["sh", "-c", script])
        wait_for(lambda: "mid 30" in s.tail_text(job.log, lines=1))

        def on_line(line: str) -> None:
            lines.append(line)
            if line == "ready":
                assert sshd.drop_connections() >= 1  # the server side of every session dies
                wait_for(lambda: not s._alive())
                os.kill(job.pid, 0)  # the job is untouched ...
                go.touch()  # ... and goes on with its work while we are disconnected
                checked.set()

        status = s.stream(job, on_line, poll_interval=0.1, timeout=WAIT_S)
        assert s.reconnects >= 1
        assert s.attach("survives-drop") == job  # the same job, found by its id after the reconnect
    assert checked.is_set() and status == 0
    assert lines == ([f"before {i}" for i in range(1, 31)] + ["ready"] + [f"mid {i}" for i in range(1, 31)]
                     + [f"after {i}" for i in range(1, 201)] + ["no newline at the end"])


def test_attach_finds_a_job_from_a_new_connection_and_cancel_stops_it(sshd):
    with site_for(sshd) as s:
        job = s.launch("to-cancel", ["sh", "-c", "echo started; exec sleep 600"], env={"GREETING": "hello world"})
        assert s.find("no-such-job") is None
        with pytest.raises(FileExistsError, match="already launched"):
            s.launch("to-cancel", ["true"])
    with site_for(sshd) as again:
        found = again.attach("to-cancel")
        assert found == job and again.poll(found) is None
        wait_for(lambda: "started" in again.tail_text(found.log))
        assert again.cancel(found, grace=10) == 143  # SIGTERM; the wrapper records it
        assert again.poll(found) == 143
        with pytest.raises(FileNotFoundError, match="no job 'nope'"):
            again.attach("nope")


# -- connection faults ------------------------------------------------------------------------------


def test_unreachable_host_is_site_unavailable_quickly(sshd):
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    host = sshd.host.model_copy(update={"port": port})
    started = time.monotonic()
    with pytest.raises(SiteUnavailable) as exc:
        SshSite(host, sshd.private_key, sshd.known_hosts, site="onprem-ssh", timeouts=FAST).connect()
    assert time.monotonic() - started < 3
    assert f"127.0.0.1]:{port}" in str(exc.value) and exc.value.site == "onprem-ssh" and is_retryable(exc.value)


def test_a_server_that_never_speaks_ssh_times_out(sshd):
    with socket.socket() as sock:  # listens (the kernel accepts) but never sends a banner
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        host = sshd.host.model_copy(update={"port": sock.getsockname()[1]})
        started = time.monotonic()
        with pytest.raises(SiteUnavailable, match="cannot connect"):
            SshSite(host, sshd.private_key, sshd.known_hosts, timeouts=Timeouts(connect=1)).connect()
        assert time.monotonic() - started < 5


def test_refused_key_is_a_clear_error_that_is_not_retried(sshd):
    started = time.monotonic()
    with pytest.raises(AuthRefused) as exc:
        site_for(sshd, private_key=sshd.other_private_key).connect()
    assert time.monotonic() - started < 5
    msg = str(exc.value)
    assert f"{sshd.host.username}@[127.0.0.1]:{sshd.host.port} refused key authentication" in msg
    assert "ssh_private_key" in msg and "authorized_keys" in msg and not is_retryable(exc.value)


def test_unknown_host_key_is_refused(sshd):
    with pytest.raises(HostKeyRejected) as exc:
        site_for(sshd, known_hosts="# nothing pinned yet\n").connect()
    name = f"[127.0.0.1]:{sshd.host.port}"
    assert str(exc.value).startswith(
        f"host key of {name} is not in known_hosts; verify it out of band and add it to the site block's "
        "ssh_known_hosts")
    assert "ssh-ed25519 SHA256:" in str(exc.value) and not exc.value.changed and not is_retryable(exc.value)


def test_changed_host_key_is_refused_as_a_possible_attack(sshd):
    with pytest.raises(HostKeyRejected) as exc:
        site_for(sshd, known_hosts=sshd.other_host_key_line).connect()
    msg = str(exc.value)
    assert exc.value.changed and not is_retryable(exc.value)
    assert f"host key of [127.0.0.1]:{sshd.host.port} does not match" in msg and "man-in-the-middle" in msg


# -- training through SSH ---------------------------------------------------------------------------


def test_training_job_end_to_end_matches_in_process_training(sshd, env, tmp_path):
    ws, site, approved = env
    lines: list[str] = []
    files = train_over_ssh(sshd, env, "train-e2e", "run-e2e", lines.append)
    r = files.result
    assert (r.global_step, r.epochs_completed, r.world_size, r.device) == (STEPS, 4, 1, "cpu")
    assert r.resumed_from_step is None and len(r.history) == 4 and r.history[-1]["val_auc"] > 0.8
    # Streamed in order, exactly what the host's log holds.
    assert lines == remote_log(sshd, "train-e2e")
    epochs = [line for line in lines if line.startswith("hybridtrain: epoch ")]
    assert [e.split()[2] for e in epochs] == ["1/4", "2/4", "3/4", "4/4"]
    assert lines.index(epochs[0]) > next(i for i, x in enumerate(lines) if "data ready: 2000 train rows" in x)
    assert lines[-1].startswith("hybridtrain: done: 64 steps")
    # Checkpoints are in the site's store under the run key.
    store = CheckpointStore.for_run(LocalObjectStore(Path(site.store.path) / "objects"), SPEC.name, "run-e2e")
    assert store.list()[-1].step == STEPS
    # The bundle on the host names the run key; its secrets file is gone once the job has ended.
    on_host = Path(sshd.host.workdir) / "jobs" / "train-e2e" / "bundle"
    bundle = JobBundle.read(on_host)
    assert bundle.run_key == "run-e2e" and bundle.approved == approved and bundle.workdir == sshd.host.workdir
    assert not (on_host / "secrets.json").exists()
    # A CPU job (gpus: 0) sees no GPU of the host, so it never trains on one another job holds.
    run_sh = (on_host.parent / "run.sh").read_text()
    assert " CUDA_VISIBLE_DEVICES= " in run_sh and "--nproc_per_node=1 " in run_sh
    # One process under torchrun is the in-process trainer, bit for bit.
    data = Path(sshd.host.workdir) / "data-copy" / approved.path
    local = Trainer(SPEC.model, SPEC.checkpoint,
                    CheckpointStore(LocalObjectStore(tmp_path), "here"), LABEL, device="cpu", threads=1).fit(
        partitioned.read(data, ["train"]), partitioned.read(data, ["val"]))
    remote_model = files.model()
    for name, tensor in local.model.state_dict().items():
        assert torch.equal(remote_model.state_dict()[name], tensor), name
    assert files.featurizer() == local.featurizer.to_dict()
    # What the train stage logs to MLflow: the same TrainResult an in-process fit returns.
    as_fit = files.train_result()
    assert as_fit.last_checkpoint == store.list()[-1] and as_fit.history == local.history
    assert as_fit.featurizer == local.featurizer and as_fit.global_step == local.global_step
    # Asking again for the same job id attaches to the finished job instead of training twice.
    again = train_over_ssh(sshd, env, "train-e2e", "run-e2e")
    assert again.result == r


def test_connection_dropped_mid_training_the_job_finishes_and_the_log_is_complete(sshd, env, caplog):
    lines: list[str] = []
    dropped: list[int] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line.startswith("hybridtrain: epoch 1/4") and not dropped:
            dropped.append(sshd.drop_connections())

    with caplog.at_level(logging.INFO, logger="hybridtrain.remote.ssh_site"):
        files = train_over_ssh(sshd, env, "train-drop", "run-drop", on_line)
    assert dropped and dropped[0] >= 1
    assert "lost the connection" in caplog.text and "re-attaching job train-drop" in caplog.text
    assert files.result.global_step == STEPS and files.result.epochs_completed == 4
    assert lines == remote_log(sshd, "train-drop")  # nothing lost, nothing twice
    assert len([x for x in lines if x.startswith("hybridtrain: epoch ")]) == 4


def test_failing_training_job_reports_status_and_log_tail_then_a_retry_relaunches(sshd, env):
    ws, site, approved = env
    missing = approved.model_copy(update={"md5": "f" * 32 + ".dir"})  # a version the store does not have
    with pytest.raises(RemoteJobFailed) as exc:
        ssh_train(ws, SPEC, missing, site, sshd.host, sshd.private_key, sshd.known_hosts, run_key="run-fail",
                  job_id="train-fail", poll_interval=0.2, timeout=WAIT_S, timeouts=FAST)
    err = exc.value
    assert err.exit_status not in (None, 0) and not is_retryable(err)
    assert "hybridtrain.remote.host_training FAILED" in err.log_tail  # torchrun's summary ends the log ...
    msg = str(err)  # ... so the job's own message comes from its error file
    assert "train-fail" in msg and "it reported: dataset data/approved/churn-ssh failed validation" in msg
    assert "could not be fetched from remote onprem-ssh" in msg
    # A retry of the same job id moves the failed attempt aside and runs again.
    lines: list[str] = []
    files = train_over_ssh(sshd, env, "train-fail", "run-fail", lines.append)
    assert files.result.global_step == STEPS
    assert "moved to" in lines[0] and "launching again" in lines[0]
    retired = [p.name for p in (Path(sshd.host.workdir) / "jobs").iterdir() if p.name.startswith("train-fail.")]
    assert len(retired) == 1


def test_ddp_job_with_two_processes_through_ssh(sshd, env):
    lines: list[str] = []
    host = sshd.host.model_copy(update={"gpus": 4})
    two = SPEC.model_copy(update={"resources": SPEC.resources.model_copy(update={"gpus": 2})})
    # One process per GPU of the job, not of the host; on this CPU-only host: gloo.
    files = train_over_ssh(sshd, env, "train-ddp", "run-ddp", lines.append, host=host, spec=two)
    r = files.result
    assert (r.world_size, r.device, r.global_step, r.epochs_completed) == (2, "cpu", STEPS, 4)
    assert sum("2 process(es) on cpu" in x for x in lines) == 1
    assert len([x for x in lines if x.startswith("hybridtrain: epoch ")]) == 4  # rank 0 alone reports
    assert r.history[-1]["val_auc"] > 0.8
