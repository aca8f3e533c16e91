"""Sweep flow: a hyperparameter sweep of one job — one parent flow run, a subflow run per trial attempt, placed by the policy.

The parent prepares the data once (as the lifecycle does), opens the Optuna study
(``hybridtrain.sweeps``), and keeps ``sweep.parallelism`` trials running: each trial is placed
by the engine with the sweep's job class (opportunistic: spot allowed) and trained by a
``sweep-trial`` subflow run in the pool of its site (or in this process on the embedded
default), under the same recovery rules as any training: a preempted trial resumes from its
checkpoint (here or re-placed), a real failure is retried, and a trial that fails for good is
recorded as failed while the others go on. A pruned trial ends after the epoch the pruner named
and its slot takes the next trial at once: up to ``parallelism`` more trials are kept ready
(asked, placed, their subflow runs started; ``hybridtrain.sweeps.slots``) and each takes a slot
just before it trains, so a freed slot never waits for that per-trial API work. As trials end,
the ``sweep-<job>`` table artifact is updated; at the end the best trial goes through evaluation
and the promotion gates, with every trial's attempts in the promoted version's ledger line, and
Optuna's plots go to MLflow.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Annotated, Any

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, Field

from flows.data import Prepared, prepare_data, sync_data
from flows.lifecycle import QUEUE_ALLOWANCE_S, validate_spec
from flows.supervise import as_exception
from flows.training import MAX_ATTEMPTS, AttemptEnd, save_attempt_end
from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import Problem, SpecError, StageFailed
from hybridtrain.governance.ledger import RUN_RECORD_ARTIFACT, RUN_RECORD_TAG, AttemptOutcome, AttemptRecord
from hybridtrain.specs.job import JobSpec
from hybridtrain.sweeps.plan import TrialDurations, trial_job, trial_placement_spec
from hybridtrain.sweeps.results import SweepResults, TrialRow, attempt_cost
from hybridtrain.sweeps.slots import Slot, SweepSlots, SweepStopping
from hybridtrain.sweeps.space import SearchSpace
from hybridtrain.sweeps.study import TrialTicket, open_storage, storage_field, storage_url
from hybridtrain.sweeps.trial import TrialOutcome
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training.preemption import preemption_trap
from hybridtrain.training.recovery import Attempt, Outcome, Placed, Supervisor
from hybridtrain.workspace import Workspace
from orchestration.context import run_workspace
from orchestration.dispatch import Mode, deployment_name, has_deployment, retry_transient, run_stage, workers_online
from tasks.health import check_sites
from tasks.placement import place
from tasks.sweep import evaluate_best, open_study, publish_plots, train_trial
from tasks.tracking import close_run, open_run, promote, record_data
from tasks.training import move_checkpoint


class SweepSummary(BaseModel):
    """What a sweep did: its trials, the best one, and what happened to it at the gates."""

    job: str
    study: str
    storage: str
    mlflow_run_id: str
    trials: list[TrialRow]
    best_trial: int | None
    best_value: float | None
    best_params: dict[str, Any] | None
    cost_usd: float
    trial_epochs: int
    promoted: bool | None
    model_version: str | None
    gates: dict[str, str]
    reasons: list[str]
    plots: list[str]
    seconds: float
    trials_seconds: float = 0.0  # from the first trial's start to the last one's end


def _trial_result_name(number: int, attempt: int) -> str:
    return f"sweep-trial-{number}-attempt-{attempt}"


#: Seconds the sweep waits for its first trials to start training before it asks the ones it keeps ready.
READY_WAIT_S = 60.0
#: How long in a row a trial's attempt asks a Prefect API that does not answer before the attempt fails.
API_RETRY_S = 300.0

#: The slot of the trial whose subflow runs in this thread (in-process trials): its body takes it before training.
_SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("hybridtrain_sweep_slot", default=None)


@flow(name="sweep-trial", flow_run_name="trial-{ticket.number}-attempt-{attempt}-at-{site}", log_prints=True)
def sweep_trial(spec: JobSpec, approved: DatasetVersion, site: str, parent_run_id: str, storage: str, study: str,
                ticket: TrialTicket, attempt: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] = 1,
                workspace: str | None = None, capacity_class: str | None = None) -> TrialOutcome:
    """One attempt of one trial at ``site``: train with the trial's values, reporting each epoch to the study.

    ``capacity_class`` is the trial's placement (``opportunistic``: the instances a multi-node trial starts
    at a cloud site are spot ones); empty: the site's own class."""
    ws = run_workspace(workspace)
    # Before a slot or GPUs are taken: a wrong id or storage would fail only after training.
    stages.check_run(ws, parent_run_id, "parent_run_id", started_by="hyperparameter-sweep")
    open_storage(storage, "storage")
    slot = _SLOT.get()
    if slot is not None and not slot.held:
        slot.take()  # ready (placed, this run started): train as soon as one of the sweep's slots is free
        if slot.waited_s >= 1.0:
            get_run_logger().info("trial %d: ready %.1f s before a slot was free", ticket.number, slot.waited_s)
    # One trap for the whole attempt: a notice after training ended (while the result is saved) is
    # recorded and the attempt still ends completed, instead of the signal crashing a finished trial.
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None  # tagged on the trial run, for the reaper
    with preemption_trap(spec.checkpoint.preemption_grace_s):
        try:
            out = train_trial(ws, spec, approved, site, parent_run_id, storage, study, ticket, capacity_class,
                              flow_run_id)
        except Exception as exc:
            save_attempt_end(ws, parent_run_id, f"{_trial_result_name(ticket.number, attempt)}-end",
                             AttemptEnd.of(exc, site))
            raise
        stages.save_result(ws, parent_run_id, _trial_result_name(ticket.number, attempt), out)
    if slot is not None:
        slot.give_back()  # trained to its end: the next ready trial trains while this run's end is recorded
    return out


