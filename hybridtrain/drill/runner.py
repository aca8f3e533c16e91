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
  checkpoint once the server is back (RPO at most two intervals: the write runs beside training).
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

import logging
import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from hybridtrain.drill.environment import DrillEnv, plan_steps
from hybridtrain.drill.report import DEFAULT_STEPS, EXPERIMENT, DrillReport, ScenarioResult
from hybridtrain.drill.scenarios import SCENARIOS, check_scenarios
from hybridtrain.drill.timeline import DrillFailed, Skipped, Timeline
from hybridtrain.errors import HybridtrainError, Problem, SpecError, given_as
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    from hybridtrain.specs.sites import SitesCatalog

log = logging.getLogger(__name__)

# -- checking a drill's inputs ---------------------------------------------------------------------


@dataclass(frozen=True)
class DrillOptionNames:
    """What the caller calls each of the drill's inputs (``--steps`` on the command line, ``steps`` in the
    failover-drill flow's form), and what a refusal names as its source."""

    source: str
    scenarios: str
    steps: str
    interval: str
    out: str

    def example(self, name: str, value: str) -> str:
        """How the user gives ``value`` to ``name``: ``--interval 25`` on the command line, ``interval=25`` in a form."""
        return given_as(name, value)


CLI_NAMES = DrillOptionNames(source="hybridtrain drill", scenarios="--scenario", steps="--steps",
                             interval="--interval", out="--out")
FLOW_NAMES = DrillOptionNames(source="failover-drill", scenarios="scenarios", steps="steps", interval="interval",
                              out="out")

#: The most optimizer steps a drill run may take: each scenario trains up to twice that many and the data grows
#: with it (256 rows a step), so more only holds the worker for hours, or runs out of memory.
MAX_STEPS = 10_000

_STEP_OPTION = re.compile(r"--(steps|interval)\b(?: (\d+))?")


def _renamed(problem: Problem, names: DrillOptionNames) -> Problem:
    """A problem ``plan_steps`` found (it says ``--steps``, ``--interval``), in the caller's names."""
    fields = {"--steps": names.steps, "--interval": names.interval}

    def name(match: re.Match[str]) -> str:
        field = fields[f"--{match[1]}"]
        return names.example(field, match[2]) if match[2] else field

    return Problem(fields.get(problem.path, problem.path), _STEP_OPTION.sub(name, problem.message), problem.line)


def option_problems(
    scenarios: Sequence[str] | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    interval: int | None = None,
    names: DrillOptionNames = CLI_NAMES,
) -> list[Problem]:
    """What is wrong with the scenarios, ``steps`` (40 to ``MAX_STEPS``) and ``interval``, each named as in ``names``.

    Needs no workspace: a flow checks these with its other parameters before it reads anything.
    """
    problems: list[Problem] = []
    try:
        check_scenarios(scenarios, field=names.scenarios)
    except SpecError as exc:
        problems += exc.problems
    if steps > MAX_STEPS:
        problems.append(Problem(names.steps, f"{steps} is too many; give at most {MAX_STEPS} (default {DEFAULT_STEPS})"))
    try:
        plan_steps(steps, interval)
    except SpecError as exc:
        problems += [_renamed(p, names) for p in exc.problems]
    return problems


def check_drill(
    ws: Workspace,
    scenarios: Sequence[str] | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    interval: int | None = None,
    out: Path | None = None,
    names: DrillOptionNames = CLI_NAMES,
) -> tuple[list[str], SitesCatalog]:
    """The scenarios to run and the workspace's sites catalog, or one ``SpecError`` naming every problem at once.

    Checks the scenarios, steps, interval (``option_problems``) and out (a directory, new or existing, never a
    file) together, each named as the caller calls it (``names``: the CLI's flags by default), and reads the sites
    catalog (its problems join the options' ones). Reads only: a refused drill has created nothing.
    """
    problems = option_problems(scenarios, steps=steps, interval=interval, names=names)
    problems += _out_problems(ws, out, field=names.out)
    try:
        sites = ws.load_sites()
    except SpecError as exc:
        if not problems:
            raise
        problems += [Problem(exc.source if not p.path else f"{exc.source}: {p.path}", p.message, p.line)
                     for p in exc.problems]
    except HybridtrainError as exc:
        if not problems:
            raise
        problems.append(Problem(str(ws.sites_file), str(exc)))
    if problems:
        raise SpecError(names.source, problems)
    return check_scenarios(scenarios), sites


