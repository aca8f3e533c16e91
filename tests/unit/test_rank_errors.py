"""Which rank's error a failed torchrun job reports: its own failure, not the others' echo of it."""

from __future__ import annotations

from hybridtrain.remote.host_training import first_error

ECHO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:921")
OWN = "dataset data/approved/churn failed validation: version ffff could not be fetched"


def test_a_ranks_own_failure_wins_over_its_peers_lost_connection_whatever_the_rank():
    assert first_error({"error.0.txt": ECHO, "error.1.txt": OWN}) == OWN
    assert first_error({"error.1.txt": ECHO, "error.0.txt": OWN + "\n"}) == OWN
    nccl = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"
    assert first_error({"error.0.txt": nccl, "error.3.txt": "CUDA out of memory on GPU 3"}) == \
        "CUDA out of memory on GPU 3"


def test_among_equals_the_lowest_rank_speaks_and_nothing_is_said_without_files():
    assert first_error({"error.2.txt": "B", "error.10.txt": "C", "error.1.txt": "A"}) == "A"
    assert first_error({"error.1.txt": ECHO, "error.0.txt": ECHO + " (0)"}) == ECHO + " (0)"
    assert first_error({}) == "" and first_error({"error.0.txt": "  \n"}) == ""
