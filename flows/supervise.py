"""Training under supervision: dispatch the train stage, and recover from preemptions, lost sites and failures.

The rules are ``hybridtrain.training.recovery``'s (Prefect-free); this module gives them Prefect's hands:
the train stage goes to the placed site's pool (``run_stage``), placement is asked again with
live queues and site health (``tasks.placement.place``, ``tasks.health.check_sites``), the
checkpoint and the approved data follow the run to its new site (``move_checkpoint``,
``sync_data`` — the sync checks tier and policy again), and every attempt is logged, audited
and kept for the cost ledger. A run waiting for a healthy allowed site says so in its log, in a
``waiting-<job>`` markdown artifact and in the MLflow tag ``hybridtrain.waiting``.
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel

from flows.burst import pass_at_once
from flows.data import sync_data
from flows.training import AttemptEnd, Trained, train_stage
from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.errors import Preempted, SiteUnavailable, StageFailed, TransientError
from hybridtrain.governance.ledger import AttemptOutcome, AttemptRecord
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training.recovery import Attempt, Outcome, Placed, Supervisor
from hybridtrain.workspace import Workspace
from orchestration.dispatch import Mode, run_stage
from orchestration.queues import decision_tags
from tasks.health import check_sites
from tasks.placement import place
from tasks.training import move_checkpoint


class Supervised(BaseModel):
    """The training's result with how it got there."""

    out: Trained
    placement: stages.PlacementOutcome
    attempts: list[Attempt]
    transfers: list[TransferRecord]


def as_exception(end: AttemptEnd | None, failed: StageFailed, job: str) -> Exception:
    """The exception a train stage that ran in a pool ended with, rebuilt from what it saved.

    No record: the stage's process died (crashed, killed, lost) before it could say — a failure
    worth a retry from the newest checkpoint.
    """
    if end is None:
        return TransientError(f"{failed} (no report from the stage: its process crashed or was lost)")
    if end.kind == "preempted":
        return Preempted(job, end.step or 0, end.checkpoint, site=end.site)
    if end.kind == "site-lost":
        return SiteUnavailable(end.site, end.message)
    if end.kind == "failed":
        return TransientError(end.message)
    return failed


