"""SweepStudy: one sweep's Optuna study in the project's database — ask for trials, hear their epochs, record how they ended.

Storage (one precedence, as every setting): ``--storage`` > ``HYBRIDTRAIN_SWEEP_STORAGE`` > the
served stack's PostgreSQL database ``optuna`` when this process talks to that stack (``make up`` of
this workspace, ``PREFECT_API_URL`` at its API; its workers get the setting in their environment) >
a SQLite file under the workspace's state directory (``.hybridtrain/sweeps/optuna.db``) on the
embedded default. PostgreSQL is driven by psycopg 3. Every process that runs a trial opens the same study by name, so a trial
running in a cloud worker reports its epochs to the database the sweep's parent reads.

An example (``pruner: median, warmup_epochs: 1``): the parent ``ask``s trial 5 with its values;
the trial's process opens an ``EpochReporter`` on trial 5 and trains; after epoch 1 the reporter
stores ``val_auc`` at step 1 and asks the pruner, which compares it with the median of the
finished trials at step 1: below it, so ``TrialPruned`` ends training at once and the trial's
capacity is free; the parent ``tell``s the study trial 5 was pruned and asks for the next.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.specs.sweep import SweepSpec
from hybridtrain.sweeps.registry import PRUNERS, SAMPLERS
from hybridtrain.sweeps.space import SearchSpace

if TYPE_CHECKING:
    import optuna

    from hybridtrain.workspace import Workspace

#: Seconds a SQLite writer waits for another process's lock (parallel trials write at epoch ends).
SQLITE_BUSY_TIMEOUT_S = 60


class SweepSettings(BaseSettings):
    """``HYBRIDTRAIN_SWEEP_<NAME>`` settings."""

    model_config = SettingsConfigDict(env_prefix="HYBRIDTRAIN_SWEEP_", extra="ignore")

    storage: str | None = Field(None, description="Optuna storage URL; default SQLite under .hybridtrain/sweeps/.")


def storage_url(ws: Workspace, override: str | None = None) -> str:
    """Where studies live: ``override`` (CLI flag) > ``HYBRIDTRAIN_SWEEP_STORAGE`` > the served stack's database
    when ``PREFECT_API_URL`` is that stack's API > SQLite in the workspace."""
    url = override or SweepSettings().storage or _served_stack_storage(ws)
    if not url:
        return f"sqlite:///{ws.state_dir / 'sweeps' / 'optuna.db'}"
    if url.startswith(("postgresql://", "postgres://")):
        # SQLAlchemy's default PostgreSQL driver is psycopg2; the project ships psycopg 3.
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _served_stack_storage(ws: Workspace) -> str | None:
    """The ``optuna`` database of this workspace's served stack, if this process's Prefect API is that stack's."""
    from hybridtrain.service.stack import Stack

    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not api:
        return None
    stack = Stack.load(ws.root)
    return stack.sweep_storage if stack is not None and stack.prefect_api == api else None


_STORAGES: dict[str, Any] = {}
_STORAGES_LOCK = threading.Lock()


#: How the CLI's user sets the storage (``--storage`` > this variable), named when it cannot be opened.
STORAGE_SETTING = "HYBRIDTRAIN_SWEEP_STORAGE"


def storage_field(override: str | None, name: str) -> str:
    """The setting a storage URL came from, for messages: ``name`` (the caller's own name for ``override``:
    the flows' ``storage`` parameter, the CLI's ``--storage``) when given, else ``HYBRIDTRAIN_SWEEP_STORAGE``
    when set, else ``name`` again (the default a user replaces by giving it)."""
    if not override and SweepSettings().storage:
        return STORAGE_SETTING
    return name


def open_storage(url: str, field: str = STORAGE_SETTING) -> Any:
    """An Optuna RDB storage on ``url``, one per URL and process; the SQLite file's directory is created on first use.

    Opening one costs a new engine and connection pool, Optuna's schema check and version query:
    every trial run in this process (the sweep's parent, a worker) shares the first one instead
    (thread-safe: Optuna gives each thread its own session). A URL that cannot be opened is a
    ``SpecError`` naming ``field``, the setting the user gave it with (``storage_field``): the sweep
    flow opens it first, so a bad one is refused before any data is prepared or MLflow run opened.
    """
    with _STORAGES_LOCK:
        storage = _STORAGES.get(url)
        if storage is None:
            storage = _STORAGES[url] = _new_storage(url, field)
        return storage


def _new_storage(url: str, field: str) -> Any:
    import sqlite3

    import optuna
    import sqlalchemy.exc

    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    try:
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_ahead_log(path)
            kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=None)
    except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, ImportError, ValueError, OSError) as exc:
        how = ("--storage or HYBRIDTRAIN_SWEEP_STORAGE" if field == STORAGE_SETTING
               else f"as {field}, or leave {field} empty for HYBRIDTRAIN_SWEEP_STORAGE, else SQLite in the workspace")
        raise SpecError("sweep storage", [Problem(
            field, f"cannot open the study database {_redact(url)}: {_reason(exc)}. Give a reachable "
            f"sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB ({how})")]) from exc


