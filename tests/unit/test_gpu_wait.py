"""How long a job waits for busy GPUs: one environment variable, read when the job waits."""

import pytest

from hybridtrain.errors import NoFeasiblePlacement, SpecError
from hybridtrain.training.local_gpus import DEFAULT_WAIT_S, WAIT_ENV, LocalGpus, gpu_wait_s


def test_the_wait_is_the_variables_seconds_or_the_default() -> None:
    assert gpu_wait_s({WAIT_ENV: "90"}) == 90.0
    assert gpu_wait_s({WAIT_ENV: "0"}) == 0.0
    assert gpu_wait_s({}) == gpu_wait_s({WAIT_ENV: " "}) == DEFAULT_WAIT_S == 6 * 3600


@pytest.mark.parametrize("raw", ["soon", "-5", "nan", "inf"])
def test_a_value_that_is_not_seconds_names_the_variable(raw: str) -> None:
    with pytest.raises(SpecError) as err:
        gpu_wait_s({WAIT_ENV: raw})
    assert str(err.value).count("\n") == 1 and WAIT_ENV in str(err.value) and repr(raw) in str(err.value)


def test_a_claim_reads_the_wait_when_it_waits(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    machine = LocalGpus(["0"], tmp_path)
    held = machine.claim(1, job="first", site="s", wait_s=0)
    try:
        monkeypatch.setenv(WAIT_ENV, "0")  # set after the machine object was made: still the value used
        with pytest.raises(NoFeasiblePlacement, match=r"waited 0 s"):
            machine.claim(1, job="second", site="s")
        monkeypatch.setenv(WAIT_ENV, "later")
        with pytest.raises(SpecError, match=WAIT_ENV):
            machine.claim(1, job="second", site="s")
    finally:
        held.release()
