"""The launch commands of the three training paths share one shape: torchrun options, then the host program."""

import sys
from pathlib import Path

from hybridtrain.remote.host_training import MODULE, torchrun_command
from hybridtrain.remote.local_training import local_argv
from hybridtrain.remote.multinode_training import torchrun_nodes_argv
from hybridtrain.remote.remote_training import torchrun_argv
from hybridtrain.specs.sites import SshHost


def _host() -> SshHost:
    return SshHost(hostname="10.0.0.5", username="train", python="/opt/venv/bin/python", gpus=4)


def test_the_program_and_its_rate_come_after_torchruns_own_options() -> None:
    argv = torchrun_command("py", "/b", ["--standalone", "--nproc_per_node=2"], preemptions_per_hour=0.5)
    assert argv == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    "-m", MODULE, "/b", "--preemptions-per-hour", "0.5"]
    assert torchrun_command("py", "/b", [])[-1] == "/b"  # no rate: the option is left out


def test_one_host_runs_the_jobs_ranks_with_the_hosts_python() -> None:
    argv = torchrun_argv(_host(), "/w/b", 3)
    assert argv[0] == "/opt/venv/bin/python"
    assert argv[3:5] == ["--standalone", "--nproc_per_node=3"]


def test_each_node_joins_the_rendezvous_before_the_program() -> None:
    argv = torchrun_nodes_argv(_host(), "/w/b", nodes=2, nproc_per_node=1, endpoint="10.0.0.5:29400",
                               rdzv_id="job-1", is_host=False, preemptions_per_hour=2.0)
    program = argv.index("-m", 3)
    launch = argv[3:program]
    assert {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.5:29400", "--rdzv_id=job-1",
            "--rdzv_conf=is_host=0", "--local_addr=10.0.0.5", "--max_restarts=0"} <= set(launch)
    assert argv[program:] == ["-m", MODULE, "/w/b", "--preemptions-per-hour", "2.0"]


def test_the_local_launch_puts_the_orphan_guard_in_front_of_torchrun() -> None:
    argv = local_argv(Path("/tmp/bundle"), 2)
    assert argv[0] == sys.executable and argv[1] == "-c" and "PR_SET_PDEATHSIG" in argv[2]
    assert argv[4:] == torchrun_command(sys.executable, "/tmp/bundle", ["--standalone", "--nproc_per_node=2"])[1:]