def _reason(exc: BaseException) -> str:
    """The error's own first line (SQLAlchemy adds a background link, sqlite3 the statement)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _write_ahead_log(path: Path) -> None:
    """Put the study's SQLite file in write-ahead-log mode (kept in the file: once is enough).

    In SQLite's default rollback-journal mode a writer waits for every open reader to finish: with
    a sweep's trials reading and writing the study from several threads and processes (the parent's
    ask and tell, each trial's epoch reports and the pruner's reads), a trial's write waited up to
    the whole busy timeout (60 s). In WAL mode readers and the one writer do not block each other.
    """
    import sqlite3

    with contextlib.closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


class TrialTicket(BaseModel):
    """A trial the study handed out: its number, its id in the storage and its values (as stored)."""

    number: int
    trial_id: int
    params: dict[str, Any]


class TrialPruned(HybridtrainError):
    """The pruner stopped this trial after an epoch: its metric is behind the others' at that epoch."""

    exit_code = 0

    def __init__(self, number: int, epoch: int, value: float):
        self.number, self.epoch, self.value = number, epoch, value
        super().__init__(f"trial {number} pruned after epoch {epoch} (objective {value:.4f})")


class TrialDiverged(HybridtrainError):
    """The trial's objective became NaN or infinite: its values make training diverge; it fails (never retried)."""

    exit_code = 1

    def __init__(self, number: int, epoch: int, metric: str, value: float):
        super().__init__(f"trial {number} diverged: {metric} is {value} after epoch {epoch}; its values make "
                         "training unstable (e.g. a learning rate too large): narrow the sweep's range")


class SweepStudy:
    """The Optuna study of one sweep (create or continue by name)."""

    def __init__(self, study: optuna.Study, sweep: SweepSpec):
        self.study = study
        self.sweep = sweep
        self.space = SearchSpace(sweep.parameters)

    @classmethod
    def open(cls, url: str, name: str, sweep: SweepSpec) -> SweepStudy:
        """Create the study, or continue the one of that name (same direction required)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        direction = sweep.objective.resolved_direction
        sampler = SAMPLERS.get(sweep.sampler.name)(sweep.sampler, sweep)
        pruner = PRUNERS.get(sweep.pruner.name)(sweep.pruner)
        storage = open_storage(url)
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction=direction, sampler=sampler,
                                        pruner=pruner, load_if_exists=True)
        except ValueError as exc:
            raise SpecError("sweep", [Problem("sweep.study_name", f"study {name!r}: {exc}; choose a new study_name")]) from exc
        if study.direction.name.lower() != direction:
            raise SpecError("sweep", [Problem("sweep.objective.direction", (
                f"study {name!r} already exists and {study.direction.name.lower()}s; this spec {direction}s. Choose a "
                "new sweep.study_name"))])
        return cls(study, sweep)

    def ask(self) -> TrialTicket:
        trial = self.study.ask(fixed_distributions=self.space.distributions())
        return TrialTicket(number=trial.number, trial_id=trial._trial_id, params=dict(trial.params))

    def tell(self, ticket: TrialTicket, state: str, value: float | None = None) -> None:
        """Record how the trial ended: ``complete`` (with its objective), ``pruned`` or ``failed``."""
        import optuna

        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "failed": optuna.trial.TrialState.FAIL}
        if state == "complete" and (value is None or not math.isfinite(value)):
            state = "failed"  # Optuna refuses a complete trial without a finite value
        self.study.tell(ticket.number, value if state == "complete" else None, state=states[state],
                        skip_if_finished=True)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name.lower()] = out.get(t.state.name.lower(), 0) + 1
        return out

    def best(self) -> tuple[int, float, dict[str, Any]] | None:
        """(number, objective, decoded values) of the best complete trial; None before one completes."""
        import optuna

        if not self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            return None
        t = self.study.best_trial
        return t.number, float(t.value), self.space.decode(t.params)

    def reporter(self, ticket: TrialTicket, prune: bool = True) -> EpochReporter:
        return EpochReporter(self.study, ticket, self.sweep.objective.metric, prune)


class EpochReporter:
    """The trainer's ``on_epoch`` for one trial: stores the objective per epoch and stops a pruned trial.

    Epoch ``e`` (0-based, as the trainer counts) is reported as step ``e + 1``, the epochs done.
    A resumed trial reports its replayed epochs again; Optuna keeps the first value of a step.
    """

    def __init__(self, study: optuna.Study, ticket: TrialTicket, metric: str, prune: bool = True):
        import optuna

        self.trial = optuna.trial.Trial(study, ticket.trial_id)
        self.ticket = ticket
        self.metric = metric
        self.prune = prune
        self.epochs = 0
        self.last: float | None = None

    def __call__(self, epoch: int, metrics: dict[str, float]) -> None:
        import warnings

        value = float(metrics[self.metric])
        self.epochs, self.last = epoch + 1, value
        if not math.isfinite(value):
            raise TrialDiverged(self.ticket.number, epoch + 1, self.metric, value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "already reported" after a resume: the first value stays
            self.trial.report(value, epoch + 1)
        if self.prune and self.trial.should_prune():
            raise TrialPruned(self.ticket.number, epoch + 1, value)


def open_for_trial(url: str, name: str, sweep: SweepSpec) -> SweepStudy:
    """The study as a trial's process sees it: loaded by name, with the sweep's pruner (not kept in the database)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=open_storage(url), pruner=PRUNERS.get(sweep.pruner.name)(sweep.pruner))
    return SweepStudy(study, sweep)