def dispatch_trial(ws: Workspace, params: dict[str, Any], site: str, mode: Mode, timeout_s: float,
                   parent_run_id: str, slot: Slot | None = None, *,
                   clock: Callable[[], float] = time.monotonic) -> TrialOutcome:
    """Run one attempt as a subflow run: in the site's pool (its deployment), or in this process.

    ``slot``: the trial's slot, taken before it trains — in this process by the subflow's body
    (its run is created and started while the slots are still busy), for a pool before the run
    is created (a worker starts a run as soon as it sees it). A Prefect API that does not answer
    for now (``transient_api_error``: a busy server's 503, a refused connection) is asked again,
    with a growing pause, until it has failed for ``API_RETRY_S`` in a row (a call that ran longer
    than that before it failed starts a new count): in a pool the same flow run comes back (its
    idempotency key), in this process the attempt starts again and resumes from the trial's
    checkpoint. It does not fail the trial.
    """
    return retry_transient(math.inf, lambda: _dispatch_once(ws, params, site, mode, timeout_s, parent_run_id, slot),
                           get_run_logger(), window_s=API_RETRY_S, clock=clock)


def _dispatch_once(ws: Workspace, params: dict[str, Any], site: str, mode: Mode, timeout_s: float,
                   parent_run_id: str, slot: Slot | None) -> TrialOutcome:
    from prefect.deployments import run_deployment

    pool = ws.load_sites().get(site).work_pool
    name = deployment_name(sweep_trial, pool)
    inline = mode == "inline" or (mode == "auto" and not has_deployment(name))
    if inline:
        token = _SLOT.set(slot)
        try:
            return sweep_trial(**params, workspace=str(ws.root))
        finally:
            _SLOT.reset(token)
    if slot is not None:
        slot.take()
    ticket: TrialTicket = params["ticket"]
    payload = {k: v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v
               for k, v in params.items()}
    if not workers_online(pool):
        get_run_logger().warning("no worker of pool %r is online; trial %d waits for one", pool, ticket.number)
    run = run_deployment(name, parameters=payload, timeout=timeout_s, poll_interval=1.0,
                         idempotency_key=f"{parent_run_id}:trial-{ticket.number}:{params['attempt']}")
    state = run.state
    result = _trial_result_name(ticket.number, params["attempt"])
    if state is None or not state.is_final():
        raise StageFailed(sweep_trial.name, site, str(run.id), state.name if state else "unknown",
                          f"no worker of pool {pool!r} finished it within {timeout_s:.0f} s")
    if not state.is_completed():
        failed = StageFailed(sweep_trial.name, site, str(run.id), state.name, state.message or "")
        raise as_exception(stages.find_result(ws, parent_run_id, f"{result}-end", AttemptEnd), failed, ticket.number)
    return stages.load_result(ws, parent_run_id, result, TrialOutcome)


