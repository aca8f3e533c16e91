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

A trial is the parent's until it ``tell``s how it ended: the parent records an Optuna heartbeat for
each trial it asked and has not told (``HEARTBEAT_S``). A parent killed (``kill -9``, a lost host)
leaves its trials RUNNING with a heartbeat that stops; once it is ``STALE_AFTER_S`` old, the next sweep
of the study (when it opens it, and at each ``ask``: a live sweep on the same study too) fails the trial
and queues it again with the same values (Optuna's ``fail_stale_trials`` and its retry callback), and
the retry takes the stale trial's place in ``n_trials``. A parent that stops on an error or Ctrl-C
does the same for its trials at once (``release``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.specs.schema_bounds import bound_numbers
from hybridtrain.specs.sweep import SweepSpec
from hybridtrain.sweeps.registry import PRUNERS, SAMPLERS
from hybridtrain.sweeps.space import SearchSpace

if TYPE_CHECKING:
    import optuna

    from hybridtrain.workspace import Workspace

#: Seconds a SQLite writer waits for another process's lock (parallel trials write at epoch ends).
SQLITE_BUSY_TIMEOUT_S = 60
#: Seconds between the heartbeats a sweep's parent records for each trial it asked and has not told yet.
HEARTBEAT_S = 30
#: Seconds without a heartbeat after which a RUNNING trial is stale (its parent is gone) and is failed. Ten beats:
#: a beat can wait out the SQLite busy timeout, and a live sweep must never fail a sibling's healthy trial.
STALE_AFTER_S = 300
#: Times a stale trial is queued again with its values (a retry that goes stale too counts); then it counts as failed.
STALE_RETRIES = 2


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
        _quiet_heartbeat_warnings()
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                          grace_period=STALE_AFTER_S, **_retry_stale())
    except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, ImportError, ValueError, OSError) as exc:
        how = ("--storage or HYBRIDTRAIN_SWEEP_STORAGE" if field == STORAGE_SETTING
               else f"as {field}, or leave {field} empty for HYBRIDTRAIN_SWEEP_STORAGE, else SQLite in the workspace")
        raise SpecError("sweep storage", [Problem(
            field, f"cannot open the study database {_redact(url)}: {_reason(exc)}. Give a reachable "
            f"sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB ({how})")]) from exc


def _retry_stale() -> dict[str, Any]:
    """The storage argument that queues a stale trial again with its values (Optuna renamed both in 4.9)."""
    from optuna import storages

    if hasattr(storages, "RetryHeartbeatStaleTrialCallback"):
        return {"heartbeat_stale_trial_callback": storages.RetryHeartbeatStaleTrialCallback(max_retry=STALE_RETRIES)}
    return {"failed_trial_callback": storages.RetryFailedTrialCallback(max_retry=STALE_RETRIES)}


