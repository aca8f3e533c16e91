"""HostTraining: the host side of a remote training job — a job bundle in, the trained model and its result files out.

``python -m hybridtrain.remote.host_training BUNDLE_DIR`` (under ``torchrun`` on multi-GPU hosts):

1. reads the JobBundle (``bundle.json`` + ``secrets.json``) and validates its spec;
2. joins the torchrun process group when ``WORLD_SIZE`` > 1 (NCCL on CUDA, gloo on CPU);
3. fetches the approved dataset by its DVC pointer from the site's store into the host's
   working copy ``<workdir>/data-copy`` (local rank 0 of each host; the others wait at a barrier);
4. trains with ``Trainer`` — checkpoints under the bundle's run key in the site's object
   store, so a relaunch resumes — printing one progress line per epoch to stdout;
5. rank 0 writes ``BUNDLE_DIR/result/`` atomically: ``result.json`` (HostResult),
   ``model.pt`` (``{"config": ..., "state_dict": ...}``, torch.save) and ``featurizer.json``.

Exit status 0 on success; on a HybridtrainError the message goes to stderr and the status is
the error's ``exit_code`` (any other exception: a traceback and status 1). Either way the
failing rank also writes its message to ``BUNDLE_DIR/error.<rank>.txt``: under torchrun the
log ends with the launcher's own traceback, and the executor reports this file instead.

Preemption: every rank traps SIGTERM/SIGUSR1 (``PreemptionNotice``) for the whole run. On a
notice training stops after the step in progress, rank 0 writes the checkpoint and then
``BUNDLE_DIR/preempted.json`` (``PreemptionReport``: step, checkpoint key, seconds after the
notice, within ``checkpoint.preemption_grace_s`` or not), the ranks meet at a barrier (none exits
before the checkpoint is stored) and each exits with ``EXIT_PREEMPTED`` (75) — not an error
file. torchrun's own status is then 1 (see ``hybridtrain.training.preemption``); the executor goes by
``preempted.json``. ``--preemptions-per-hour R`` passes the site's observed rate to the trainer
for ``checkpoint.auto_interval``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path

import torch
from pydantic import BaseModel

import hybridtrain
from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DvcRepo
from hybridtrain.errors import EXIT_PREEMPTED, HybridtrainError, Preempted, Problem, SpecError
from hybridtrain.remote.job_bundle import JobBundle
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR, DVC_SUBDIR, S3Store, Site
from hybridtrain.storage import open_store
from hybridtrain.training.checkpoint import CheckpointInfo, CheckpointStore
from hybridtrain.training.distributed import Distributed
from hybridtrain.training.preemption import PreemptionNotice
from hybridtrain.training.trainer import Trainer, TrainResult, default_device

MODULE = "hybridtrain.remote.host_training"
RESULT_DIR = "result"
ERROR_FILES = "error.*.txt"
RESULT_FILE = "result.json"
MODEL_FILE = "model.pt"
FEATURIZER_FILE = "featurizer.json"
DATA_COPY = "data-copy"
PREFIX = "hybridtrain:"


class HostResult(BaseModel):
    """What a finished host job reports (``result.json``); timings cover this launch only."""

    job_id: str
    job: str
    run_key: str
    code_version: str
    history: list[dict[str, float]]
    global_step: int
    epochs_completed: int
    resumed_from_step: int | None
    checkpoints_written: int
    last_checkpoint: CheckpointInfo | None
    best_epoch: int | None
    best_val_metric: float | None
    checkpoint_seconds: float = 0.0
    n_features: int
    samples_per_second: float
    seconds: float
    device: str
    world_size: int
    hostname: str
    hybridtrain_version: str
    torch_version: str


#: What a rank reports when another rank failed first: its peer went away mid-collective.
PEER_LOST = re.compile(r"closed by peer|reset by peer|DistBackendError|NCCL communicator|NCCL error|[Ww]atchdog")


def first_error(messages: Mapping[str, str]) -> str:
    """The job's own error from its ranks' ``error.<rank>.txt`` (file name -> text): a rank's own failure
    before the lost-peer echoes of it in the others, the lowest rank first; "" when there is none."""
    found = []
    for name, text in messages.items():
        rank = name.split(".")[1] if name.count(".") >= 2 else ""
        if text.strip():
            found.append((bool(PEER_LOST.search(text)), int(rank) if rank.isdigit() else 0, text.strip()))
    return min(found)[2] if found else ""


def materialize(bundle: JobBundle, ddp: Distributed | None, say: Callable[[str], None]) -> Path:
    """The approved dataset in the host's working copy, fetched by pointer from the site's store."""
    site = bundle.site
    copy = Path(bundle.workdir) / DATA_COPY
    if ddp is None or ddp.local_rank == 0:  # one fetch per host: the nodes of a multi-node job each need a copy
        check_store_credentials(site)
        say(f"{PREFIX} fetching {bundle.approved.path} {bundle.approved.short} from the store of site {site.name}")
        repo = DvcRepo.ensure(copy, {site.dvc_remote: site.dvc_remote_config(Path(bundle.workdir), DVC_SUBDIR)},
                              default_remote=site.dvc_remote, scm=False,
                              secrets={site.dvc_remote: site.dvc_remote_secrets()})
        repo.pull_pointer(bundle.approved, remote=site.dvc_remote)
    if ddp is not None:
        ddp.barrier()  # the other ranks read only once rank 0 has the data in place
    return copy / bundle.approved.path


def check_store_credentials(site: Site) -> None:
    """Refuse at once, naming the fix, when the site's S3 store has no credentials here: none came in the bundle
    (the site's block holds none) and boto3 finds none on this host (environment, config files, instance role).
    Otherwise DVC's fetch fails later with "files failed to download", which reads like a missing dataset."""
    if not isinstance(site.store, S3Store) or site.store.access_key_id:
        return
    import boto3  # lazy: only S3 sites need it

    if boto3.Session(region_name=site.store.region).get_credentials() is None:
        raise SpecError("site credentials", [Problem(
            f"{site.name}.aws_access_key_id",
            f"host {socket.gethostname()} has no credentials for site {site.name}'s store s3://{site.store.bucket} "
            f"(none in the site's block, none in its environment or instance role): run `hybridtrain credentials "
            f"{site.name} --aws-access-key-id ID --aws-secret-access-key-file FILE`, or give its hosts a role that "
            f"may read the bucket")])


def write_result(bundle_dir: Path, result: HostResult, trained: TrainResult) -> Path:
    """Write the result files into ``bundle_dir/result`` at once (temp dir renamed into place)."""
    final = bundle_dir / RESULT_DIR
    tmp = Path(tempfile.mkdtemp(prefix=f".{RESULT_DIR}.tmp-", dir=bundle_dir))
    try:
        torch.save({"config": trained.model.config(), "state_dict": trained.model.state_dict()}, tmp / MODEL_FILE)
        (tmp / FEATURIZER_FILE).write_text(json.dumps(trained.featurizer.to_dict(), sort_keys=True))
        (tmp / RESULT_FILE).write_text(result.model_dump_json(indent=1))
        if final.exists():
            old = bundle_dir / f".{RESULT_DIR}.old-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def run(bundle_dir: Path | str, *, out: Callable[[str], None] | None = None,
        notice: PreemptionNotice | None = None, preemptions_per_hour: float | None = None) -> HostResult | None:
    """Train the bundle's job on this host; rank 0 writes and returns the result (other ranks: None).

    With ``notice`` (entered by the caller) a preemption notice stops training after the step in
    progress: rank 0 writes the checkpoint and ``preempted.json``, and ``Preempted`` is raised on
    every rank once all of them got there.
    """
    bundle_dir = Path(bundle_dir).resolve()
    emit = out or (lambda line: print(line, flush=True))
    bundle = JobBundle.read(bundle_dir)
    spec = bundle.job_spec()
    ddp = Distributed.from_env()
    with ddp.process_group() if ddp is not None else nullcontext():
        main = ddp is None or ddp.is_main
        say = emit if main else (lambda line: None)
        world = ddp.world_size if ddp is not None else 1
        device = ddp.device() if ddp is not None else default_device()
        say(f"{PREFIX} job {bundle.job_id} ({spec.name}, run key {bundle.run_key}) on {socket.gethostname()}: "
            f"{world} process(es) on {device.type}")
        data_dir = materialize(bundle, ddp, say)
        train_df = partitioned.read(data_dir, ["train"])
        val_df = partitioned.read(data_dir, ["val"])
        say(f"{PREFIX} data ready: {len(train_df)} train rows, {len(val_df)} val rows")
        objects = open_store(bundle.site.store, Path(bundle.workdir), CHECKPOINT_SUBDIR, site=bundle.site.name)
        store = CheckpointStore.for_run(objects, spec.name, bundle.run_key, keep_last=spec.checkpoint.keep_last)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        threads = spec.model.threads or max(1, spec.resources.cpus // max(1, local_world))
        trainer = Trainer(spec.model, spec.checkpoint, store, spec.data_schema.label, device=device,
                          threads=threads, job=spec.name, distributed=ddp, preemptions_per_hour=preemptions_per_hour)
        epochs = spec.model.epochs

        def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
            shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items()
                             if k in ("train_loss", "val_auc", "val_accuracy", "val_log_loss"))
            say(f"{PREFIX} epoch {epoch + 1}/{epochs} {shown}")

        if notice is not None:
            notice.grace_s = spec.checkpoint.preemption_grace_s  # recorded in the report
        try:
            trained = trainer.fit(train_df, val_df, on_epoch=on_epoch, should_stop=notice,
                                  on_checkpoint=lambda info: say(f"{PREFIX} checkpoint step {info.step} written "
                                                                 f"({info.size} bytes)"))
        except Preempted as exc:
            exc.site = bundle.site.name
            if main:
                report = (notice.report(exc, checkpoint_uri=f"{objects.url.rstrip('/')}/{exc.checkpoint}"
                                        if exc.checkpoint else None, site=bundle.site.name)
                          if notice is not None else None)
                if report is not None:
                    report.write(bundle_dir)
                    say(f"{PREFIX} preempted ({report.reason}) at step {exc.step}; checkpoint {exc.checkpoint} "
                        f"stored {report.seconds_after_notice or 0:.2f} s after the notice "
                        f"({'within' if report.within_grace else 'PAST'} the {report.grace_s:g} s grace)")
            if ddp is not None:
                ddp.barrier()  # no rank exits before rank 0 has stored the checkpoint and the report
            raise
        if not main:
            return None
        result = HostResult(
            job_id=bundle.job_id,
            job=spec.name,
            run_key=bundle.run_key,
            code_version=bundle.code_version,
            history=trained.history,
            global_step=trained.global_step,
            epochs_completed=trained.epochs_completed,
            resumed_from_step=trained.resumed_from_step,
            checkpoints_written=trained.checkpoints_written,
            last_checkpoint=trained.last_checkpoint,
            best_epoch=trained.best_epoch,
            best_val_metric=trained.best_val_metric,
            checkpoint_seconds=trained.checkpoint_seconds,
            n_features=trained.featurizer.n_features,
            samples_per_second=trained.samples_per_second,
            seconds=trained.seconds,
            device=str(device),
            world_size=world,
            hostname=socket.gethostname(),
            hybridtrain_version=hybridtrain.__version__,
            torch_version=torch.__version__,
        )
        where = write_result(bundle_dir, result, trained)
        say(f"{PREFIX} done: {trained.global_step} steps, {trained.epochs_completed} epochs"
            f"{f', resumed from step {trained.resumed_from_step}' if trained.resumed_from_step is not None else ''}; "
            f"result in {where}")
        return result


