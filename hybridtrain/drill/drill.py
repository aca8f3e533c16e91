"""Drill: a failover drill — faults injected into a real training run, and how long and how much it took to recover.

``run_drill(ws, scenarios)`` trains a small deterministic job (``drill_spec``, ``drill_frame``)
with the production code, breaks it the way production breaks, recovers it with the production
recovery path, and measures every scenario:

- **RTO** (``rto_s``, seconds): from the moment the drill injects the fault (the signal sent,
  the S3 server or sshd stopped) to the end of the first optimizer step completed by the
  resumed run. It covers what the recovery path itself does: the grace checkpoint, the store's
  retries giving up, ``ssh_train``'s reconnect window, health checks, placement, copying the
  checkpoint to another site, starting a new training process (interpreter, imports, data
  fetched by its DVC pointer, checkpoint verified and loaded) and that one step. It does not
  include the orchestrator's own delays (Prefect noticing a crashed flow run, a retry's delay,
  a worker picking the run up): the drill starts the recovery as soon as the failure is known.
- **RPO** (``rpo_steps``): lost work = the last optimizer step the interrupted run completed
  before it stopped − the step the resumed run restarted from (``resumed_from_step``). A
  preempted run finishes the step in progress and checkpoints it, so its RPO is 0. ``rpo_s``
  is the same in seconds of training: ``rpo_steps`` × the interrupted run's mean step time.

Scenarios (``SCENARIOS``; ``--scenario NAME``):

- ``kill-9`` — the training process is SIGKILLed half an interval past a checkpoint; a new
  process resumes from the newest valid checkpoint (RPO < the checkpoint interval).
- ``preempt`` — SIGTERM: the process checkpoints within its grace, writes ``preempted.json``
  and exits 75; ``stages.move_checkpoint`` copies the checkpoint to another site of the
  catalog, where a new process resumes (RPO 0).
- ``corrupt-checkpoint`` — the process is SIGKILLed and bytes of its newest checkpoint are
  flipped; the resume skips it (SHA-256 mismatch) and uses the previous one (one interval more).
- ``s3-down`` — the site's S3 server (moto, on loopback, started by the drill) is stopped right
  before the manifest of a checkpoint is uploaded; the store's retries give up, the data
  object without its manifest stays invisible, and the retried stage resumes from the previous
  checkpoint once the server is back (RPO one interval).
- ``ssh-down`` — the on-prem site's sshd (a throwaway OpenSSH on loopback) is stopped while its
  job trains under torchrun over SSH (``ssh_train``); the job dies with its host. Site health
  (``check_site``) marks the site unhealthy, ``Placement.decide(unavailable=...)`` picks the
  next allowed site, the checkpoint is moved there and training resumes.

The training processes are ``python -m hybridtrain.drill.worker`` — the production host job
(``host_training.run``) plus a step beacon that lets the drill see how far a process got. The
local scenarios use the workspace's sites catalog (their stores, their DVC remotes); ``s3-down``
and ``ssh-down`` bring their own servers and sites. Training is pinned to the CPU
(``CUDA_VISIBLE_DEVICES=""``) so every resumed run can be compared weight for weight with one
uninterrupted reference run (``torch.equal``): resuming is exact on the CPU.

The report (``DrillReport``) is written as ``report.md`` and ``report.json`` under
``.hybridtrain/drills/<timestamp>/`` (each file atomically), with each training process's log,
and recorded in MLflow: experiment ``hybridtrain-drills``, one run with metrics
``<scenario>.rto_s``, ``<scenario>.rpo_steps`` and ``<scenario>.rpo_s`` and the report files as
artifacts. The drill's checkpoints are deleted from the sites' stores afterwards.

Example (300 steps, a checkpoint every 25, a busy 2-core machine): ``kill-9`` kills the process at
step 112; a new process starts, fetches the data, resumes from step 100 and completes step 101
7.3 s after the kill: RTO 7.3 s, RPO 12 steps (0.04 s of training). ``preempt`` stops at step
113 with its checkpoint stored 0.01 s after SIGTERM and resumes at the other site: RPO 0.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.plugins import PluginRegistry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    import pandas as pd

    from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo
    from hybridtrain.specs.job import JobSpec
    from hybridtrain.specs.sites import Site, SitesCatalog, SshHost
    from hybridtrain.training.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

EXPERIMENT = "hybridtrain-drills"
JOB = "failover-drill"
LABEL = "churned"
DEFAULT_STEPS = 300
EPOCHS = 2
BATCH_SIZE = 512
VAL_ROWS = 500
#: Bound on every wait of the drill for a process, a file or a server.
WAIT_S = 120.0
#: How often the drill looks at a beacon or a store while it waits.
POLL_S = 0.001
#: SSH timeouts of the ssh-down drill. Production's reconnect window is 60 s (``ssh_site.Timeouts``);
#: the drill waits 5 s, so production's RTO for a lost host is about 55 s longer than measured here.
DRILL_SSH_TIMEOUTS = {"connect": 3.0, "command": 20.0, "reconnect": 5.0}

Outcome = Literal["ok", "failed", "skipped"]
DEFINITIONS = {
    "rto_s": "seconds from the injection of the fault to the end of the first optimizer step completed by the "
             "resumed run (grace checkpoint, retries, health checks, placement, checkpoint copy, process start, "
             "data fetch and checkpoint load included; the orchestrator's own detection and scheduling delays "
             "are not)",
    "rpo_steps": "optimizer steps lost: the last step the interrupted run completed before it stopped minus the "
                 "step the resumed run restarted from",
    "rpo_s": "rpo_steps times the interrupted run's mean seconds per step",
}


# -- the report --------------------------------------------------------------------------------


class Event(BaseModel):
    """One moment of a scenario, in seconds after the fault (negative: before it)."""

    at_s: float
    what: str


class ScenarioResult(BaseModel):
    """What one scenario did and measured."""

    scenario: str
    outcome: Outcome
    rto_s: float | None = Field(None, description=DEFINITIONS["rto_s"])
    rpo_steps: int | None = Field(None, description=DEFINITIONS["rpo_steps"])
    rpo_s: float | None = Field(None, description=DEFINITIONS["rpo_s"])
    rpo_estimated: bool = Field(False, description="True when the last step before the fault could not be "
                                                   "observed and was estimated from the elapsed time.")
    last_step: int | None = Field(None, description="Last optimizer step the interrupted run completed.")
    resumed_from_step: int | None = None
    checkpoint_interval: int
    site: str | None = Field(None, description="Where the run was interrupted.")
    resumed_site: str | None = Field(None, description="Where it resumed.")
    weights_match_reference: bool | None = Field(
        None, description="Final weights equal (torch.equal) to the uninterrupted reference run's.")
    notes: list[str] = Field(default_factory=list)
    timeline: list[Event] = Field(default_factory=list)
    seconds: float = Field(0.0, description="Wall time the scenario took.")


class DrillReport(BaseModel):
    """A drill: its settings, one result per scenario, where it is stored."""

    started_at: datetime
    finished_at: datetime | None = None
    workspace: str
    steps: int = Field(description="Optimizer steps of a whole run.")
    checkpoint_interval: int
    fault_step: int = Field(description="The step at which the drill strikes (processes it can watch).")
    device: str = "cpu"
    reference_seconds: float | None = None
    seconds_per_step: float | None = Field(None, description="Of the uninterrupted reference run.")
    definitions: dict[str, str] = Field(default_factory=lambda: dict(DEFINITIONS))
    scenarios: list[ScenarioResult] = Field(default_factory=list)
    directory: str | None = None
    mlflow_run_id: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def failed(self) -> list[ScenarioResult]:
        return [s for s in self.scenarios if s.outcome == "failed"]

    def to_markdown(self) -> str:
        def num(v: float | int | None, fmt: str) -> str:
            return "" if v is None else format(v, fmt)

        lines = [
            f"# Failover drill {self.started_at.strftime('%Y-%m-%d %H:%M:%S')} UTC",
            "",
            f"Workspace `{self.workspace}`; {self.steps} steps per run ({EPOCHS} epochs), a checkpoint every "
            f"{self.checkpoint_interval} steps, faults at step {self.fault_step}; training on the {self.device}"
            + (f"; uninterrupted reference run {self.reference_seconds:.1f} s "
               f"({(self.seconds_per_step or 0) * 1000:.1f} ms/step)" if self.reference_seconds is not None else "")
            + ".",
            "",
            "| scenario | outcome | RTO s | RPO steps | RPO s | resumed from step | weights = reference | notes |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for s in self.scenarios:
            match = {True: "yes", False: "NO", None: ""}[s.weights_match_reference]
            rpo = num(s.rpo_steps, "d") + (" (est.)" if s.rpo_estimated and s.rpo_steps is not None else "")
            notes = "; ".join(s.notes).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {s.scenario} | {s.outcome} | {num(s.rto_s, '.2f')} | {rpo} | {num(s.rpo_s, '.3f')} | "
                         f"{num(s.resumed_from_step, 'd')} | {match} | {notes} |")
        lines += ["", "## Definitions", ""]
        lines += [f"- **{k}**: {v}." for k, v in self.definitions.items()]
        for s in self.scenarios:
            if not s.timeline:
                continue
            lines += ["", f"## {s.scenario}: timeline (seconds after the fault)", ""]
            lines += [f"- {e.at_s:+.3f} s — {e.what}" for e in s.timeline]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        if self.mlflow_run_id:
            lines += ["", f"MLflow: experiment `{EXPERIMENT}`, run `{self.mlflow_run_id}`."]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``report.md`` and ``report.json`` into ``directory``, each atomically (temp file + rename)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = str(directory)
        md = _write_atomic(directory / "report.md", self.to_markdown())
        js = _write_atomic(directory / "report.json", self.model_dump_json(indent=1))
        return md, js

    @classmethod
    def read(cls, directory: Path | str) -> DrillReport:
        return cls.model_validate_json((Path(directory) / "report.json").read_text())


def _write_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


# -- scenarios: the registry -------------------------------------------------------------------


class DrillFailed(Exception):
    """A scenario's recovery did not go as it must (the message says what happened instead)."""