def _quiet_heartbeat_warnings() -> None:
    """Hide Optuna's warnings about its heartbeat: experimental, and meant for ``optimize`` (the sweep asks and
    tells, and records the heartbeats itself). Only these messages: the filter is process-wide (adding it again
    replaces it, so it is added where it is needed)."""
    warnings.filterwarnings("ignore", message=r"(Argument ``heartbeat_interval``|Heartbeat of storage is supposed"
                                              r"|optuna\.storages\._heartbeat\.fail_stale_trials|Retry\w*TrialCallback) ")


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

    model_config = ConfigDict(json_schema_extra=bound_numbers)  # a trial's form: see specs.schema_bounds

    number: int
    trial_id: int
    params: dict[str, Any]
    retry_of: int | None = None  # the stale trial (its sweep process died) this one runs again, with its values


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
    """The Optuna study of one sweep (create or continue by name), and the heartbeats of the trials it asked."""

    def __init__(self, study: optuna.Study, sweep: SweepSpec):
        self.study = study
        self.sweep = sweep
        self.space = SearchSpace(sweep.parameters)
        self._held: dict[int, int] = {}  # number -> trial id: asked here, not told yet
        self._lock = threading.Lock()
        self._beating: threading.Thread | None = None

    @classmethod
    def open(cls, url: str, name: str, sweep: SweepSpec) -> SweepStudy:
        """Create the study, or continue the one of that name (same direction required); its stale trials fail."""
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
        opened = cls(study, sweep)
        opened.fail_stale()  # before the resumed sweep counts what it has left
        return opened

    def ask(self) -> TrialTicket:
        """The next trial (a stale trial's retry first), held by this process: its heartbeat goes on until ``tell``."""
        self.fail_stale()  # a sibling sweep's dead trials too, while this one runs
        trial = self.study.ask(fixed_distributions=self.space.distributions())
        self._hold(trial.number, trial._trial_id)
        # Optuna's retry callback names the trial a retry runs again in its system attributes.
        retry_of = trial.storage.get_trial(trial._trial_id).system_attrs.get("failed_trial")
        return TrialTicket(number=trial.number, trial_id=trial._trial_id, params=dict(trial.params), retry_of=retry_of)

    def tell(self, ticket: TrialTicket, state: str, value: float | None = None) -> None:
        """Record how the trial ended: ``complete`` (with its objective), ``pruned`` or ``failed``."""
        import optuna

        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "failed": optuna.trial.TrialState.FAIL}
        if state == "complete" and (value is None or not math.isfinite(value)):
            state = "failed"  # Optuna refuses a complete trial without a finite value
        try:
            self.study.tell(ticket.number, value if state == "complete" else None, state=states[state],
                            skip_if_finished=True)
        finally:
            with self._lock:
                self._held.pop(ticket.number, None)

    def fail_stale(self) -> None:
        """Fail the study's RUNNING trials whose heartbeat is older than ``STALE_AFTER_S`` (their sweep process
        died), each queued again with its values up to ``STALE_RETRIES`` times (Optuna's own mechanism)."""
        import optuna

        _quiet_heartbeat_warnings()  # again: a caller's catch_warnings (pytest's, per test) drops it on its way out
        optuna.storages.fail_stale_trials(self.study)

    def release(self) -> list[int]:
        """Fail the trials this process asked and never told, queued again as stale ones are; their numbers.

        For a sweep that stops on an error or Ctrl-C: no one will tell them, and a sweep run again at once
        would otherwise wait ``STALE_AFTER_S`` before their heartbeats are old enough to fail them. Never
        raises (it runs while the sweep's own error unwinds): a trial it cannot fail stops beating and goes stale.
        """
        import optuna

        with self._lock:
            held, self._held = self._held, {}
        storage = self.study._storage
        get = getattr(storage, "get_heartbeat_stale_trial_callback", None) or storage.get_failed_trial_callback
        retry = get()
        for number, trial_id in held.items():
            try:
                if storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL) and retry:
                    retry(self.study, storage.get_trial(trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # told meanwhile, or failed as stale by another process
            except Exception as exc:  # noqa: BLE001 - see above
                logging.getLogger(__name__).warning("sweep: trial %d not failed (%s); the next sweep fails it once its "
                                                    "heartbeat is %d s old", number, _reason(exc), STALE_AFTER_S)
        return sorted(held)

    def _hold(self, number: int, trial_id: int) -> None:
        with self._lock:
            self._held[number] = trial_id
            if self._beating is None:
                self._beating = threading.Thread(target=self._beat, name="sweep-heartbeat", daemon=True)
                self._beating.start()
        # The first beat at once: a trial without any heartbeat is never judged stale (Optuna skips it).
        self._record(trial_id)

    def _beat(self) -> None:
        """Every heartbeat interval, a heartbeat for each held trial; ends when none is held (the next ``ask`` starts
        another). A daemon: it dies with the process, which is what makes a killed sweep's trials stale."""
        import time

        interval = self.study._storage.get_heartbeat_interval() or HEARTBEAT_S
        while True:
            time.sleep(interval)
            with self._lock:
                ids = list(self._held.values())
                if not ids:
                    self._beating = None
                    return
            for trial_id in ids:
                self._record(trial_id)

    def _record(self, trial_id: int) -> None:
        try:
            self.study._storage.record_heartbeat(trial_id)
        except Exception as exc:  # noqa: BLE001 - a missed beat is made up by the next: STALE_AFTER_S is ten beats
            logging.getLogger(__name__).warning("sweep: heartbeat of trial id %d not recorded (%s); trying again in "
                                                "%d s", trial_id, _reason(exc), HEARTBEAT_S)

    def counts(self) -> dict[str, int]:
        """Trials by Optuna state; a stale trial that was queued again is ``interrupted``, not ``fail``: its retry
        (``waiting`` until asked) takes its place."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
        out: dict[str, int] = {}
        for t in trials:
            state = "interrupted" if t.state.name == "FAIL" and t.number in retried else t.state.name.lower()
            out[state] = out.get(state, 0) + 1
        return out

    def ended(self) -> int:
        """Trials that count towards ``n_trials``: complete, pruned or failed (not interrupted, running or waiting)."""
        counts = self.counts()
        return sum(counts.get(s, 0) for s in ("complete", "pruned", "fail"))

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