def train_with_recovery(ws: Workspace, job: JobSpec, approved: DatasetVersion, synced: stages.SyncResult,
                        decision: stages.PlacementOutcome, run_id: str, run_key: str, mode: Mode,
                        timeout_s: float) -> Supervised:
    log = get_run_logger()
    data_site = job.dataset.site
    datasets = {data_site: approved, synced.site: synced.dataset}
    placements = {decision.site: decision}
    transfers: list[TransferRecord] = []
    attempt_no = 0

    def attempt(site: str) -> Trained:
        nonlocal attempt_no
        attempt_no += 1
        params = {"spec": job, "approved": datasets[site], "site": site, "run_id": run_id, "run_key": run_key,
                  "attempt": attempt_no}
        placed = placements.get(site)
        if placed is not None:
            params["capacity_class"] = placed.capacity_class  # spot or on-demand instances, as placed
        # The run carries its placement (planned hours, work queue, due time) for the controller and queue snapshots,
        # waits in its tier's work queue of the pool, and an urgent one gets a controller pass as soon as it is
        # queued, as in the simulator.
        tags = decision_tags(placed.run_hours, placed.queue_tier, placed.due_at) if placed is not None else None
        urgent = placed is not None and placed.controller_pass
        try:
            return run_stage(train_stage, Trained, site=site, params=params, ws=ws, run_id=run_id, mode=mode,
                             timeout_s=timeout_s, attempt=attempt_no, tags=tags,
                             queue_tier=placed.queue_tier if placed is not None else None,
                             after_queued=(lambda _run: pass_at_once(str(ws.root))) if urgent else None)
        except StageFailed as exc:
            end = stages.find_result(ws, run_id, f"train-attempt-{attempt_no}", AttemptEnd)
            raise as_exception(end, exc, job.name) from exc

    def replace(exclude: dict[str, str]) -> Placed:
        outcome = place(ws, job, approved.size, run_id, unavailable=exclude)
        placements[outcome.site] = outcome
        return Placed(outcome.site, outcome.capacity_class, "; ".join(outcome.reasons))

    def health() -> dict[str, str]:
        return check_sites(ws, train_stage.name, mode)

    def move(source: str, destination: str) -> None:
        if destination not in datasets:
            moved = run_stage(sync_data, stages.SyncResult, site=data_site,
                              params={"approved": approved, "destination": destination, "run_id": run_id,
                                      "spec": job},
                              ws=ws, run_id=run_id, mode=mode, timeout_s=timeout_s, attempt=attempt_no + 1)
            datasets[destination] = moved.dataset
            if moved.transfer is not None:
                transfers.append(moved.transfer)
        try:
            record = move_checkpoint(ws, job, run_key, source, destination)
        except SiteUnavailable as exc:
            log.warning("the checkpoint of run %s cannot be read at %s (%s): training resumes at %s from the newest "
                        "checkpoint there, or from the start", run_key, source, exc.reason, destination)
            return
        if record is not None:
            transfers.append(record)
            log.info("checkpoint moved %s -> %s: %s (%d bytes)", source, destination, record.what, record.bytes)

    def on_attempt(a: Attempt) -> None:
        if a.outcome is not Outcome.succeeded:
            log.warning("training attempt %d at %s ended %s after %.1f s: %s", a.number, a.site, a.outcome.value,
                        a.seconds, a.detail)
        stages.audit(ws).append(actor=ws.actor, action="training_attempt", subject=f"job {job.name}",
                                inputs={"mlflow_run_id": run_id, "run_key": run_key, "attempt": a.number,
                                        "site": a.site, "step": a.step, "seconds": round(a.seconds, 3)},
                                outcome=a.outcome.value + (f": {a.detail[:200]}" if a.detail else ""))

    def on_wait(reason: str) -> None:
        log.warning(reason)
        create_markdown_artifact(f"# Waiting for a site\n\n{reason}\n", key=f"waiting-{job.name}",
                                 description=f"Why {job.name} is waiting")
        Registry(ws.tracking_uri, ws.mlflow_artifacts).set_tags(run_id, {"hybridtrain.waiting": reason[:4000]})

    # A resubmitted run (same run_key) may have checkpointed elsewhere: bring the newest one here.
    found = stages.checkpoint_sites(ws, job, run_key)
    newest = max(found, key=found.get) if found else None
    if newest is not None and found[newest] > found.get(decision.site, -1):
        log.info("run %s last checkpointed at %s (step %d); moving it to %s", run_key, newest, found[newest],
                 decision.site)
        move(newest, decision.site)

    supervisor = Supervisor(job=job.name, policy=job.recovery, attempt=attempt, place=replace, health=health,
                            move=move, on_attempt=on_attempt, on_wait=on_wait)
    out, where = supervisor.run(Placed(decision.site, decision.capacity_class))
    if len(supervisor.attempts) > 1:
        Registry(ws.tracking_uri, ws.mlflow_artifacts).set_tags(run_id, {"hybridtrain.waiting": ""})
        create_table_artifact([{**a.model_dump(mode="json"), "detail": a.detail[:200]} for a in supervisor.attempts],
                              key=f"attempts-{job.name}", description="Training attempts: preempted, lost, failed")
    wasted = [AttemptRecord(site=a.site, capacity_class=a.capacity_class, gpus=job.resources.gpus, seconds=a.seconds,
                            outcome=AttemptOutcome.preempted if a.outcome is Outcome.preempted else AttemptOutcome.failed,
                            started_at=a.started_at)
              for a in supervisor.attempts if a.outcome is not Outcome.succeeded]
    trained = out.trained.model_copy(update={"attempts": [*out.trained.attempts, *wasted]})
    return Supervised(out=out.model_copy(update={"trained": trained}), placement=placements[where.site],
                      attempts=supervisor.attempts, transfers=transfers)

