"""SqliteStore: the MLflow tracking database in one SQLite file, which exists whole (MLflow's current schema) or not at all.

MLflow makes a SQLite store in place on first use: it creates the initial tables and then runs every
schema migration, 2–4 s in all, and SQLite commits each statement of a migration as it goes. A process
stopped in that window (Ctrl-C during the first ``hybridtrain run`` of a workspace) leaves a file
half-way through the migrations, which MLflow refuses from then on (``Detected out-of-date database
schema``) and which ``mlflow db upgrade`` cannot finish either (a table the interrupted migration had
already made exists).

``ensure_sqlite_store(path)`` runs before anything opens the store (``Registry`` calls it for a
``sqlite:///`` tracking URI):

- at MLflow's current schema: nothing to do (one read of its ``alembic_version``);
- missing: the tables are made in a temporary file beside it (``.mlflow.db.tmp-*``), which is then moved
  into place whole — an interruption leaves only the temporary file, removed by the next creation;
- at another schema but empty — no run, no registered model, no experiment but MLflow's Default: what
  an interrupted creation leaves — it is made again the same way (the empty file is deleted);
- at another schema with something in it (a store of another MLflow version, say): ``TrackingStoreUnusable``,
  one line naming the file, what it holds and what to do; nothing is changed.

Creation and re-creation happen under a lock file beside the store (``<name>.init.lock``), so two
processes that start at once make one store, and a store that is in use is never replaced.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import tempfile
from pathlib import Path

from hybridtrain.errors import HybridtrainError, TransientError

#: Seconds to wait for another process that is creating the same store (it takes a few seconds).
LOCK_TIMEOUT_S = 120.0


class TrackingStoreUnusable(HybridtrainError):
    """The SQLite tracking store exists but cannot be used as it is (another MLflow version's schema, not a database)."""

    def __init__(self, path: Path | str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"MLflow tracking store {path}: {problem}")


@functools.lru_cache(maxsize=1)
def current_schema() -> str:
    """The schema revision this MLflow expects (the head of its migrations)."""
    from mlflow.store.db.utils import _get_latest_schema_revision  # lazy: heavy (mlflow)

    return str(_get_latest_schema_revision())


def _known_schema(revision: str) -> bool:
    """Whether ``revision`` is one of this MLflow's migrations (else a newer MLflow made the store)."""
    from alembic.script import ScriptDirectory  # lazy: heavy (alembic, with mlflow)
    from alembic.script.revision import RevisionError  # lazy: heavy (alembic, with mlflow)
    from alembic.util import CommandError  # lazy: heavy (alembic, with mlflow)
    from mlflow.store.db.utils import _get_alembic_config  # lazy: heavy (mlflow)

    try:
        return ScriptDirectory.from_config(_get_alembic_config(db_url="")).get_revision(revision) is not None
    except (CommandError, RevisionError):  # an id none of its migrations has
        return False


def _open(path: Path) -> sqlite3.Connection:
    # Read-write (never create): SQLite rolls back a transaction an interrupted writer left in a journal.
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=30)


def _schema(path: Path) -> str | None:
    """The store's schema revision; None when it has none (no tables yet). Raises ``sqlite3.DatabaseError``."""
    with contextlib.closing(_open(path)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "alembic_version" not in tables:
            return None
        row = db.execute("SELECT version_num FROM alembic_version").fetchone()
        return str(row[0]) if row else None


def _contents(path: Path) -> dict[str, int]:
    """What the store holds that a re-creation would lose: counts per kind, zeros left out."""
    queries = {"run(s)": "SELECT COUNT(*) FROM runs",
               "registered model(s)": "SELECT COUNT(*) FROM registered_models",
               "logged model(s)": "SELECT COUNT(*) FROM logged_models",
               "experiment(s)": "SELECT COUNT(*) FROM experiments WHERE experiment_id != 0"}
    out: dict[str, int] = {}
    with contextlib.closing(_open(path)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for what, sql in queries.items():
            table = sql.split(" FROM ")[1].split()[0]
            n = int(db.execute(sql).fetchone()[0]) if table in tables else 0
            if n:
                out[what] = n
    return out


def _create(path: Path) -> None:
    """Make the store's tables in a temporary file beside ``path``, then move it into place (the caller holds the lock)."""
    import sqlalchemy  # lazy: heavy (with mlflow)
    from mlflow.store.db.utils import _initialize_tables, _verify_schema  # lazy: heavy (mlflow)

    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    os.close(fd)
    tmp = Path(name)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
            _verify_schema(engine)
        finally:
            engine.dispose()
        try:
            os.link(tmp, path)  # never over a store that appeared meanwhile (one made by `mlflow server`, say)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links; the lock keeps other hybridtrain processes out
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_leftovers(path: Path) -> None:
    """Temporary files of creations that were interrupted (none is in progress: the caller holds the lock)."""
    for left in path.parent.glob(f".{path.name}.tmp-*"):
        left.unlink(missing_ok=True)


def _unusable(path: Path, found: str | None, contents: dict[str, int]) -> TrackingStoreUnusable:
    held = ", ".join(f"{n} {what}" for what, n in contents.items())
    uri = f"sqlite:///{path}"
    if found is not None and not _known_schema(found):
        return TrackingStoreUnusable(path, f"its schema {found} is newer than this MLflow's ({current_schema()}) "
                                           f"and it holds {held}; use the MLflow version that made it, or point "
                                           "HYBRIDTRAIN_MLFLOW_TRACKING_URI at another store")
    return TrackingStoreUnusable(path, f"its schema is {found or 'missing'}, this MLflow expects {current_schema()}, "
                                       f"and it holds {held}; back the file up, then run `mlflow db upgrade {uri}`")


def ensure_sqlite_store(path: Path | str) -> None:
    """Make sure the SQLite store at ``path`` exists at MLflow's current schema (see the module docstring)."""
    from filelock import FileLock, Timeout  # lazy: only when a store is opened

    path = Path(path)
    try:
        if path.is_file() and _schema(path) == current_schema():
            return
    except sqlite3.DatabaseError:
        pass  # judged again below, under the lock
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f"{path.name}.init.lock")
    try:
        with FileLock(str(lock), timeout=LOCK_TIMEOUT_S):
            _ensure_locked(path)
    except Timeout:
        raise TransientError(f"MLflow tracking store {path}: another process has been creating it for "
                             f"{LOCK_TIMEOUT_S:g} s (lock file {lock}); retry") from None


def _ensure_locked(path: Path) -> None:
    _remove_leftovers(path)
    if path.exists() and not path.is_file():
        raise TrackingStoreUnusable(path, "is not a file (a directory?); move it aside or point "
                                          "HYBRIDTRAIN_MLFLOW_TRACKING_URI at the store")
    if path.is_file():
        try:
            found = _schema(path)
            if found == current_schema():
                return  # another process made it while this one waited for the lock
            contents = _contents(path)
        except sqlite3.DatabaseError as exc:
            raise TrackingStoreUnusable(path, f"cannot be read as an SQLite database ({exc}); move it aside and "
                                              "run again to start a new, empty store") from None
        if contents:
            raise _unusable(path, found, contents)
        # Empty and half-made: what an interrupted creation (an older hybridtrain, or MLflow itself) leaves.
        # Its journal files go too: SQLite would roll a journal left beside the new file into it.
        for suffix in ("-journal", "-wal", "-shm", ""):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    _create(path)
