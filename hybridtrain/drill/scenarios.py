"""Scenarios: the faults a drill injects (kill -9, preemption, corrupt checkpoint, S3 and SSH outages), by name."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hybridtrain.drill.environment import DrillEnv, StepCounter
from hybridtrain.drill.loopback import LoopbackS3, LoopbackSshd
from hybridtrain.drill.processes import kill_host_job
from hybridtrain.drill.report import DRILL_SSH_TIMEOUTS, JOB, ScenarioResult
from hybridtrain.drill.timeline import WAIT_S, DrillFailed, Skipped, Timeline, require
from hybridtrain.errors import EXIT_PREEMPTED, Problem, SiteUnavailable, SpecError
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.request import ResourceRequest
from hybridtrain.plugins import PluginRegistry
from hybridtrain.remote.site_health import check_site, unavailable
from hybridtrain.specs.job import Sensitivity
from hybridtrain.specs.sites import LocalStore, S3Store, Site, SitesCatalog
from hybridtrain.training.preemption import PreemptionReport

if TYPE_CHECKING:
    from hybridtrain.training.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

# -- scenarios: the registry -------------------------------------------------------------------


Scenario = Callable[["DrillEnv", ScenarioResult, Timeline], None]
SCENARIOS: PluginRegistry[Scenario] = PluginRegistry("drill scenario")


def scenario_names() -> list[str]:
    return SCENARIOS.names


def check_scenarios(names: Sequence[str] | None, *, field: str = "--scenario",
                    source: str = "hybridtrain drill") -> list[str]:
    """The scenarios to run, in the order given (None or empty: all); ``SpecError`` naming the valid ones.

    ``field`` and ``source`` are how the caller names the input (the CLI's ``--scenario`` by default; the
    failover-drill flow's ``scenarios``)."""
    if not names:
        return scenario_names()
    problems = [Problem(field, SCENARIOS.unknown_message(n)) for n in names if n not in SCENARIOS]
    if problems:
        raise SpecError(source, problems)
    return list(dict.fromkeys(names))


# -- the scenarios -----------------------------------------------------------------------------


@SCENARIOS.register("kill-9")
def kill_9(env: DrillEnv, res: ScenarioResult, tl: Timeline) -> None:
    """SIGKILL mid-interval; a new process at the same site resumes from the newest valid checkpoint."""
    site = env.primary
    run_key = env.run_key("kill-9")
    store = env.store(site, run_key)
    res.site = site.name
    first = env.run_to_fault(site, run_key, "kill-9", tl, store)
    tl.fault("SIGKILL sent to the training process")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait()
    tl.add(f"process gone (status {first.proc.returncode})")
    before = first.beacon()
    restored = store.latest_valid()
    require(restored is not None, "no valid checkpoint was left to resume from")
    newest = restored[1]
    # A checkpoint is written before the beacon counts its step: a kill in between leaves the beacon one behind.
    last = max(before.steps, newest.step)
    res.notes.append(f"killed at step {last}, newest valid checkpoint {newest.step}")
    resumed = env.resume(site, run_key, "kill-9-resume", tl)
    env.finish_resumed(res, tl, resumed, last, before.seconds_per_step)
    require(res.resumed_from_step == newest.step,
           f"resumed from step {res.resumed_from_step}, not from the newest valid checkpoint {newest.step}")
    require(0 <= res.rpo_steps <= env.interval,
           f"lost {res.rpo_steps} steps, more than the checkpoint interval ({env.interval})")


@SCENARIOS.register("preempt")
def preempt(env: DrillEnv, res: ScenarioResult, tl: Timeline) -> None:
    """SIGTERM: checkpoint within the grace, exit 75, checkpoint moved to another site, resumed there."""
    from hybridtrain import stages  # lazy: heavy (pandas, numpy)

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
    require(code == EXIT_PREEMPTED, f"exit status {code} after SIGTERM, expected {EXIT_PREEMPTED}:\n{first.tail()}")
    report = PreemptionReport.read(first.bundle_dir)
    require(report is not None, "the preempted process left no preempted.json")
    require(report.within_grace, f"the checkpoint took {report.seconds_after_notice} s, past the {grace:g} s grace")
    res.notes.append(f"checkpoint of step {report.step} stored {report.seconds_after_notice or 0:.2f} s after the "
                     "notice")
    tl.add(f"checkpoint of step {report.step} stored, preempted.json written", report.stopped_at.timestamp())
    before = first.beacon()
    transfer = stages.move_checkpoint(env.ws, env.spec, run_key, site.name, other.name)
    require(transfer is not None and transfer.bytes > 0, f"no checkpoint was copied from {site.name} to {other.name}")
    tl.add(f"checkpoint copied {site.name} -> {other.name} ({transfer.bytes:,} bytes, stages.move_checkpoint)")
    resumed = env.resume(other, run_key, "preempt-resume", tl)
    env.finish_resumed(res, tl, resumed, before.steps, before.seconds_per_step)
    require(res.resumed_from_step == report.step,
           f"resumed from step {res.resumed_from_step}, not from the preemption checkpoint {report.step}")
    require(res.rpo_steps == 0, f"lost {res.rpo_steps} steps; a preemption within the grace must lose none")


@SCENARIOS.register("corrupt-checkpoint")
def corrupt_checkpoint(env: DrillEnv, res: ScenarioResult, tl: Timeline) -> None:
    """SIGKILL, then bytes of the newest checkpoint flipped: the resume skips it for the previous one."""
    site = env.primary
    run_key = env.run_key("corrupt-checkpoint")
    store = env.store(site, run_key)
    res.site = site.name
    first = env.run_to_fault(site, run_key, "corrupt-checkpoint", tl, store)
    tl.fault("SIGKILL sent to the training process")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait()
    before = first.beacon()
    complete = store.list()
    require(len(complete) >= 2, f"only {len(complete)} checkpoint(s) at step {before.steps}; need two")
    newest, previous = complete[-1], complete[-2]
    last = max(before.steps, newest.step)
    flip_bytes(store, newest.key)
    tl.add(f"checkpoint of step {newest.step} corrupted ({newest.key}: bytes flipped, manifest kept)")
    res.notes.append(f"killed at step {last}; newest checkpoint {newest.step} corrupted, previous {previous.step}")
    resumed = env.resume(site, run_key, "corrupt-checkpoint-resume", tl)
    env.finish_resumed(res, tl, resumed, last, before.seconds_per_step)
    require(res.resumed_from_step == previous.step,
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
def s3_down(env: DrillEnv, res: ScenarioResult, tl: Timeline) -> None:
    """The S3 server stops right before a checkpoint's manifest upload; the retried stage resumes once it is back."""
    from hybridtrain.training.checkpoint import CheckpointStore  # lazy: heavy (torch, numpy)

    try:
        import boto3  # lazy: heavy (boto3)

        from hybridtrain.storage.s3 import S3ObjectStore, S3Options  # lazy: heavy (boto3)
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
            require(exc.retryable and exc.site == site, f"the error does not say to retry elsewhere: {exc!r}")
        else:
            raise DrillFailed(f"training finished without reaching the checkpoint of step {at}")
        server.start()
        tl.add("S3 server back")
        again = CheckpointStore.for_run(S3ObjectStore(config, "objects", site=site, options=options), JOB, run_key,
                                        keep_last=env.spec.checkpoint.keep_last)
        visible = [c.step for c in again.list()]
        require(at not in visible, f"the checkpoint of step {at} is listed although its manifest never arrived")
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
        require(result.resumed_from_step is not None, "the retry found no checkpoint and started afresh")
        res.rto_s = round(tl.since_fault(retry.first_at), 3)
        res.rpo_steps = res.last_step - result.resumed_from_step
        step_s = counter.seconds_per_step or (env.reference.seconds_per_step if env.reference else None)
        res.rpo_s = round(res.rpo_steps * step_s, 4) if step_s else None
        res.weights_match_reference = env.matches_reference(result.model.state_dict())
        require(result.global_step == env.steps, f"the retry ended at step {result.global_step}, not {env.steps}")
        require(bool(visible) and result.resumed_from_step == visible[-1],
               f"the retry resumed from {result.resumed_from_step}, not the newest visible checkpoint {visible}")
        # Checkpoints are written beside training (training.checkpoint_writer): the cut write fails only once the
        # store's retries give up, while training goes on, and that failure stops the run at the next
        # checkpoint at the latest. So the work lost is the cut interval plus at most one more.
        require(res.rpo_steps <= 2 * env.interval, f"lost {res.rpo_steps} steps, more than two intervals")
        res.notes.append(f"S3 retries as in production (S3Options(): {options.attempts} attempts, backoff from "
                         f"{options.backoff_s:g} s)")
    finally:
        server.close()


@SCENARIOS.register("ssh-down")
def ssh_down(env: DrillEnv, res: ScenarioResult, tl: Timeline) -> None:
    """sshd stopped mid-run: health check, placement elsewhere, checkpoint moved, resumed at the next site."""
    from hybridtrain import stages  # lazy: heavy (pandas, numpy)
    from hybridtrain.remote.remote_training import ssh_train  # lazy: heavy (torch, paramiko)
    from hybridtrain.remote.ssh_site import Timeouts  # lazy: heavy (paramiko)

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

        sites_file.write_text(yaml.safe_dump(catalog.model_dump(mode="json"), sort_keys=False))
        ws = dataclasses.replace(env.ws, sites_file=sites_file, secrets=None)
        env.push_to(a, extra=True)
        env.push_to(b, extra=True)
        engine = Placement([a, b], Policy(apiVersion="hybridtrain/v1"))
        request = ResourceRequest(job=JOB, gpus=0, run_hours=0.1, max_run_hours=1.0, submitted_at=0.0,
                                  data_site=a.name, sensitivity=Sensitivity.internal)
        placed = engine.decide(request, now=0.0)
        require(placed.site == a.name, f"placement chose {placed.site}, not the cheaper SSH site {a.name}")
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
        require("at" in fault, "ssh_train failed before the drill stopped sshd:\n" + "\n".join(lines[-10:]))
        healths = [check_site(a, ws.root, private_key=sshd.private_key, known_hosts=sshd.known_hosts, timeout_s=2),
                   check_site(b, ws.root, timeout_s=2)]
        tl.add("site health: " + "; ".join(f"{h.site} {'healthy' if h.healthy else 'UNHEALTHY: ' + h.reason}"
                                           for h in healths))
        require([h.healthy for h in healths] == [False, True],
               f"health checks said {[(h.site, h.healthy) for h in healths]}, expected {a.name} down, {b.name} up")
        decision = engine.decide(request, now=0.0, unavailable=unavailable(healths))
        tl.add(f"placement: {decision.site} (rejected: {', '.join(f'{k}: {v}' for k, v in decision.rejected.items())})")
        require(decision.site == b.name, f"placement chose {decision.site}, not the healthy {b.name}")
        transfer = stages.move_checkpoint(ws, env.spec, run_key, a.name, decision.site)
        require(transfer is not None and transfer.bytes > 0, f"no checkpoint was copied from {a.name} to {b.name}")
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
        require(res.resumed_from_step >= ckpt.step,
               f"resumed from step {res.resumed_from_step}, older than the checkpoint {ckpt.step} seen on {a.name}")
    finally:
        sshd.stop()