class RecoveryFailed(HybridtrainError):
    """A failover drill found a recovery path that does not work: fix it before a real failure needs it."""

    exit_code = 1

    def __init__(self, report: DrillReport):
        self.report = report
        failed = "; ".join(f"{s.scenario}: {s.notes[0] if s.notes else 'failed'}" for s in report.failed)
        super().__init__(f"failover drill: {len(report.failed)} scenario(s) failed ({failed}); the report is in "
                         f"{report.directory}")


class Skipped(Exception):
    """A scenario cannot run here (the message says why and how to make it possible)."""


class _Timeline:
    """Events of one scenario, timed against its fault (set with ``fault()``)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []
        self.fault_at: float | None = None

    def add(self, what: str, at: float | None = None) -> float:
        t = time.time() if at is None else at
        self.events.append((t, what))
        return t

    def fault(self, what: str, at: float | None = None) -> float:
        self.fault_at = self.add(what, at)
        return self.fault_at

    def since_fault(self, t: float) -> float:
        assert self.fault_at is not None, "no fault injected yet"
        return t - self.fault_at

    def to_events(self) -> list[Event]:
        zero = self.fault_at if self.fault_at is not None else (self.events[0][0] if self.events else 0.0)
        return [Event(at_s=round(t - zero, 4), what=w) for t, w in sorted(self.events)]


Scenario = Callable[["DrillEnv", ScenarioResult, _Timeline], None]
SCENARIOS: PluginRegistry[Scenario] = PluginRegistry("drill scenario")


def scenario_names() -> list[str]:
    return SCENARIOS.names


def check_scenarios(names: Sequence[str] | None) -> list[str]:
    """The scenarios to run, in the order given (None or empty: all); ``SpecError`` naming the valid ones."""
    if not names:
        return scenario_names()
    problems = [Problem("--scenario", SCENARIOS.unknown_message(n)) for n in names if n not in SCENARIOS]
    if problems:
        raise SpecError("hybridtrain drill", problems)
    return list(dict.fromkeys(names))


# -- the drill's job and data --------------------------------------------------------------------


def drill_spec(steps: int, interval: int, data_site: str) -> JobSpec:
    """The drill's job: a small MLP on ``drill_frame``; ``steps`` per run in ``EPOCHS`` epochs of ``BATCH_SIZE`` rows."""
    from hybridtrain.validation import parse_job

    return parse_job({
        "apiVersion": "hybridtrain/v1",
        "metadata": {"name": JOB, "description": "Failover drill (hybridtrain drill): synthetic data, no PII."},
        "dataset": {"path": "data/raw/failover-drill.csv", "md5": "0" * 32, "site": data_site},
        "schema": {"label": LABEL, "entity_key": "account_id",
                   "columns": {"account_id": "string", "tenure": "float", "charges": "float",
                               "contract": "category", LABEL: "int"}},
        "model": {"features": {"numeric": ["tenure", "charges"], "categorical": ["contract"]},
                  "hidden_layers": [128, 64], "dropout": 0.0, "epochs": EPOCHS, "batch_size": BATCH_SIZE,
                  "learning_rate": 0.01, "seed": 5, "threads": 1},
        "checkpoint": {"interval_steps": interval, "keep_last": 3, "preemption_grace_s": 30},
        "resources": {"cpus": 1, "max_hours": 0.5},
        "registry": {"model_name": JOB},
    }, source="drill job spec")


def drill_frame(train_rows: int, val_rows: int = VAL_ROWS, seed: int = 11) -> pd.DataFrame:
    """Deterministic churn-like rows a small model can learn, with ``split`` and ``partition`` columns."""
    import numpy as np
    import pandas as pd

    n = train_rows + val_rows
    rng = np.random.default_rng(seed)
    tenure = rng.integers(1, 72, n).astype(float)
    charges = rng.normal(70, 20, n)
    contract = rng.choice(["monthly", "annual", "two_year"], n, p=[0.5, 0.3, 0.2])
    logit = -0.08 * (tenure - 36) + 0.05 * (charges - 70) + np.where(contract == "monthly", 2.0, -1.5)
    return pd.DataFrame({
        "account_id": [f"d{i:07d}" for i in range(n)],
        "tenure": tenure, "charges": charges, "contract": contract,
        LABEL: (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int),
        "split": ["train"] * train_rows + ["val"] * val_rows,
        "partition": np.arange(n) % 2,
    })


