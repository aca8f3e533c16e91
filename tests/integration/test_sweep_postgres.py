"""Sweep storage on the served stack's database: a real PostgreSQL server (Debian's postgresql) on loopback.

The study is opened from ``HYBRIDTRAIN_SWEEP_STORAGE=postgresql://…`` (psycopg 3) by the sweep's
parent, a trial reports its epochs through a second connection as a worker elsewhere would, and the
median pruner stops a trial that is behind; a wrong URL is one clear error naming the setting.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridtrain.errors import SpecError
from hybridtrain.specs.sweep import SweepSpec

pytestmark = pytest.mark.slow
PG_BIN = Path("/usr/lib/postgresql")


def pg_tool(name: str) -> str:
    found = shutil.which(name) or next((str(p) for p in sorted(PG_BIN.glob(f"*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's postgresql (`.ci/run` does)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port (run as the postgres user when we are root)."""
    user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="hybridtrain-pg-"))
    if user is not None:
        os.chown(base, user.pw_uid, user.pw_gid)
    as_user = {"user": user.pw_uid, "group": user.pw_gid} if user else {}
    subprocess.run([pg_tool("initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "hybridtrain", "--no-sync"],
                   check=True, capture_output=True, timeout=120, **as_user)
    port = free_port()
    proc = subprocess.Popen([pg_tool("postgres"), "-D", str(base / "data"), "-p", str(port), "-h", "127.0.0.1",
                             "-k", str(base), "-F"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **as_user)
    url = f"postgresql://hybridtrain:unused@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start (exit {proc.poll()})")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # fast shutdown: the study's pooled connections need not close first
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


def test_study_on_postgresql_from_the_setting_with_pruning(postgres, tmp_path, monkeypatch):
    from hybridtrain.sweeps.study import SweepStudy, TrialPruned, open_for_trial, storage_url
    from hybridtrain.workspace import Workspace

    monkeypatch.setenv("HYBRIDTRAIN_SWEEP_STORAGE", postgres)
    url = storage_url(Workspace.resolve(tmp_path))
    assert url.startswith("postgresql+psycopg://")
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}},
                                      "pruner": {"startup_trials": 1, "warmup_epochs": 1}})
    study = SweepStudy.open(url, "pg-sweep", sweep)
    first = study.ask()
    reporter = open_for_trial(url, "pg-sweep", sweep).reporter(first)
    reporter(0, {"val_auc": 0.8})
    reporter(1, {"val_auc": 0.85})
    study.tell(first, "complete", 0.85)
    second = study.ask()
    with pytest.raises(TrialPruned):
        open_for_trial(url, "pg-sweep", sweep).reporter(second)(0, {"val_auc": 0.7})
    study.tell(second, "pruned")
    assert SweepStudy.open(url, "pg-sweep", sweep).counts() == {"complete": 1, "pruned": 1}
    assert not (tmp_path / ".hybridtrain").exists()  # nothing went to the SQLite default


def test_an_unreachable_database_is_one_clear_error(tmp_path):
    from hybridtrain.sweeps.study import SweepStudy, storage_url
    from hybridtrain.workspace import Workspace

    url = storage_url(Workspace.resolve(tmp_path), f"postgresql://u:secret@127.0.0.1:{free_port()}/nope")
    sweep = SweepSpec.model_validate({"parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}}})
    with pytest.raises(SpecError) as info:
        SweepStudy.open(url, "s", sweep)
    text = str(info.value)
    assert "HYBRIDTRAIN_SWEEP_STORAGE" in text and "cannot open the study database" in text
    assert "secret" not in text  # the password is not echoed