def torchrun_command(python: str, bundle_dir: str, launch: list[str], *,
                     preemptions_per_hour: float | None = None) -> list[str]:
    """The command that runs this program on ``bundle_dir`` under torchrun: ``python -m
    torch.distributed.run <launch> -m hybridtrain.remote.host_training <bundle_dir>``.

    ``launch`` holds torchrun's own options (``--standalone``, ``--nnodes``, ``--nproc_per_node``…);
    ``preemptions_per_hour`` becomes this program's ``--preemptions-per-hour``.
    """
    rate = [] if preemptions_per_hour is None else ["--preemptions-per-hour", repr(float(preemptions_per_hour))]
    return [python, "-m", "torch.distributed.run", *launch, "-m", MODULE, bundle_dir, *rate]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description="Run a hybridtrain job bundle on this host.")
    parser.add_argument("bundle_dir", help="directory holding bundle.json (and secrets.json)")
    parser.add_argument("--preemptions-per-hour", type=float, default=None,
                        help="the site's observed preemption rate (for checkpoint.auto_interval)")
    args = parser.parse_args(argv)
    # Rank 0 speaks for the job; the other ranks report only problems, so lines are not repeated.
    level = logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING
    logging.basicConfig(stream=sys.stdout, level=level, format=f"{PREFIX} %(levelname)s %(name)s: %(message)s")
    try:
        # Trapped for the whole run: a notice during the data fetch stops training after its first step.
        with PreemptionNotice() as notice:
            run(args.bundle_dir, notice=notice, preemptions_per_hour=args.preemptions_per_hour)
    except Preempted as exc:
        print(f"{PREFIX} {exc}; exiting with status {EXIT_PREEMPTED}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except HybridtrainError as exc:
        print(f"{PREFIX} error: {exc}", file=sys.stderr, flush=True)
        _record_error(Path(args.bundle_dir), str(exc))
        return exc.exit_code
    except Exception as exc:  # recorded for the executor, then raised on: the traceback goes to the log
        _record_error(Path(args.bundle_dir), f"{type(exc).__name__}: {exc}")
        raise
    return 0


def _record_error(bundle_dir: Path, message: str) -> None:
    rank = os.environ.get("RANK", "0")
    path = bundle_dir / ERROR_FILES.replace("*", rank)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(message + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # the message is in the log in any case
        print(f"{PREFIX} could not write {path}: {exc}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
