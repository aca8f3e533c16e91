"""The SQLite tracking store is created whole or not at all: a creation stopped part-way (Ctrl-C during the first run of
a workspace) does not brick the workspace, an empty half-made store is made again, and a store with content at another
schema is refused in one line that says what to do, and left as it was."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy
from mlflow.store.db.utils import _initialize_tables

from hybridtrain.tracking.model_registry import Registry
from hybridtrain.tracking.sqlite_store import TrackingStoreUnusable, current_schema

ROOT = Path(__file__).resolve().parents[2]
#: An older MLflow schema revision (the one the QA's interrupted store was left at).
OLDER = "75868b020152"

# MLflow making the store in place, as Registry did before: the way an older hybridtrain (or `mlflow server`) creates it.
IN_PLACE = "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore; SqlAlchemyStore({uri!r}, {art!r})"
THROUGH_REGISTRY = "from hybridtrain.tracking.model_registry import Registry; Registry({uri!r}, {art!r})"


def schema(path: Path) -> str | None:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def stamp(path: Path, revision: str) -> None:
    """Make a store claim another schema revision, as a store of another MLflow version (or a half-made one) does."""
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # a temporary copy, moved into place or removed just now
        return 0


def kill_while_creating(code: str, folder: Path, at_bytes: int = 300_000, timeout_s: float = 300) -> None:
    """Run ``code`` (which creates the store in ``folder``) and SIGKILL it once a store file there, final or temporary,
    has grown to ``at_bytes``: part-way through MLflow's migrations (a whole store is about 950 kB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if any(size(p) >= at_bytes for p in folder.iterdir()
                   if p.name == "mlflow.db" or (".tmp-" in p.name and not p.name.endswith("-journal"))):
                break
            if proc.poll() is not None:
                pytest.fail(f"the store was made (exit {proc.returncode}) before it could be interrupted")
            time.sleep(0.01)
        else:
            pytest.fail(f"no store file reached {at_bytes} bytes in {timeout_s} s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def usable(tmp: Path, uri: str) -> None:
    """The store works: a run can be started and read back, and it is at this MLflow's schema."""
    registry = Registry(uri, tmp / "artifacts")
    run_id = registry.start_run("store-tests", "after", {"hybridtrain.job": "churn"})
    assert registry.run_status(run_id) == "RUNNING"
    assert schema(Path(uri.removeprefix("sqlite:///"))) == current_schema()


def test_a_store_creation_killed_part_way_leaves_no_half_made_store(tmp_path):
    folder = tmp_path / "mlflow"
    folder.mkdir()
    store = folder / "mlflow.db"
    uri = f"sqlite:///{store}"
    kill_while_creating(THROUGH_REGISTRY.format(uri=uri, art=str(tmp_path / "artifacts")), folder)
    assert not store.exists() or schema(store) == current_schema()  # whole or not at all
    usable(tmp_path, uri)
    assert sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name) == []  # the leftover copy is gone


def test_an_empty_store_left_half_made_by_an_interrupted_creation_is_made_again(tmp_path):
    folder = tmp_path / "mlflow"
    folder.mkdir()
    store = folder / "mlflow.db"
    uri = f"sqlite:///{store}"
    kill_while_creating(IN_PLACE.format(uri=uri, art=str(tmp_path / "artifacts")), folder)
    assert schema(store) != current_schema()  # what the QA found: MLflow refuses this store from now on
    usable(tmp_path, uri)


def test_an_empty_store_at_an_older_schema_is_made_again(tmp_path):
    store = tmp_path / "mlflow.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{store}")
    try:
        _initialize_tables(engine)  # every table, nothing in them
    finally:
        engine.dispose()
    stamp(store, OLDER)
    usable(tmp_path, f"sqlite:///{store}")


@pytest.mark.parametrize("revision, says", [
    (OLDER, "back the file up, then run `mlflow db upgrade sqlite:///{store}`"),
    ("ffffffffffff", "newer than this MLflow's"),
])
def test_a_store_with_runs_at_another_schema_is_refused_in_one_line_and_left_alone(tmp_path, revision, says):
    store = tmp_path / "mlflow.db"
    registry = Registry(f"sqlite:///{store}", tmp_path / "artifacts")
    registry.start_run("store-tests", "kept", {"hybridtrain.job": "churn"})
    stamp(store, revision)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    with pytest.raises(TrackingStoreUnusable) as exc:
        Registry(f"sqlite:///{store}", tmp_path / "artifacts")
    message = str(exc.value)
    assert "\n" not in message and str(store) in message and "1 run(s)" in message
    assert says.format(store=store) in message
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before and schema(store) == revision
