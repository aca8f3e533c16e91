"""The flow the pool-order test deploys: a stand-in train run that holds its pool slot until told to let go."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow


@flow(name="slot-holder")
def slot_holder(release: str | None = None, timeout_s: float = 120.0) -> None:
    """Hold the slot until the file ``release`` exists (at most ``timeout_s``); without one, end at once."""
    deadline = time.monotonic() + timeout_s
    while release is not None and not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear within {timeout_s:g} s")
        time.sleep(0.1)