def plan_steps(steps: int, interval: int | None) -> tuple[int, int, int, int]:
    """(steps per epoch, total steps, checkpoint interval, fault step) for ``--steps``/``--interval``.

    The fault strikes half an interval past the first checkpoint at or after a third of the run
    (and after at least two checkpoints, so ``corrupt-checkpoint`` has a previous one), leaving
    at least one more interval before the end.
    """
    if steps < 40:
        raise SpecError("hybridtrain drill", [Problem("--steps", f"{steps} is too few; give at least 40 "
                                                                 f"(default {DEFAULT_STEPS})")])
    per_epoch = math.ceil(steps / EPOCHS)
    total = per_epoch * EPOCHS
    every = interval if interval is not None else max(2, total // 12)
    if every < 2:
        raise SpecError("hybridtrain drill", [Problem("--interval", f"must be at least 2 steps, got {every}")])
    mid = max(2 * every, math.ceil(total / 3 / every) * every)
    fault = mid + every // 2
    if fault + every > total:
        raise SpecError("hybridtrain drill", [Problem(
            "--interval", f"a checkpoint every {every} steps leaves no room for a fault in a run of {total} "
                          f"steps (fault at {fault}, then one more interval); use --interval {max(2, total // 12)} "
                          f"or more --steps")])
    return per_epoch, total, every, fault


# -- the environment a drill runs in -----------------------------------------------------------


@dataclasses.dataclass
class Reference:
    state: dict[str, Any]
    seconds: float
    seconds_per_step: float


@dataclasses.dataclass
class Launch:
    """One drill worker process: the job bundle it runs, its log, its beacon."""

    name: str
    site: str
    bundle_dir: Path
    log: Path
    proc: subprocess.Popen
    started_at: float

    def beacon(self) -> Any:
        from hybridtrain.drill.worker import BEACON_FILE, Beacon

        return Beacon.read(self.bundle_dir / BEACON_FILE)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DrillFailed(f"process {self.name} still ran after {timeout:g} s and was killed; "
                              f"see {self.log.name}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def result(self) -> Any:
        from hybridtrain.remote.host_training import RESULT_DIR, RESULT_FILE, HostResult

        return HostResult.model_validate_json((self.bundle_dir / RESULT_DIR / RESULT_FILE).read_text())

    def state_dict(self) -> dict[str, Any]:
        import torch

        from hybridtrain.remote.host_training import MODEL_FILE, RESULT_DIR

        return torch.load(self.bundle_dir / RESULT_DIR / MODEL_FILE, map_location="cpu", weights_only=True)[
            "state_dict"]

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class DrillEnv:
    """What every scenario shares: workspace, sites, the job, its data (DVC-tracked), the reference run."""

    def __init__(self, ws: Workspace, scratch: Path, out: Path, stamp: str, steps: int, interval: int | None,
                 say: Callable[[str], None]):
        from hybridtrain.tracking.lineage import code_version

        self.ws = ws
        self.scratch = scratch
        self.out = out
        self.stamp = stamp
        self.say = say
        self.per_epoch, self.steps, self.interval, self.fault_step = plan_steps(steps, interval)
        self.sites: SitesCatalog = ws.load_sites()
        onprem = [s for s in self.sites.sites if s.kind.value == "onprem"]
        self.primary: Site = (onprem or list(self.sites.sites))[0]
        others = [s for s in self.sites.sites
                  if s.name != self.primary.name and s.store_url(ws.root) != self.primary.store_url(ws.root)]
        self.secondary: Site | None = others[0] if others else None
        self.spec = drill_spec(self.per_epoch * EPOCHS, self.interval, self.primary.name)
        self.code_version = code_version(ws.root)
        self.launches: list[Launch] = []
        self.run_keys: list[tuple[Any, str]] = []  # (object store, run key) to clean up
        self.extra_remotes: dict[str, dict[str, str]] = {}
        self.extra_secrets: dict[str, dict[str, str]] = {}
        self.pushed: set[str] = set()
        self._repo: DvcRepo | None = None
        self.approved: DatasetVersion | None = None
        self.reference: Reference | None = None
        self._frames: tuple[pd.DataFrame, pd.DataFrame] | None = None

    # -- data -----------------------------------------------------------------------------------

    def repo(self) -> DvcRepo:
        """The drill's DVC repo (in the scratch directory), with a remote per site it uses."""
        from hybridtrain import stages
        from hybridtrain.datasets.dvc_repo import DvcRepo

        remotes = {**stages.remotes_for(self.ws, self.sites), **self.extra_remotes}
        secrets = {**stages.remote_secrets_for(self.sites), **self.extra_secrets}
        self._repo = DvcRepo.ensure(self.scratch / "repo", remotes, default_remote=self.primary.dvc_remote,
                                    scm=False, secrets=secrets)
        return self._repo

    def prepare(self) -> None:
        """Write the drill's dataset, track it with DVC, push it to the primary site, train the reference."""
        from hybridtrain.datasets import partitioned
        started = time.perf_counter()
        repo = self.repo()
        rel = f"data/approved/{JOB}"
        partitioned.write(drill_frame(self.per_epoch * BATCH_SIZE), repo.root / rel, sort_by="account_id")
        self.approved = repo.add(rel, "approved", self.primary.name)
        self.push_to(self.primary)
        data = repo.root / rel
        self._frames = (partitioned.read(data, ["train"]), partitioned.read(data, ["val"]))
        self.say(f"drill data: {len(self._frames[0]):,} training rows (DVC md5 {self.approved.md5}) at "
                 f"{self.primary.name}, {time.perf_counter() - started:.1f} s")
        self.reference = self._train_reference()
        self.say(f"reference run: {self.steps} steps in {self.reference.seconds:.1f} s "
                 f"({self.reference.seconds_per_step * 1000:.1f} ms/step)")

    def push_to(self, site: Site, *, extra: bool = False) -> None:
        """Put the drill's data into ``site``'s DVC store (what the sync stage does before training there)."""
        if site.name in self.pushed:
            return
        if extra:
            from hybridtrain.specs.sites import DVC_SUBDIR

            self.extra_remotes[site.dvc_remote] = site.dvc_remote_config(self.ws.root, DVC_SUBDIR)
            if secrets := site.dvc_remote_secrets():
                self.extra_secrets[site.dvc_remote] = secrets
            self.repo()
        assert self._repo is not None and self.approved is not None
        self._repo.push(self.approved, remote=site.dvc_remote)
        self.pushed.add(site.name)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        assert self._frames is not None, "prepare() first"
        return self._frames

    def trainer(self, store: CheckpointStore) -> Any:
        from hybridtrain.training.trainer import Trainer

        return Trainer(self.spec.model, self.spec.checkpoint, store, LABEL, device="cpu", threads=1, job=JOB)

    def _train_reference(self) -> Reference:
        from hybridtrain.storage.object_store import LocalObjectStore
        from hybridtrain.training.checkpoint import CheckpointStore

        counter = StepCounter()
        store = CheckpointStore(LocalObjectStore(self.scratch / "reference"), "reference")
        started = time.perf_counter()
        result = self.trainer(store).fit(*self.frames(), should_stop=counter)
        seconds = time.perf_counter() - started
        return Reference(state={k: v.clone() for k, v in result.model.state_dict().items()}, seconds=seconds,
                         seconds_per_step=counter.seconds_per_step or seconds / max(1, result.global_step))

    def matches_reference(self, state: dict[str, Any]) -> bool:
        import torch

        ref = self.reference.state if self.reference is not None else {}
        return state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)

    # -- stores -----------------------------------------------------------------------------------

    def store(self, site: Site, run_key: str, ws: Workspace | None = None) -> CheckpointStore:
        """The run's checkpoints in ``site``'s store (the one the train stage and the host job use)."""
        from hybridtrain import stages
        from hybridtrain.training.checkpoint import CheckpointStore

        objects = stages.checkpoint_store(ws or self.ws, site)
        self.run_keys.append((objects, run_key))
        return CheckpointStore.for_run(objects, JOB, run_key, keep_last=self.spec.checkpoint.keep_last)

    def run_key(self, scenario: str) -> str:
        return f"drill-{self.stamp}-{scenario}"

    def cleanup_checkpoints(self) -> None:
        """Delete the drill's checkpoints from every store it wrote to (they are no one's model)."""
        done: set[tuple[str, str]] = set()
        for objects, run_key in self.run_keys:
            if (objects.url, run_key) in done:
                continue
            done.add((objects.url, run_key))
            try:
                for obj in objects.list(f"checkpoints/{JOB}/{run_key}/"):
                    objects.delete(obj.key)
            except (HybridtrainError, OSError) as exc:  # a store that went away in the drill (s3-down's server)
                log.info("could not delete the drill's checkpoints under %s (%s)", objects.url, exc)

    # -- worker processes ------------------------------------------------------------------------

    def launch(self, site: Site, run_key: str, name: str, ws: Workspace | None = None) -> Launch:
        """Start ``python -m hybridtrain.drill.worker`` on a job bundle for ``site`` (CPU only)."""
        from hybridtrain.remote.job_bundle import JobBundle
        from hybridtrain.remote.remote_training import portable_site

        assert self.approved is not None
        host_dir = self.scratch / "hosts" / site.name
        host_dir.mkdir(parents=True, exist_ok=True)
        bundle = JobBundle(job_id=f"drill-{name}", code_version=self.code_version, spec=self.spec.to_dict(),
                           approved=self.approved, site=portable_site(ws or self.ws, site), workdir=str(host_dir),
                           run_key=run_key)
        bundle_dir = bundle.write(self.scratch / "jobs" / name / "bundle")
        log_path = self.out / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1", "CUDA_VISIBLE_DEVICES": ""}
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "hybridtrain.drill.worker", str(bundle_dir)],
                                    cwd=host_dir, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        launch = Launch(name, site.name, bundle_dir, log_path, proc, time.time())
        self.launches.append(launch)
        return launch

    def run_to_fault(self, site: Site, run_key: str, name: str, tl: _Timeline) -> Launch:
        """Launch a fresh run at ``site`` and return once it has completed ``fault_step`` steps."""
        first = self.launch(site, run_key, name)
        tl.add(f"training process {name} started at {site.name} (pid {first.proc.pid})", first.started_at)

        def reached() -> Any:
            if not first.alive():
                code = first.proc.returncode
                why = (f"the run finished before step {self.fault_step} could be reached by the drill; give more "
                       "--steps" if code == 0 else f"it exited with status {code}:\n{first.tail()}")
                raise DrillFailed(f"process {name} ended before the fault: {why}")
            b = first.beacon()
            return b if b is not None and b.steps >= self.fault_step else None

        beacon = wait_until(reached, f"process {name} to reach step {self.fault_step}")
        tl.add(f"interrupted run: first step completed (pid {first.proc.pid})", beacon.first_step_at)
        tl.add(f"interrupted run: step {beacon.steps} completed", beacon.last_step_at)
        return first

    def resume(self, site: Site, run_key: str, name: str, tl: _Timeline, ws: Workspace | None = None) -> Launch:
        """Launch the resumed run at ``site`` and wait for it to finish (status 0) and its result."""
        second = self.launch(site, run_key, name, ws)
        tl.add(f"resumed process {name} started at {site.name} (pid {second.proc.pid})", second.started_at)
        code = second.wait()
        if code != 0:
            raise DrillFailed(f"the resumed process {name} exited with status {code}:\n{second.tail()}")
        beacon = second.beacon()
        if beacon is None:
            raise DrillFailed(f"the resumed process {name} completed no step")
        tl.add("resumed run: first step completed", beacon.first_step_at)
        tl.add("resumed run finished", beacon.last_step_at)
        return second

    def finish_resumed(self, res: ScenarioResult, tl: _Timeline, resumed: Launch, last_step: int,
                       seconds_per_step: float | None) -> Any:
        """Fill in RTO, RPO, the resume point and the weights check from a finished resumed run."""
        result = resumed.result()
        beacon = resumed.beacon()
        res.resumed_site = resumed.site
        res.resumed_from_step = result.resumed_from_step
        res.last_step = last_step
        res.rto_s = round(tl.since_fault(beacon.first_step_at), 3)
        if result.resumed_from_step is None:
            raise DrillFailed(f"the resumed process {resumed.name} found no checkpoint and started afresh")
        res.rpo_steps = last_step - result.resumed_from_step
        step_s = seconds_per_step or (self.reference.seconds_per_step if self.reference else None)
        res.rpo_s = round(res.rpo_steps * step_s, 4) if step_s else None
        if result.global_step != self.steps:
            raise DrillFailed(f"the resumed run ended at step {result.global_step}, not {self.steps}")
        res.weights_match_reference = self.matches_reference(resumed.state_dict())
        return result

    def stop_all(self) -> None:
        for launch in self.launches:
            launch.kill()