class TrialRunner:
    """Runs trials of one sweep to their end, each under the recovery rules; thread-safe (one call per trial)."""

    def __init__(self, ws: Workspace, job: JobSpec, approved: DatasetVersion, datasets: dict[str, DatasetVersion],
                 run_id: str, storage: str, study: str, mode: Mode, timeout_s: float):
        self.ws, self.job, self.approved, self.datasets = ws, job, approved, datasets
        self.run_id, self.storage, self.study, self.mode, self.timeout_s = run_id, storage, study, mode, timeout_s
        self.placement_spec = trial_placement_spec(job)
        self.sites = ws.load_sites()
        self.lock = threading.Lock()
        # The hours each trial is placed with: learnt from the trials that ended, earlier sweeps' (one MLflow
        # search, here) and this one's (in memory, as they end), else the job's own runs.
        self.durations = TrialDurations(job.resources.max_hours, stages.estimate_run_hours(ws, self.placement_spec),
                                        stages.past_run_hours(ws, trial_job(job.name)))

    def data_at(self, site: str) -> DatasetVersion:
        with self.lock:  # one sync per site, however many trials go there
            if site not in self.datasets:
                synced = run_stage(sync_data, stages.SyncResult, site=self.job.dataset.site,
                                   params={"approved": self.approved, "destination": site, "run_id": self.run_id,
                                           "spec": self.job},
                                   ws=self.ws, run_id=self.run_id, mode=self.mode, timeout_s=self.timeout_s,
                                   attempt=len(self.datasets) + 1)
                self.datasets[site] = synced.dataset
            return self.datasets[site]

    def run(self, ticket: TrialTicket, slot: Slot | None = None) -> TrialRow | None:
        """Run ``ticket`` to its end; None when the sweep stopped before its ``slot`` was free (it did not train).

        The trial gets ready (placed, data synced, subflow run started) before it takes ``slot``;
        its attempts' billed seconds leave out the wait for the slot and start when it was taken.
        """
        log = get_run_logger()
        from hybridtrain.sweeps.trial import run_key

        key = run_key(self.study, ticket.number)
        attempt_no = 0
        classes: dict[str, str] = {}
        began: list[tuple[str, datetime, float]] = []  # (site, start, clock) of each attempt
        taken: dict[int, datetime] = {}  # attempt number -> when it took the slot (it started training then)

        def clock() -> float:  # the trial's own time: the wait for a slot is not its work
            return time.monotonic() - (slot.waited_s if slot is not None else 0.0)

        def attempt(site: str) -> TrialOutcome:
            nonlocal attempt_no
            attempt_no += 1
            began.append((site, datetime.now(UTC), clock()))
            params = {"spec": self.job, "approved": self.data_at(site), "site": site, "parent_run_id": self.run_id,
                      "storage": self.storage, "study": self.study, "ticket": ticket, "attempt": attempt_no}
            if classes.get(site):
                params["capacity_class"] = classes[site]  # spot or on-demand instances, as placed
            held = slot is None or slot.held
            try:
                return dispatch_trial(self.ws, params, site, self.mode, self.timeout_s, self.run_id, slot)
            finally:
                if not held and slot is not None and slot.taken_at is not None:
                    taken[attempt_no] = slot.taken_at
                if slot is not None and slot.turn is not None:
                    slot.requeue()  # ended before it trained: the trials ready behind it go first

        def replace(exclude: dict[str, str]) -> Placed:
            outcome = place(self.ws, self.placement_spec, self.approved.size, self.run_id, unavailable=exclude,
                            run_hours=self.durations.run_hours(), artifact=False)
            classes[outcome.site] = outcome.capacity_class
            return Placed(outcome.site, outcome.capacity_class, "; ".join(outcome.reasons))

        def move(source: str, destination: str) -> None:
            self.data_at(destination)
            record = move_checkpoint(self.ws, self.job, key, source, destination)
            if record is not None:
                log.info("trial %d: checkpoint moved %s -> %s (%d bytes)", ticket.number, source, destination,
                         record.bytes)

        def on_attempt(a: Attempt) -> None:
            if a.outcome is not Outcome.succeeded:
                log.warning("trial %d attempt %d at %s ended %s after %.1f s: %s", ticket.number, a.number, a.site,
                            a.outcome.value, a.seconds, a.detail)
            stages.audit(self.ws).append(
                actor=self.ws.actor, action="training_attempt", subject=f"job {self.job.name} trial {ticket.number}",
                inputs={"mlflow_run_id": self.run_id, "run_key": key, "attempt": a.number, "site": a.site,
                        "step": a.step, "seconds": round(a.seconds, 3)},
                outcome=a.outcome.value + (f": {a.detail[:200]}" if a.detail else ""))

        supervisor = Supervisor(job=f"{self.job.name}-trial-{ticket.number}", policy=self.job.recovery,
                                attempt=attempt, place=replace,
                                health=lambda: check_sites(self.ws, sweep_trial.name, self.mode),
                                move=move, on_attempt=on_attempt, on_wait=log.warning, clock=clock)
        first = replace({})
        decoded = SearchSpace(self.job.sweep.parameters).decode(ticket.params)
        try:
            out, where = supervisor.run(first)
        except SweepStopping as exc:
            log.info("%s", exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a failed trial is recorded (row, study, log) and the sweep goes on
            log.warning("trial %d failed: %s", ticket.number, exc)
            attempts = self._attempts(supervisor.attempts, taken)
            if len(supervisor.attempts) < len(began):  # the last attempt ended in an error recovery does not retry
                site, at, t0 = began[-1]
                attempts.append(AttemptRecord(site=site, capacity_class=classes.get(site, first.capacity_class),
                                              gpus=self.job.resources.gpus, seconds=clock() - t0,
                                              outcome=AttemptOutcome.failed, started_at=taken.get(len(began), at)))
            last = supervisor.attempts[-1] if supervisor.attempts else None
            return TrialRow(trial=ticket.number, params=decoded, value=None, state="failed",
                            site=last.site if last else first.site,
                            capacity_class=last.capacity_class if last else first.capacity_class,
                            cost_usd=attempt_cost(self.sites, attempts, self.job.name),
                            seconds=sum(a.seconds for a in attempts), attempts=attempts, message=str(exc)[:500])
        attempts = self._attempts(supervisor.attempts, taken)
        self.durations.observe(out.seconds / 3600)
        return TrialRow(trial=ticket.number, params=decoded, value=out.value, state=out.state, site=where.site,
                        capacity_class=where.capacity_class, cost_usd=attempt_cost(self.sites, attempts, self.job.name),
                        epochs=out.epochs, seconds=sum(a.seconds for a in supervisor.attempts),
                        train_seconds=out.seconds, attempts=attempts, message=out.message)

    def _attempts(self, attempts: list[Attempt], taken: dict[int, datetime]) -> list[AttemptRecord]:
        outcome = {Outcome.succeeded: AttemptOutcome.succeeded, Outcome.preempted: AttemptOutcome.preempted}
        return [AttemptRecord(site=a.site, capacity_class=a.capacity_class, gpus=self.job.resources.gpus,
                              seconds=a.seconds, outcome=outcome.get(a.outcome, AttemptOutcome.failed),
                              started_at=taken.get(a.number, a.started_at)) for a in attempts]


@flow(name="hyperparameter-sweep", log_prints=True)
def sweep(
    spec_path: str = "jobs/churn-sweep.yaml",
    spec: JobSpec | None = None,
    workspace: str | None = None,
    storage: str | None = None,
    dispatch: Mode = "auto",
    promote_best: bool = True,
) -> SweepSummary:
    """Run the hyperparameter sweep of one job spec (its ``sweep:`` section).

    spec_path: job spec file with a sweep section, relative to the workspace (ignored when ``spec`` is given).
    spec: the job spec itself (typed form in the Prefect UI).
    workspace: workspace root; default HYBRIDTRAIN_HOME or the worker's working directory.
    storage: Optuna storage URL; default HYBRIDTRAIN_SWEEP_STORAGE, else SQLite under .hybridtrain/sweeps/. Opened
        first: one that cannot be opened is refused before the data is prepared or an MLflow run opened.
    dispatch: auto (trial deployments when they exist), inline (all in this process) or pools.
    promote_best: send the best trial through evaluation and the promotion gates.
    """
    started = time.perf_counter()
    log = get_run_logger()
    ws = run_workspace(workspace)
    job = validate_spec(ws, spec_path, spec, dispatch)
    if job.sweep is None:
        raise SpecError(spec_path, [Problem("sweep", "this job spec has no sweep section: add one (see README, "
                                                     "'Hyperparameter sweeps'), or run it with `hybridtrain run`")])
    sw = job.sweep
    study_name = sw.study_name or f"{job.name}-sweep"
    url = storage_url(ws, storage)
    open_storage(url, storage_field(storage, "storage"))  # a bad URL is refused before data or MLflow are touched
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    run_id = open_run(ws, job, flow_run_id)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    registry.set_tags(run_id, {"hybridtrain.sweep": study_name, "mlflow.runName": f"{job.name}-sweep"})
    limit_s = job.resources.max_hours * 3600 + QUEUE_ALLOWANCE_S
    study = None
    try:
        prepared = run_stage(prepare_data, Prepared, site=job.dataset.site, params={"spec": job, "run_id": run_id},
                             ws=ws, run_id=run_id, mode=dispatch, timeout_s=limit_s)
        prep, anon = prepared.prep, prepared.anon
        data_site = job.dataset.site
        datasets = {data_site: anon.approved}
        study = open_study(url, study_name, sw)
        results = SweepResults(study=study_name, metric=sw.objective.metric, direction=sw.objective.resolved_direction)
        runner = TrialRunner(ws, job, anon.approved, datasets, run_id, url, study_name, dispatch, limit_s)
        done_before = study.ended()  # an interrupted trial (its sweep process died) is not done: its retry runs
        remaining = max(0, sw.n_trials - done_before)
        interrupted = study.counts().get("interrupted", 0)
        log.info("sweep %s: %d trials to run (%d ended before%s), %d at a time, storage %s", study_name, remaining,
                 done_before, f"; {interrupted} interrupted, run again with their values" if interrupted else "",
                 sw.parallelism, url.split("@")[-1])
        failed = 0
        slots = SweepSlots(sw.parallelism)
        ahead = sw.parallelism  # trials kept ready (asked, placed, subflow run started) beside the training ones
        trials_started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=sw.parallelism + ahead, thread_name_prefix="trial") as pool:
            running: dict[Future, TrialTicket] = {}
            asked = 0
            stop = False

            def one(ticket: TrialTicket, slot: Slot) -> TrialRow | None:
                try:
                    return runner.run(ticket, slot)
                finally:
                    slot.give_back()  # before the parent hears of the end: a ready trial takes it at once

            def submit() -> None:
                nonlocal asked
                ticket = study.ask()
                asked += 1
                if ticket.retry_of is not None:
                    log.info("trial %d runs trial %d again with its values: its sweep process died", ticket.number,
                             ticket.retry_of)
                slot = slots.slot(ticket.number)  # in line for a slot: the earliest asked of the ready trials goes first
                ctx = contextvars.copy_context()  # the trial's subflow runs under this flow run
                running[pool.submit(ctx.run, one, ticket, slot)] = ticket

            while asked < min(sw.parallelism, remaining):
                submit()
            # The trials kept ready are asked once the first ones train: starting all at once, their runs' API
            # work would contend with the first ones' on the Prefect server (503s on a busy SQLite one).
            slots.wait_all_taken(timeout_s=READY_WAIT_S)
            while asked < min(sw.parallelism + ahead, remaining):
                submit()
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                ended = []
                # The next trial is asked first (tell, then ask: the sampler sees the result) and gets ready while
                # the slots train; the table artifact and the log, API calls that can take seconds on a busy
                # server, come after.
                for fut in finished:
                    ticket = running.pop(fut)
                    row = fut.result()
                    if row is None:  # ready, but the sweep stopped before a slot was free: it did not train
                        study.tell(ticket, "failed")
                        continue
                    study.tell(ticket, row.state, row.value)
                    results.add(row)
                    failed += row.state == "failed"
                    ended.append(row)
                    if not stop and sw.max_failed_trials is not None and failed > sw.max_failed_trials:
                        stop = True
                        slots.stop(f"{failed} trials failed, more than sweep.max_failed_trials "
                                   f"({sw.max_failed_trials})")
                    if asked < remaining and not stop:
                        submit()
                for row in ended:
                    log.info("trial %d %s: %s=%s at %s (%s), $%.4f", row.trial, row.state, sw.objective.metric,
                             "-" if row.value is None else f"{row.value:.4f}", row.site, row.capacity_class,
                             row.cost_usd)
                create_table_artifact(results.table(), key=f"sweep-{job.name}",
                                      description=f"Sweep {study_name}: every trial that ended so far")
        trials_seconds = time.perf_counter() - trials_started
        registry.log_dict(run_id, [r.model_dump(mode="json") for r in results.rows], "sweep/trials.json")
        plots = publish_plots(ws, run_id, url, study_name, sw)
        best = results.best()
        summary_fields: dict[str, Any] = {"promoted": None, "model_version": None, "gates": {}, "reasons": []}
        if best is None or not promote_best:
            # No version will carry the trials' cost: the sweep's run records it, as an unversioned ledger line.
            record = results.run_record(job.registry.model_name, run_id, job.name)
            registry.log_text(run_id, record.model_dump_json(indent=2), RUN_RECORD_ARTIFACT)
            registry.set_tags(run_id, {RUN_RECORD_TAG: job.registry.model_name})
        if best is None:
            summary_fields["reasons"] = ["no trial completed: nothing to evaluate or promote"]
            registry.end_run(run_id, "FAILED")
        else:
            registry.set_tags(run_id, {"hybridtrain.sweep.best_trial": best.trial,
                                       "hybridtrain.sweep.best_value": f"{best.value:.6f}"})
            registry.log_params(run_id, {f"sweep.best.{k}": v for k, v in best.params.items()})
            winner = stages.load_result(ws, run_id, _trial_result_name(best.trial, len(best.attempts)), TrialOutcome)
            trained = winner.trained.model_copy(update={"attempts": results.ledger_attempts(best.trial)})
            best_spec = job.model_copy(update={"model": SearchSpace(sw.parameters).apply(job.model, best.params), "sweep": None})
            if promote_best:
                approved = runner.data_at(best.site)
                evaluated = evaluate_best(ws, best_spec, approved, best.site, trained.model_uri)
                synced = stages.SyncResult(dataset=approved, transfer=None, site=best.site, seconds=0.0)
                record_data(ws, job, run_id, prep, anon, synced)
                lineage = stages.build_lineage(ws, best_spec, prep, anon, synced, best.site, started, flow_run_id)
                actor = f"prefect flow run {flow_run_id}" if flow_run_id else "hybridtrain"
                promoted = promote(ws, best_spec, run_id, trained, best.capacity_class, lineage, evaluated,
                                   list(trained.transfers), actor, None)
                close_run(ws, run_id, lineage, evaluated, promoted, list(trained.transfers))
                summary_fields = {"promoted": promoted.promoted, "model_version": promoted.version,
                                  "gates": promoted.gates, "reasons": promoted.reasons}
            else:
                registry.end_run(run_id, "FINISHED")
    except BaseException:
        if study is not None:
            for number in study.release():  # asked, never told: failed and queued again for the next sweep
                log.warning("trial %d interrupted: it runs again with its values when the sweep is run again", number)
        registry.end_run(run_id, "FAILED")
        raise
    links = {f"MLflow run {run_id} (plots under sweep/)": registry.client.get_run(run_id).info.artifact_uri}
    links.update({p.rsplit("/", 1)[-1]: p for p in plots})
    create_markdown_artifact(results.to_markdown(links), key=f"sweep-{job.name}-summary",
                             description=f"Sweep {study_name}: best trial, cost, plots")
    return SweepSummary(job=job.name, study=study_name, storage=url.split("@")[-1], mlflow_run_id=run_id,
                        trials=sorted(results.rows, key=lambda r: r.trial),
                        best_trial=best.trial if best else None, best_value=best.value if best else None,
                        best_params=best.params if best else None, cost_usd=results.cost_usd,
                        trial_epochs=results.epochs, plots=plots, seconds=time.perf_counter() - started,
                        trials_seconds=trials_seconds,
                        **summary_fields)
