"""DrillEnv: the small deterministic job, data and sites a drill trains, and the processes it launches."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridtrain.datasets.dvc_repo import DvcRepo
from hybridtrain.drill.report import BATCH_SIZE, DEFAULT_STEPS, EPOCHS, JOB, LABEL, VAL_ROWS, ScenarioResult
from hybridtrain.drill.timeline import WAIT_S, DrillFailed, Timeline, wait_until
from hybridtrain.drill.worker import BEACON_FILE, Beacon
from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.remote.job_bundle import JobBundle
from hybridtrain.specs.sites import DVC_SUBDIR
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.tracking.lineage import code_version
from hybridtrain.validation import parse_job
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    import pandas as pd

    from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo
    from hybridtrain.specs.job import JobSpec
    from hybridtrain.specs.sites import Site, SitesCatalog
    from hybridtrain.training.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

# -- the drill's job and data --------------------------------------------------------------------


def drill_spec(steps: int, interval: int, data_site: str) -> JobSpec:
    """The drill's job: a small MLP on ``drill_frame``; ``steps`` per run in ``EPOCHS`` epochs of ``BATCH_SIZE`` rows."""

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
        # Every `interval` steps exactly (no max_overhead spacing): the drill's faults and its "lost less than an
        # interval" check are planned against that cadence.
        "checkpoint": {"interval_steps": interval, "keep_last": 3, "max_overhead": None, "preemption_grace_s": 30},
        "resources": {"cpus": 1, "max_hours": 0.5},
        "registry": {"model_name": JOB},
    }, source="drill job spec")


def drill_frame(train_rows: int, val_rows: int = VAL_ROWS, seed: int = 11) -> pd.DataFrame:
    """Deterministic churn-like rows a small model can learn, with ``split`` and ``partition`` columns."""
    import numpy as np  # lazy: heavy (numpy)
    import pandas as pd  # lazy: heavy (pandas)

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


#: The fewest optimizer steps a drill run may take (``--steps``).
MIN_STEPS = 40
#: The fewest steps between two checkpoints (``--interval``).
MIN_INTERVAL = 2