class StepCounter:
    """``should_stop`` for an in-process ``Trainer.fit`` that never stops and counts steps (it is asked once per step)."""

    def __init__(self) -> None:
        self.steps = 0
        self.first_at: float | None = None
        self.last_at: float | None = None

    def __call__(self) -> bool:
        now = time.time()
        self.steps += 1
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        return False

    @property
    def seconds_per_step(self) -> float | None:
        if self.steps < 2 or self.first_at is None or self.last_at is None:
            return None
        return (self.last_at - self.first_at) / (self.steps - 1)


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, every: float = POLL_S) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); ``DrillFailed`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DrillFailed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise DrillFailed(message)


# -- the scenarios -----------------------------------------------------------------------------


@SCENARIOS.register("kill-9")
def kill_9(env: DrillEnv, res: ScenarioResult, tl: _Timeline) -> None:
    """SIGKILL mid-interval; a new process at the same site resumes from the newest valid checkpoint."""
    site = env.primary
    run_key = env.run_key("kill-9")
    store = env.store(site, run_key)
    res.site = site.name
    first = env.run_to_fault(site, run_key, "kill-9", tl)
    tl.fault("SIGKILL sent to the training process")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait()
    tl.add(f"process gone (status {first.proc.returncode})")
    before = first.beacon()
    restored = store.latest_valid()
    _check(restored is not None, "no valid checkpoint was left to resume from")
    newest = restored[1]
    # A checkpoint is written before the beacon counts its step: a kill in between leaves the beacon one behind.
    last = max(before.steps, newest.step)
    res.notes.append(f"killed at step {last}, newest valid checkpoint {newest.step}")
    resumed = env.resume(site, run_key, "kill-9-resume", tl)
    env.finish_resumed(res, tl, resumed, last, before.seconds_per_step)
    _check(res.resumed_from_step == newest.step,
           f"resumed from step {res.resumed_from_step}, not from the newest valid checkpoint {newest.step}")
    _check(0 <= res.rpo_steps <= env.interval,
           f"lost {res.rpo_steps} steps, more than the checkpoint interval ({env.interval})")


@SCENARIOS.register("preempt")
def preempt(env: DrillEnv, res: ScenarioResult, tl: _Timeline) -> None:
    """SIGTERM: checkpoint within the grace, exit 75, checkpoint moved to another site, resumed there."""
    from hybridtrain import stages
    from hybridtrain.errors import EXIT_PREEMPTED
    from hybridtrain.training.preemption import PreemptionReport

    site, other = env.primary, env.secondary
    if other is None:
        raise Skipped(f"the sites catalog {env.ws.sites_file} has one site ({site.name}); a preempted run needs "
                      "another site's store to move to")
    run_key = env.run_key("preempt")
    env.store(site, run_key)
    env.store(other, run_key)
    env.push_to(other)
    res.site = site.name
    first = env.run_to_fault(site, run_key, "preempt", tl)
    grace = env.spec.checkpoint.preemption_grace_s
    tl.fault("SIGTERM sent to the training process (preemption notice)")
    first.proc.send_signal(signal.SIGTERM)
    try:
        code = first.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        first.kill()
        raise DrillFailed(f"the process did not exit within the {grace:g} s grace after SIGTERM") from None
    tl.add(f"process exited with status {code}")
    _check(code == EXIT_PREEMPTED, f"exit status {code} after SIGTERM, expected {EXIT_PREEMPTED}:\n{first.tail()}")
    report = PreemptionReport.read(first.bundle_dir)
    _check(report is not None, "the preempted process left no preempted.json")
    _check(report.within_grace, f"the checkpoint took {report.seconds_after_notice} s, past the {grace:g} s grace")
    res.notes.append(f"checkpoint of step {report.step} stored {report.seconds_after_notice or 0:.2f} s after the "
                     "notice")
    tl.add(f"checkpoint of step {report.step} stored, preempted.json written", report.stopped_at.timestamp())
    before = first.beacon()
    transfer = stages.move_checkpoint(env.ws, env.spec, run_key, site.name, other.name)
    _check(transfer is not None and transfer.bytes > 0, f"no checkpoint was copied from {site.name} to {other.name}")
    tl.add(f"checkpoint copied {site.name} -> {other.name} ({transfer.bytes:,} bytes, stages.move_checkpoint)")
    resumed = env.resume(other, run_key, "preempt-resume", tl)
    env.finish_resumed(res, tl, resumed, before.steps, before.seconds_per_step)
    _check(res.resumed_from_step == report.step,
           f"resumed from step {res.resumed_from_step}, not from the preemption checkpoint {report.step}")
    _check(res.rpo_steps == 0, f"lost {res.rpo_steps} steps; a preemption within the grace must lose none")


@SCENARIOS.register("corrupt-checkpoint")
def corrupt_checkpoint(env: DrillEnv, res: ScenarioResult, tl: _Timeline) -> None:
    """SIGKILL, then bytes of the newest checkpoint flipped: the resume skips it for the previous one."""
    site = env.primary
    run_key = env.run_key("corrupt-checkpoint")
    store = env.store(site, run_key)
    res.site = site.name
    first = env.run_to_fault(site, run_key, "corrupt-checkpoint", tl)
    tl.fault("SIGKILL sent to the training process")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait()
    before = first.beacon()
    complete = store.list()
    _check(len(complete) >= 2, f"only {len(complete)} checkpoint(s) at step {before.steps}; need two")
    newest, previous = complete[-1], complete[-2]
    last = max(before.steps, newest.step)
    flip_bytes(store, newest.key)
    tl.add(f"checkpoint of step {newest.step} corrupted ({newest.key}: bytes flipped, manifest kept)")
    res.notes.append(f"killed at step {last}; newest checkpoint {newest.step} corrupted, previous {previous.step}")
    resumed = env.resume(site, run_key, "corrupt-checkpoint-resume", tl)
    env.finish_resumed(res, tl, resumed, last, before.seconds_per_step)
    _check(res.resumed_from_step == previous.step,
           f"resumed from step {res.resumed_from_step}, not from the previous valid checkpoint {previous.step}")
    if "skipping checkpoint" in resumed.log.read_text(errors="replace"):
        res.notes.append("the resumed process logged that it skipped the corrupt checkpoint")


def flip_bytes(store: CheckpointStore, key: str, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of the object ``key`` (what bit rot or a torn write leaves)."""
    blob = bytearray(store.store.get_bytes(key))
    start = max(0, len(blob) // 2 - count // 2)
    for i in range(start, min(len(blob), start + count)):
        blob[i] ^= 0xFF
    store.store.put_bytes(key, bytes(blob))


@SCENARIOS.register("s3-down")
def s3_down(env: DrillEnv, res: ScenarioResult, tl: _Timeline) -> None:
    """The S3 server stops right before a checkpoint's manifest upload; the retried stage resumes once it is back."""
    from hybridtrain.errors import SiteUnavailable
    from hybridtrain.training.checkpoint import CheckpointStore

    try:
        import boto3

        from hybridtrain.specs.sites import S3Store
        from hybridtrain.storage.s3 import S3ObjectStore, S3Options
    except ImportError as exc:
        raise Skipped(f"boto3 is not installed ({exc}); pip install boto3") from None
    server = LoopbackS3()
    try:
        server.start()
    except ImportError as exc:
        raise Skipped(f"moto's S3 server is not installed ({exc}); pip install 'moto[server]'") from None
    try:
        site = "drill-s3"
        res.site = res.resumed_site = site
        bucket = "hybridtrain-drill"
        config = S3Store(bucket=bucket, endpoint_url=server.url, access_key_id="drill", secret_access_key="drill")
        boto3.client("s3", endpoint_url=server.url, aws_access_key_id="drill", aws_secret_access_key="drill",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        run_key = env.run_key("s3-down")
        options = S3Options()  # production's retries and backoff: part of the RTO
        objects = S3ObjectStore(config, "objects", site=site, options=options)
        store = CheckpointStore.for_run(objects, JOB, run_key, keep_last=env.spec.checkpoint.keep_last)
        at = math.ceil(env.fault_step / env.interval) * env.interval
        manifest = f"ckpt-{at:012d}-000.json"
        stopped = threading.Event()

        def hook(request: Any, **kwargs: Any) -> None:
            if not stopped.is_set() and manifest in request.url:
                tl.fault(f"S3 server stopped right before the upload of {manifest}")
                server.stop()
                stopped.set()

        objects.client.meta.events.register("before-send.s3.PutObject", hook)
        counter = StepCounter()
        tl.add(f"training started in this process, checkpoints to s3://{bucket}/objects ({server.url})")
        try:
            env.trainer(store).fit(*env.frames(), should_stop=counter)
        except SiteUnavailable as exc:
            tl.add(f"the store gave up after {options.attempts} attempts: {exc}")
            _check(exc.retryable and exc.site == site, f"the error does not say to retry elsewhere: {exc!r}")
        else:
            raise DrillFailed(f"training finished without reaching the checkpoint of step {at}")
        server.start()
        tl.add("S3 server back")
        again = CheckpointStore.for_run(S3ObjectStore(config, "objects", site=site, options=options), JOB, run_key,
                                        keep_last=env.spec.checkpoint.keep_last)
        visible = [c.step for c in again.list()]
        _check(at not in visible, f"the checkpoint of step {at} is listed although its manifest never arrived")
        leftover = objects.exists(f"{store.prefix}ckpt-{at:012d}-000.pt")
        res.notes.append(f"upload of step {at} cut before its manifest: {'data object left, ' if leftover else ''}"
                         f"not visible; visible checkpoints {visible}")
        retry = StepCounter()
        tl.add("stage retried: a new trainer over the same store")
        result = env.trainer(again).fit(*env.frames(), should_stop=retry)
        tl.add("resumed run: first step completed", retry.first_at)
        tl.add("resumed run finished", retry.last_at)
        # The store failed while saving step `at`: that step was completed (the counter is asked after the save).
        res.last_step = max(counter.steps, at)
        res.resumed_from_step = result.resumed_from_step
        _check(result.resumed_from_step is not None, "the retry found no checkpoint and started afresh")
        res.rto_s = round(tl.since_fault(retry.first_at), 3)
        res.rpo_steps = res.last_step - result.resumed_from_step
        step_s = counter.seconds_per_step or (env.reference.seconds_per_step if env.reference else None)
        res.rpo_s = round(res.rpo_steps * step_s, 4) if step_s else None
        res.weights_match_reference = env.matches_reference(result.model.state_dict())
        _check(result.global_step == env.steps, f"the retry ended at step {result.global_step}, not {env.steps}")
        _check(bool(visible) and result.resumed_from_step == visible[-1],
               f"the retry resumed from {result.resumed_from_step}, not the newest visible checkpoint {visible}")
        _check(res.rpo_steps <= env.interval, f"lost {res.rpo_steps} steps, more than one interval")
        res.notes.append(f"S3 retries as in production (S3Options(): {options.attempts} attempts, backoff from "
                         f"{options.backoff_s:g} s)")
    finally:
        server.stop()


@SCENARIOS.register("ssh-down")
def ssh_down(env: DrillEnv, res: ScenarioResult, tl: _Timeline) -> None:
    """sshd stopped mid-run: health check, placement elsewhere, checkpoint moved, resumed at the next site."""
    from hybridtrain import stages
    from hybridtrain.errors import SiteUnavailable
    from hybridtrain.placement.engine import Placement
    from hybridtrain.placement.policy import Policy
    from hybridtrain.placement.request import ResourceRequest
    from hybridtrain.remote.remote_training import ssh_train
    from hybridtrain.remote.site_health import check_site, unavailable
    from hybridtrain.remote.ssh_site import Timeouts
    from hybridtrain.specs.job import Sensitivity
    from hybridtrain.specs.sites import LocalStore, Site, SitesCatalog

    missing = LoopbackSshd.missing()
    if missing:
        raise Skipped(missing)
    sshd = LoopbackSshd.start(env.scratch / "sshd")
    try:
        a = Site(name="drill-ssh-a", kind="onprem", region="drill", jurisdiction="EU", price_per_gpu_hour=1.0,
                 work_pool="drill", store=LocalStore(path=str(env.scratch / "store-ssh-a")), hosts=(sshd.host,))
        b = Site(name="drill-ssh-b", kind="onprem", region="drill", jurisdiction="EU", price_per_gpu_hour=2.0,
                 work_pool="drill", store=LocalStore(path=str(env.scratch / "store-ssh-b")))
        catalog = SitesCatalog(apiVersion="hybridtrain/v1", sites=(a, b))
        sites_file = env.scratch / "sites-ssh.yaml"
        import yaml

        sites_file.write_text(yaml.safe_dump(catalog.model_dump(mode="json"), sort_keys=False))
        ws = dataclasses.replace(env.ws, sites_file=sites_file, secrets=None)
        env.push_to(a, extra=True)
        env.push_to(b, extra=True)
        engine = Placement([a, b], Policy(apiVersion="hybridtrain/v1"))
        request = ResourceRequest(job=JOB, gpus=0, run_hours=0.1, max_run_hours=1.0, submitted_at=0.0,
                                  data_site=a.name, sensitivity=Sensitivity.internal)
        placed = engine.decide(request, now=0.0)
        _check(placed.site == a.name, f"placement chose {placed.site}, not the cheaper SSH site {a.name}")
        res.site = a.name
        run_key = env.run_key("ssh-down")
        job_id = f"drill-ssh-{env.stamp}"
        store_a = env.store(a, run_key, ws)
        env.store(b, run_key, ws)
        at = math.ceil(env.fault_step / env.interval) * env.interval
        done = threading.Event()
        fault: dict[str, Any] = {}

        def strike() -> None:
            # Once the job's checkpoint of step `at` is in the store, the host goes away: sshd and the job with it.
            while not done.is_set():
                seen = [c for c in store_a.list() if c.step >= at]
                if seen:
                    fault["checkpoint"] = seen[-1]
                    fault["at"] = tl.fault(f"sshd of {a.name} stopped (checkpoint of step {seen[-1].step} stored)")
                    sshd.stop()
                    fault["killed"] = kill_host_job(Path(sshd.host.workdir), job_id)
                    tl.add(f"the host's job is gone with it ({fault['killed']} process(es) killed)")
                    return
                done.wait(0.005)

        watcher = threading.Thread(target=strike, name="drill ssh-down", daemon=True)
        lines: list[str] = []
        tl.add(f"ssh_train: job {job_id} launched on {a.name} over SSH (torchrun)")
        watcher.start()
        try:
            ssh_train(ws, env.spec, env.approved, a, sshd.host, sshd.private_key, sshd.known_hosts,
                      run_key=run_key, job_id=job_id, on_line=lines.append, poll_interval=0.2, timeout=WAIT_S,
                      timeouts=Timeouts(**DRILL_SSH_TIMEOUTS))
        except SiteUnavailable as exc:
            tl.add(f"ssh_train gave up: {exc}")
        else:
            raise DrillFailed(f"the job finished on {a.name} before the drill could stop its sshd")
        finally:
            done.set()
            watcher.join(timeout=30)
            (env.out / "ssh-down.log").write_text("\n".join(lines) + "\n")
        _check("at" in fault, "ssh_train failed before the drill stopped sshd:\n" + "\n".join(lines[-10:]))
        healths = [check_site(a, ws.root, private_key=sshd.private_key, known_hosts=sshd.known_hosts, timeout_s=2),
                   check_site(b, ws.root, timeout_s=2)]
        tl.add("site health: " + "; ".join(f"{h.site} {'healthy' if h.healthy else 'UNHEALTHY: ' + h.reason}"
                                           for h in healths))
        _check([h.healthy for h in healths] == [False, True],
               f"health checks said {[(h.site, h.healthy) for h in healths]}, expected {a.name} down, {b.name} up")
        decision = engine.decide(request, now=0.0, unavailable=unavailable(healths))
        tl.add(f"placement: {decision.site} (rejected: {', '.join(f'{k}: {v}' for k, v in decision.rejected.items())})")
        _check(decision.site == b.name, f"placement chose {decision.site}, not the healthy {b.name}")
        transfer = stages.move_checkpoint(ws, env.spec, run_key, a.name, decision.site)
        _check(transfer is not None and transfer.bytes > 0, f"no checkpoint was copied from {a.name} to {b.name}")
        tl.add(f"checkpoint copied {a.name} -> {b.name} ({transfer.bytes:,} bytes, stages.move_checkpoint)")
        # The lost host's last step cannot be observed: estimate it from the checkpoint's time and the step time.
        ckpt = fault["checkpoint"]
        step_s = env.reference.seconds_per_step if env.reference else 0.0
        extra = max(0, int((fault["at"] - ckpt.created.timestamp()) / step_s)) if step_s else 0
        resumed = env.resume(b, run_key, "ssh-down-resume", tl, ws)
        env.finish_resumed(res, tl, resumed, ckpt.step + extra, None)
        res.rpo_estimated = True
        res.notes.append(f"last step on the lost host estimated: checkpoint {ckpt.step} + {extra} step(s) in the "
                         f"{fault['at'] - ckpt.created.timestamp():.3f} s before the fault")
        res.notes.append(f"SSH reconnect window {DRILL_SSH_TIMEOUTS['reconnect']:g} s (production: "
                         f"{Timeouts().reconnect:g} s)")
        _check(res.resumed_from_step >= ckpt.step,
               f"resumed from step {res.resumed_from_step}, older than the checkpoint {ckpt.step} seen on {a.name}")
    finally:
        sshd.stop()


# -- loopback servers the drill starts ------------------------------------------------------------


class LoopbackS3:
    """moto's S3 served over HTTP on 127.0.0.1 from this process; ``stop()`` is hard, ``start()`` brings it back.

    Stopping closes the listener and cuts every live connection (what a crashed server looks
    like to a client: connection reset, then refused). moto keeps its state in process, so after
    ``start()`` (same port) the buckets are still there, like a server with durable storage.
    """

    def __init__(self) -> None:
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)

        class Tracking(MotoRequestHandler):
            def setup(self) -> None:
                super().setup()
                self.server.live.add(self.connection)  # type: ignore[attr-defined]

            def finish(self) -> None:
                self.server.live.discard(self.connection)  # type: ignore[attr-defined]
                super().finish()

        server = make_server("127.0.0.1", self.port, DomainDispatcherApplication(create_backend_app), True,
                             request_handler=Tracking)
        server.live = set()  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="drill s3", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for conn in list(server.live):
            with suppress(OSError):  # closed by its handler meanwhile: already cut
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)


SSHD = "/usr/sbin/sshd"


@dataclasses.dataclass
class LoopbackSshd:
    """A throwaway OpenSSH server on 127.0.0.1 (key auth only) and what a site block holds to reach it."""

    proc: subprocess.Popen
    host: SshHost
    private_key: str
    known_hosts: str

    @staticmethod
    def missing() -> str | None:
        """Why no loopback sshd can be started here (None: it can)."""
        if not Path(shutil.which("sshd") or SSHD).exists():
            return "skipped: openssh-server not installed (apt-get install -y openssh-server)"
        if shutil.which("ssh-keygen") is None:
            return "skipped: ssh-keygen not installed (apt-get install -y openssh-client)"
        return None

    @classmethod
    def start(cls, d: Path, timeout: float = 15.0, port: int | None = None) -> LoopbackSshd:
        """Start sshd with the keys in ``d`` (made on first use) on ``port`` (default: a free loopback port).

        Starting again with the same ``d`` and port brings "the same host" back: same host key,
        authorized key and working directory. The login user is whoever runs the drill.
        """
        import pwd

        from hybridtrain.specs.sites import SshHost

        d.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "user_key"):
            if not (d / name).exists():
                keygen(d / name)
        (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        log_path = d / "sshd.log"
        for _ in range(3):  # a free port may be taken between choosing and binding it
            chosen = port or free_port()
            with open(log_path, "wb") as fh:
                proc = subprocess.Popen(
                    [shutil.which("sshd") or SSHD, "-D", "-e", "-f", "/dev/null", f"-oHostKey={d / 'host_key'}",
                     f"-oPidFile={d / 'sshd.pid'}", f"-oPort={chosen}", "-oListenAddress=127.0.0.1",
                     f"-oAuthorizedKeysFile={d / 'authorized_keys'}", "-oPasswordAuthentication=no",
                     "-oKbdInteractiveAuthentication=no", "-oUsePAM=no", "-oStrictModes=no",
                     "-oPermitRootLogin=prohibit-password", "-oSubsystem=sftp internal-sftp"],
                    stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if _listening(chosen, proc, timeout):
                break
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if "Address already in use" not in log_path.read_text() or port is not None:
                raise DrillFailed(f"sshd did not start on port {chosen}: {log_path.read_text()[-2000:]}")
        else:
            raise DrillFailed(f"sshd found no free port: {log_path.read_text()[-2000:]}")
        workdir = d / "work"
        workdir.mkdir(exist_ok=True)
        host = SshHost(hostname="127.0.0.1", port=chosen, username=pwd.getpwuid(os.getuid()).pw_name, gpus=0,
                       workdir=str(workdir), python=sys.executable)
        return cls(proc=proc, host=host, private_key=(d / "user_key").read_text(),
                   known_hosts=known_host_line(d / "host_key.pub", chosen))

    def stop(self) -> None:
        """Stop the listener, then every connection it was serving (a stopped host has none)."""
        stop_with_children(self.proc)


def keygen(path: Path) -> None:
    """A passphrase-less ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hybridtrain-loopback", "-f", str(path)],
                   check=True, timeout=30, capture_output=True)


def known_host_line(pub: Path, port: int) -> str:
    """The known_hosts line for a loopback host on ``port`` whose host key is ``pub``."""
    kind, b64 = pub.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {kind} {b64}\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (e.g. sshd's per-connection processes)."""
    return [p for p in _pids() if _ppid(p) == pid]


def stop_with_children(*procs: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate each of ``procs`` at once, SIGKILL what is left after ``grace_s`` (one grace for all),
    then SIGKILL the children they had: those outlive them otherwise."""
    children = [pid for proc in procs for pid in child_pids(proc.pid)]
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for pid in children:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _listening(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None  # ended while we looked


def kill_host_job(workdir: Path, job_id: str) -> int:
    """SIGKILL every process of a job on a loopback host (its wrapper's group and torchrun's workers); how many."""
    marker = f"{workdir / 'jobs' / job_id}/bundle".encode()

    def has_marker(pid: int) -> bool:
        try:
            return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False  # ended while we looked

    pids = [p for p in _pids() if p != os.getpid() and has_marker(p)]
    pid_file = workdir / "jobs" / job_id / "pid"
    if pid_file.exists():
        with suppress(ProcessLookupError, ValueError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(has_marker(p) for p in pids), f"the processes of job {job_id} to end", timeout=30,
               every=0.01)
    return len(pids)


# -- running a drill ----------------------------------------------------------------------------------


def run_drill(
    ws: Workspace,
    scenarios: Sequence[str] | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    interval: int | None = None,
    out: Path | None = None,
    record: bool = True,
    say: Callable[[str], None] | None = None,
) -> DrillReport:
    """Run the drill's ``scenarios`` (default: all) in ``ws`` and return the report (written, and recorded in MLflow).

    ``steps``: optimizer steps of each run (default 300); ``interval``: steps between checkpoints
    (default a twelfth of the run); ``out``: the report's directory (default
    ``.hybridtrain/drills/<timestamp>``); ``record``: log the report to MLflow (experiment
    ``hybridtrain-drills``); ``say``: progress lines. Unknown scenario names or impossible step
    settings raise ``SpecError`` before anything runs. A scenario that fails is reported as
    failed (with what happened), never raised; check ``report.failed``.
    """
    names = check_scenarios(scenarios)
    plan_steps(steps, interval)  # refuse impossible settings before anything starts
    emit = say or (lambda line: log.info("%s", line))
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    directory = Path(out) if out is not None else ws.state_dir / "drills" / stamp
    directory = directory if directory.is_absolute() else (ws.root / directory)
    if out is None and directory.exists():
        directory = directory.with_name(f"{stamp}-{os.getpid()}")
    drills_dir = ws.state_dir / "drills"
    drills_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".work-{stamp}-", dir=drills_dir))
    env: DrillEnv | None = None
    try:
        env = DrillEnv(ws, scratch, directory, stamp, steps, interval, emit)  # reads the sites catalog
        directory.mkdir(parents=True, exist_ok=True)
        report = DrillReport(started_at=started, workspace=str(ws.root), steps=env.steps,
                             checkpoint_interval=env.interval, fault_step=env.fault_step)
        env.prepare()
        assert env.reference is not None
        report.reference_seconds = round(env.reference.seconds, 3)
        report.seconds_per_step = round(env.reference.seconds_per_step, 6)
        for name in names:
            report.scenarios.append(_run_scenario(env, name))
    finally:
        if env is not None:
            env.stop_all()
            env.cleanup_checkpoints()
        shutil.rmtree(scratch, ignore_errors=True)
    report.finished_at = datetime.now(UTC)
    report.write(directory)
    if record:
        try:
            report.mlflow_run_id = record_in_mlflow(ws, report, directory)
        except Exception as exc:  # noqa: BLE001 - the drill's findings are kept (and said) even when MLflow is down
            report.notes.append(f"not recorded in MLflow ({ws.tracking_uri}): {type(exc).__name__}: {exc}")
            report.write(directory)
    return report


def _run_scenario(env: DrillEnv, name: str) -> ScenarioResult:
    res = ScenarioResult(scenario=name, outcome="ok", checkpoint_interval=env.interval)
    tl = _Timeline()
    env.say(f"{name}: starting")
    began = time.perf_counter()
    # Warnings of the recovery path (S3 retries, SSH reconnects) are events of the scenario: into its timeline.
    capture = _LogCapture(tl)
    package_log = logging.getLogger("hybridtrain")
    package_log.addHandler(capture)
    try:
        SCENARIOS.get(name)(env, res, tl)
    except Skipped as exc:
        res.outcome = "skipped"
        reason = str(exc)
        res.notes.insert(0, reason if reason.startswith("skipped") else f"skipped: {reason}")
    except DrillFailed as exc:
        res.outcome = "failed"
        res.notes.insert(0, str(exc))
    except Exception as exc:  # noqa: BLE001 - an unexpected error in a recovery path is what a drill exists to find
        res.outcome = "failed"
        res.notes.insert(0, f"{type(exc).__name__}: {exc}")
        (env.out / f"{name}.traceback.txt").write_text(traceback.format_exc())
    finally:
        package_log.removeHandler(capture)
        env.stop_all()
    res.timeline = tl.to_events()
    res.seconds = round(time.perf_counter() - began, 2)
    shown = ", ".join(x for x in (
        f"RTO {res.rto_s:.2f} s" if res.rto_s is not None else "",
        f"RPO {res.rpo_steps} steps" if res.rpo_steps is not None else "",
        f"resumed from {res.resumed_from_step}" if res.resumed_from_step is not None else "") if x)
    env.say(f"{name}: {res.outcome}" + (f" ({shown})" if shown else "") + (f" - {res.notes[0]}"
                                                                        if res.outcome != "ok" else ""))
    return res


class _LogCapture(logging.Handler):
    """Warnings of the ``hybridtrain`` loggers during a scenario, as timeline events."""

    def __init__(self, tl: _Timeline):
        super().__init__(logging.WARNING)
        self.tl = tl

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.tl.add(f"{record.levelname.lower()} ({record.name}): "
                    f"{message if len(message) <= 400 else message[:400] + '...'}", record.created)


def record_in_mlflow(ws: Workspace, report: DrillReport, directory: Path) -> str:
    """One run in experiment ``hybridtrain-drills``: per-scenario RTO/RPO metrics, the report files as artifacts."""
    from hybridtrain.tracking.model_registry import Registry

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    run_id = registry.start_run(EXPERIMENT, f"drill-{report.started_at.strftime('%Y%m%dT%H%M%SZ')}", {
        "hybridtrain.kind": "failover-drill",
        "hybridtrain.drill.drill.outcome": "failed" if report.failed else "ok",
        "hybridtrain.drill.drill.directory": str(directory),
    })
    report.mlflow_run_id = run_id
    try:
        registry.log_params(run_id, {"steps": report.steps, "checkpoint_interval": report.checkpoint_interval,
                                     "fault_step": report.fault_step,
                                     "scenarios": ",".join(s.scenario for s in report.scenarios)})
        metrics: dict[str, float] = {}
        for s in report.scenarios:
            metrics[f"{s.scenario}.ok"] = 1.0 if s.outcome == "ok" else 0.0
            for key in ("rto_s", "rpo_steps", "rpo_s"):
                value = getattr(s, key)
                if value is not None:
                    metrics[f"{s.scenario}.{key}"] = float(value)
        registry.log_metrics(run_id, metrics)
        registry.set_tags(run_id, {f"hybridtrain.drill.drill.{s.scenario}": s.outcome for s in report.scenarios})
        md, js = report.write(directory)  # now with the run id
        for path in (md, js):
            registry.log_text(run_id, path.read_text(), path.name)
    except BaseException:
        registry.end_run(run_id, "FAILED")
        raise
    registry.end_run(run_id, "FAILED" if report.failed else "FINISHED")
    return run_id