def _out_problems(ws: Workspace, out: Path | None, *, field: str = "--out") -> list[Problem]:
    """``out`` must be a directory the report's files can go into: new (made with its parents) or existing."""
    if out is None:
        return []
    path = Path(out) if Path(out).is_absolute() else ws.root / out
    fix = (f"give a new or existing directory for the report's files, or leave out {field} "
           "(default .hybridtrain/drills/<timestamp>)")
    for p in (path, *path.parents):
        if not (p.exists() or p.is_symlink()):
            continue
        if not p.is_dir():
            where = f"{out} is a file, not a directory" if p == path else f"{p} (in {out}) is a file, not a directory"
            return [Problem(field, f"{where}; {fix}")]
        if not os.access(p, os.W_OK | os.X_OK):
            return [Problem(field, f"cannot write in {p} (in {out}): permission denied; {fix}")]
        return []
    return []


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
    names: DrillOptionNames = CLI_NAMES,
) -> DrillReport:
    """Run the drill's ``scenarios`` (default: all) in ``ws`` and return the report (written, and recorded in MLflow).

    ``steps``: optimizer steps of each run (default 300, at most ``MAX_STEPS``); ``interval``: steps between checkpoints
    (default a twelfth of the run); ``out``: the report's directory (default
    ``.hybridtrain/drills/<timestamp>``); ``record``: log the report to MLflow (experiment
    ``hybridtrain-drills``); ``say``: progress lines. Unknown scenario names or impossible step
    settings, an ``out`` that is a file or a missing or broken sites catalog raise one ``SpecError`` (every
    problem, each named as in ``names``: the CLI's flags by default) before anything is created
    (``check_drill``). A scenario that fails is reported as failed
    (with what happened), never raised; check ``report.failed``. A drill that stops before its report
    (an error while preparing, Ctrl-C) removes the directories it created.
    """
    to_run, sites = check_drill(ws, scenarios, steps=steps, interval=interval, out=out, names=names)
    emit = say or (lambda line: log.info("%s", line))
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    directory = Path(out) if out is not None else ws.state_dir / "drills" / stamp
    directory = directory if directory.is_absolute() else (ws.root / directory)
    if out is None and directory.exists():
        directory = directory.with_name(f"{stamp}-{os.getpid()}")
    drills_dir = ws.state_dir / "drills"
    # What this drill creates (the outermost missing directory of each): removed again if it stops before its report.
    made = [(directory, _missing_top(directory), True), (drills_dir, _missing_top(drills_dir), False)]
    drills_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".work-{stamp}-", dir=drills_dir))
    env: DrillEnv | None = None
    finished = False
    try:
        env = DrillEnv(ws, scratch, directory, stamp, steps, interval, emit, sites=sites)
        directory.mkdir(parents=True, exist_ok=True)
        report = DrillReport(started_at=started, workspace=str(ws.root), steps=env.steps,
                             checkpoint_interval=env.interval, fault_step=env.fault_step)
        env.prepare()
        assert env.reference is not None
        report.reference_seconds = round(env.reference.seconds, 3)
        report.seconds_per_step = round(env.reference.seconds_per_step, 6)
        for name in to_run:
            report.scenarios.append(_run_scenario(env, name))
        finished = True
    finally:
        if env is not None:
            env.stop_all()
            env.cleanup_checkpoints()
        shutil.rmtree(scratch, ignore_errors=True)
        if not finished:  # nothing half-written: no report directory without its report
            for path, top, tree in made:
                _remove_made(path, top, tree=tree)
    report.finished_at = datetime.now(UTC)
    report.write(directory)
    if record:
        try:
            report.mlflow_run_id = record_in_mlflow(ws, report, directory)
        except Exception as exc:  # noqa: BLE001 - the drill's findings are kept (and said) even when MLflow is down
            report.notes.append(f"not recorded in MLflow ({ws.tracking_uri}): {type(exc).__name__}: {exc}")
            report.write(directory)
    return report


def _missing_top(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (what ``mkdir(parents=True)`` creates)."""
    top = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        top = p
    return top


def _remove_made(path: Path, top: Path | None, *, tree: bool) -> None:
    """Remove ``path`` (with its contents when ``tree``) and its parents up to ``top`` while they are empty.

    ``top`` is what ``_missing_top`` said before the drill began (None: it all existed, nothing to remove);
    a directory that something else has put files into since is kept.
    """
    if top is None:
        return
    if tree:
        shutil.rmtree(path, ignore_errors=True)
    for p in (path, *path.parents):
        if p.exists():
            try:
                p.rmdir()
            except OSError:
                return
        if p == top:
            return


def _run_scenario(env: DrillEnv, name: str) -> ScenarioResult:
    res = ScenarioResult(scenario=name, outcome="ok", checkpoint_interval=env.interval)
    tl = Timeline()
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

    def __init__(self, tl: Timeline):
        super().__init__(logging.WARNING)
        self.tl = tl

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.tl.add(f"{record.levelname.lower()} ({record.name}): "
                    f"{message if len(message) <= 400 else message[:400] + '...'}", record.created)


def record_in_mlflow(ws: Workspace, report: DrillReport, directory: Path) -> str:
    """One run in experiment ``hybridtrain-drills``: per-scenario RTO/RPO metrics, the report files as artifacts."""

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    run_id = registry.start_run(EXPERIMENT, f"drill-{report.started_at.strftime('%Y%m%dT%H%M%SZ')}", {
        "hybridtrain.kind": "failover-drill",
        "hybridtrain.drill.outcome": "failed" if report.failed else "ok",
        "hybridtrain.drill.directory": str(directory),
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
        registry.set_tags(run_id, {f"hybridtrain.drill.{s.scenario}": s.outcome for s in report.scenarios})
        md, js = report.write(directory)  # now with the run id
        for path in (md, js):
            registry.log_text(run_id, path.read_text(), path.name)
    except BaseException:
        registry.end_run(run_id, "FAILED")
        raise
    registry.end_run(run_id, "FAILED" if report.failed else "FINISHED")
    return run_id