def plan_steps(steps: int, interval: int | None) -> tuple[int, int, int, int]:
    """(steps per epoch, total steps, checkpoint interval, fault step) for ``--steps``/``--interval``.

    The fault strikes half an interval past the first checkpoint at or after a third of the run
    (and after at least two checkpoints, so ``corrupt-checkpoint`` has a previous one), leaving
    at least one more interval before the end.
    """
    problems = []  # --steps and --interval checked together: one run of the command names both
    if steps < MIN_STEPS:
        problems.append(Problem("--steps", f"{steps} is too few; give at least {MIN_STEPS} (default {DEFAULT_STEPS})"))
    if interval is not None and interval < MIN_INTERVAL:
        problems.append(Problem("--interval", f"must be at least {MIN_INTERVAL} steps, got {interval}"))
    if problems:
        raise SpecError("hybridtrain drill", problems)
    per_epoch = math.ceil(steps / EPOCHS)
    total = per_epoch * EPOCHS
    every = interval if interval is not None else max(2, total // 12)
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
        from hybridtrain.remote.host_training import RESULT_DIR, RESULT_FILE, HostResult  # lazy: heavy (torch, pandas)

        return HostResult.model_validate_json((self.bundle_dir / RESULT_DIR / RESULT_FILE).read_text())

    def state_dict(self) -> dict[str, Any]:
        import torch  # lazy: heavy (torch)

        from hybridtrain.remote.host_training import MODEL_FILE, RESULT_DIR  # lazy: heavy (torch, pandas)

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
                 say: Callable[[str], None], sites: SitesCatalog | None = None):
        """``sites``: the workspace's catalog, already loaded (``check_drill`` reads it before anything is made)."""

        self.ws = ws
        self.scratch = scratch
        self.out = out
        self.stamp = stamp
        self.say = say
        self.per_epoch, self.steps, self.interval, self.fault_step = plan_steps(steps, interval)
        self.sites: SitesCatalog = sites if sites is not None else ws.load_sites()
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
        from hybridtrain import stages  # lazy: heavy (pandas, numpy)

        remotes = {**stages.remotes_for(self.ws, self.sites), **self.extra_remotes}
        secrets = {**stages.remote_secrets_for(self.sites), **self.extra_secrets}
        self._repo = DvcRepo.ensure(self.scratch / "repo", remotes, default_remote=self.primary.dvc_remote,
                                    scm=False, secrets=secrets)
        return self._repo

    def prepare(self) -> None:
        """Write the drill's dataset, track it with DVC, push it to the primary site, train the reference."""
        from hybridtrain.datasets import partitioned  # lazy: heavy (pandas, numpy)
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
        from hybridtrain.training.trainer import Trainer  # lazy: heavy (torch, pandas)

        return Trainer(self.spec.model, self.spec.checkpoint, store, LABEL, device="cpu", threads=1, job=JOB)

    def _train_reference(self) -> Reference:
        from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch, numpy)

        counter = StepCounter()
        store = CheckpointStore(LocalObjectStore(self.scratch / "reference"), "reference")
        started = time.perf_counter()
        result = self.trainer(store).fit(*self.frames(), should_stop=counter)
        seconds = time.perf_counter() - started
        return Reference(state={k: v.clone() for k, v in result.model.state_dict().items()}, seconds=seconds,
                         seconds_per_step=counter.seconds_per_step or seconds / max(1, result.global_step))

    def matches_reference(self, state: dict[str, Any]) -> bool:
        import torch  # lazy: heavy (torch)

        ref = self.reference.state if self.reference is not None else {}
        return state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)

    # -- stores -----------------------------------------------------------------------------------

    def store(self, site: Site, run_key: str, ws: Workspace | None = None) -> CheckpointStore:
        """The run's checkpoints in ``site``'s store (the one the train stage and the host job use)."""
        from hybridtrain import stages  # lazy: heavy (pandas, numpy)
        from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch, numpy)

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
        from hybridtrain.remote.remote_training import portable_site  # lazy: heavy (torch, paramiko)

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

    def run_to_fault(self, site: Site, run_key: str, name: str, tl: Timeline,
                     store: CheckpointStore | None = None) -> Launch:
        """Launch a fresh run at ``site`` and return once it has completed ``fault_step`` steps.

        With ``store``, also wait until the checkpoint of the last interval boundary the run has passed is
        complete there: checkpoints are written beside training, so a fault that strikes while that write
        is still in flight would measure the write's lag, not the fault's loss.
        """
        first = self.launch(site, run_key, name)
        tl.add(f"training process {name} started at {site.name} (pid {first.proc.pid})", first.started_at)

        def reached() -> Any:
            if not first.alive():
                code = first.proc.returncode
                why = (f"the run finished before step {self.fault_step} could be reached by the drill; give more "
                       "--steps" if code == 0 else f"it exited with status {code}:\n{first.tail()}")
                raise DrillFailed(f"process {name} ended before the fault: {why}")
            b = first.beacon()
            if b is None or b.steps < self.fault_step:
                return None
            if store is not None:
                boundary = b.steps // self.interval * self.interval
                if not any(c.step == boundary for c in store.list()):
                    return None
            return b

        what = f"step {self.fault_step}" + (" and its newest checkpoint stored" if store is not None else "")
        beacon = wait_until(reached, f"process {name} to reach {what}")
        tl.add(f"interrupted run: first step completed (pid {first.proc.pid})", beacon.first_step_at)
        tl.add(f"interrupted run: step {beacon.steps} completed", beacon.last_step_at)
        return first

    def resume(self, site: Site, run_key: str, name: str, tl: Timeline, ws: Workspace | None = None) -> Launch:
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

    def finish_resumed(self, res: ScenarioResult, tl: Timeline, resumed: Launch, last_step: int,
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


