"""Trainer: fits a TabularMLP binary classifier with periodic checkpoints and resumes bit-identically after preemption.

An example event sequence (``checkpoint: {interval_steps: 100, keep_last: 3}``):

1. ``fit`` finds no checkpoint under the run's prefix, fits the featurizer on ``train``, seeds
   torch / numpy / ``random`` from ``model.seed`` and trains. Checkpoints land at steps 100,
   200, 300; each epoch ends with validation metrics passed to ``on_epoch``.
2. The spot instance gets its termination notice: SIGTERM, which the process's
   ``PreemptionNotice`` (``hybridtrain.training.preemption``, passed as ``should_stop``) records. After
   step 342 the trainer writes a checkpoint at once and raises ``Preempted(job, 342, key)``;
   the process exits with ``EXIT_PREEMPTED`` (75).
3. A new ``Trainer`` on another site, over the same ``CheckpointStore``, calls ``fit``:
   ``latest_valid()`` returns step 342 (a corrupt newer one would be skipped with a
   warning). Model, optimizer, RNG states, the featurizer, the position inside the epoch
   (the epoch's shuffle is regenerated from (seed, epoch) and the finished batches skipped),
   the running epoch loss and the history are restored, so training continues exactly where
   it stopped. On CPU the final weights are bit-identical (``torch.equal``) to a run that was
   never interrupted; on GPUs that holds only when the kernels used are deterministic.
4. After the last epoch a final checkpoint is written and a ``TrainResult`` returned with
   ``resumed_from_step=342``.

Under torchrun with more than one process (``distributed=Distributed.from_env()``) the same
loop runs on every rank: each rank takes its contiguous shard of every global batch of
``batch_size`` rows (the epoch's shuffle is the same on all ranks), DistributedDataParallel
all-reduces the gradients, and the loss is scaled so that the averaged gradient is the one of
the whole global batch — so the model follows single-process training up to floating-point
summation order, not bit for bit. Only rank 0 writes checkpoints and calls ``on_epoch``; every
rank resumes from the same checkpoint, RNG states included (rank 0's), which reproduces an
uninterrupted run of the same world size exactly on CPU when dropout is 0 or the shards
are of equal size (dropout draws depend on the shard's size). ``should_stop`` is asked on every
rank and the answers are combined (all-reduce of the maximum), so when a signal reaches the
ranks a step apart they still stop together, after the same step.

Checkpoint timing: ``interval_steps`` and ``interval_minutes`` as given, or with
``auto_interval`` a time interval derived from ``preemptions_per_hour`` and the measured write
time (``hybridtrain.training.checkpoint_interval``); timing checkpoints never changes the training itself.
A step checkpoint is left out when it would come sooner after the previous one than its measured
cost allows under ``max_overhead`` (default 1 % of training's time, as CheckFreq bounds it): every
100 steps of a model whose steps take 1 ms, and whose checkpoint costs training 12 ms, would
otherwise cost 12 %; they then come every 1.2 s, at multiples of 100 steps.
Checkpoints are asynchronous (``hybridtrain.training.checkpoint_writer``): a step waits only for an
in-memory snapshot of the state, which a background thread serializes, hashes and stores; that
wait is the "write time" above. Preemption and the end of training wait for the write in flight.

The model's weight initialization and dropout masks draw from generators of its own, seeded with
the spec's seed and saved in each checkpoint, so fits running at once in one process (a sweep's
trials in threads) each train exactly as alone. The trainer also seeds the process-wide torch,
numpy and ``random`` generators and sets torch's CPU thread count for the duration of ``fit``.
It installs no signal handlers and imports no tracking client: callers observe it through
``on_epoch`` and ``should_stop``.

Longer than most modules on purpose: the training loop, its checkpoints, resume and rank handling are one piece of state.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from hybridtrain.datasets.label import binary_labels
from hybridtrain.errors import DataError, Preempted, Problem, SpecError
from hybridtrain.specs.job import HIGHER_IS_BETTER, CheckpointSpec, ModelSpec
from hybridtrain.training.checkpoint import CheckpointInfo, CheckpointStore
from hybridtrain.training.checkpoint_interval import optimal_interval_s
from hybridtrain.training.checkpoint_writer import CheckpointWriter
from hybridtrain.training.distributed import Distributed
from hybridtrain.training.evaluation import binary_metrics, model_probabilities
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.model import TabularMLP

log = logging.getLogger(__name__)

STATE_FORMAT = 1
# ModelSpec fields that may change between an interrupted run and its resume: more epochs
# extend training, threads only change speed. Any other change would silently mix two models.
RESUMABLE_CHANGES = frozenset({"epochs", "threads"})


@dataclass
class TrainResult:
    """What ``Trainer.fit`` produced. ``seconds`` and ``samples_per_second`` cover this call only."""

    model: TabularMLP
    featurizer: Featurizer
    history: list[dict[str, float]]
    global_step: int
    epochs_completed: int
    resumed_from_step: int | None
    checkpoints_written: int
    last_checkpoint: CheckpointInfo | None
    seconds: float
    samples_per_second: float
    best_epoch: int | None = None
    best_val_metric: float | None = None
    #: Seconds training waited for its checkpoints (``checkpoints_written`` of them): gathering the
    #: state and its in-memory snapshot, plus any wait for the previous write still in flight.
    checkpoint_seconds: float = 0.0
    #: Seconds the background writer spent storing them (serialize, hash, write), beside training.
    checkpoint_write_seconds: float = 0.0
    #: The time interval between checkpoints in force at the end (None: steps only).
    checkpoint_interval_s: float | None = None
    #: ``interval_steps`` checkpoints left out to keep their cost under ``checkpoint.max_overhead``.
    checkpoints_skipped: int = 0


@dataclass
class _Progress:
    """Where training stands; saved in every checkpoint."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_loss_sum: float = 0.0
    epoch_samples: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int | None = None
    best_value: float | None = None

    def position(self) -> tuple[int, int]:
        return (self.epoch, self.step_in_epoch)

    def to_state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "epoch_loss_sum": self.epoch_loss_sum,
            "epoch_samples": self.epoch_samples,
            "history": [dict(h) for h in self.history],
            "best_epoch": self.best_epoch,
            "best_value": self.best_value,
        }

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> _Progress:
        return cls(
            epoch=int(s["epoch"]),
            step_in_epoch=int(s["step_in_epoch"]),
            global_step=int(s["global_step"]),
            epoch_loss_sum=float(s["epoch_loss_sum"]),
            epoch_samples=int(s["epoch_samples"]),
            history=[dict(h) for h in s["history"]],
            best_epoch=s["best_epoch"],
            best_value=s["best_value"],
        )


def default_device() -> torch.device:
    """CUDA when a GPU is visible, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The shuffle of ``n`` rows for one epoch, a pure function of (seed, epoch).

    It draws from its own generator, not the global one, so a resumed run regenerates the
    same order without having to replay the draws of earlier epochs.
    """
    epoch_seed = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed))


def _model_generator(seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """(initialization, dropout) generators of a model trained on ``device``, seeded with ``seed``.

    On the CPU one generator draws both, in the order the global RNG did before models had their
    own, so a run alone gives the same weights as then; on a GPU the masks come from a generator on
    that device, as they came from its global one.
    """
    init = torch.Generator().manual_seed(seed)
    return init, init if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed)


def _capture_rng(device: torch.device, dropout: torch.Generator) -> dict[str, Any]:
    # numpy's and random's 624-word states become int64 tensors: loadable with
    # torch.load(weights_only=True), and one object to pickle each instead of 625 ints.
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "dropout": dropout.get_state(),
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _ints(words: torch.Tensor | list[int]) -> list[int]:
    # Checkpoints written before the states were tensors hold lists of ints.
    return words.tolist() if isinstance(words, torch.Tensor) else list(words)


def _restore_rng(state: dict[str, Any], device: torch.device, dropout: torch.Generator) -> None:
    # A checkpoint from before models had their own generator: their masks came from the global one.
    if "dropout" in state:
        dropout.set_state(state["dropout"])
    elif device.type == "cpu":
        dropout.set_state(state["torch"])
    elif "cuda" in state and device.index is not None and device.index < len(state["cuda"]):
        dropout.set_state(state["cuda"][device.index])
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], np.asarray(_ints(n["keys"]), dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(_ints(p["internal"])), p["gauss_next"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _fingerprint(x: torch.Tensor, y: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(x.numpy().tobytes())
    h.update(y.numpy().tobytes())
    return h.hexdigest()


class Trainer:
    """Trains one model spec on one site, checkpointing into ``store``.

    ``device``: where to train (default: CUDA when visible, else CPU). ``threads``: torch CPU
    threads during ``fit`` (default ``model_spec.threads``, else torch's default). ``job``
    names the job in ``Preempted``. ``best_metric`` is the validation metric tracked as
    "best" (the returned model is always the last one, not the best). ``distributed``: this
    process's rank of a torchrun job (with its process group joined); ``None`` or a world of one
    trains alone. ``preemptions_per_hour``: the site's observed preemption rate, used when the
    checkpoint spec asks for ``auto_interval`` (None or 0: none expected, the longest interval).
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        checkpoint: CheckpointSpec,
        store: CheckpointStore,
        label: str,
        *,
        device: str | torch.device | None = None,
        threads: int | None = None,
        job: str = "job",
        best_metric: str = "auc",
        distributed: Distributed | None = None,
        preemptions_per_hour: float | None = None,
    ):
        if best_metric not in HIGHER_IS_BETTER:
            raise ValueError(f"unknown best_metric {best_metric!r}; use one of {', '.join(HIGHER_IS_BETTER)}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.model_spec = model_spec
        self.checkpoint = checkpoint
        self.store = store
        self.label = label
        self.device = torch.device(device) if device is not None else default_device()
        self.threads = threads if threads is not None else model_spec.threads
        self.job = job
        self.best_metric = best_metric
        self.distributed = distributed if distributed is not None and distributed.world_size > 1 else None
        if preemptions_per_hour is not None and preemptions_per_hour < 0:
            raise ValueError(f"preemptions_per_hour must be >= 0, got {preemptions_per_hour}")
        self.preemptions_per_hour = preemptions_per_hour

    # -- inputs -----------------------------------------------------------------------------

    def _labels(self, df: pd.DataFrame, dataset: str) -> np.ndarray:
        if len(df) == 0:
            raise DataError(
                dataset,
                [Problem("", f"the {dataset} frame has no rows; check the dataset version and the split "
                             "fractions in the job spec")],
            )
        y = binary_labels(df, self.label, dataset=dataset)
        if np.unique(y).size < 2:
            raise DataError(
                dataset,
                [Problem(self.label, f"the {dataset} split has a single class ({self.label} is always "
                                     f"{y[0]:g}); a classifier needs both, and AUC is undefined. Use more "
                                     "data or check how the split is drawn")],
            )
        return y

    def _check_compatible(self, state: dict[str, Any], info: CheckpointInfo) -> None:
        if state.get("format") != STATE_FORMAT:
            raise SpecError(info.uri, [Problem("format", f"checkpoint state format {state.get('format')!r} is "
                                                         f"not {STATE_FORMAT}; start a new run (new prefix)")])
        saved = state["model_spec"]
        now = self.model_spec.model_dump(mode="json")
        problems = [
            Problem(f"model.{k}", f"the checkpoint was trained with {saved.get(k)!r} but the spec says {now[k]!r}; "
                                  "restore the spec or start a new run under a new checkpoint prefix")
            for k in sorted(now)
            if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]
        ]
        if problems:
            raise SpecError(f"checkpoint {info.uri}", problems)

    # -- training ---------------------------------------------------------------------------

    def fit(
        self,
        train: pd.DataFrame,
        val: pd.DataFrame,
        *,
        on_epoch: Callable[[int, dict[str, float]], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
    ) -> TrainResult:
        """Train (or resume) to ``model_spec.epochs`` epochs and return the model.

        Resumes from ``store.latest_valid()`` when there is one. Calls ``on_epoch(epoch,
        metrics)`` after each epoch's validation with ``train_loss`` and ``val_<metric>``
        values; an epoch whose end was not checkpointed before an interruption is validated
        (and reported) again after the resume. ``should_stop()`` is asked after every
        optimizer step; when it says True a checkpoint is written and ``Preempted`` raised.
        ``clock`` (seconds) drives ``interval_minutes`` (or the derived interval of
        ``auto_interval``) and the timings in the result; checkpoint writes are timed with
        ``time.perf_counter``. Checkpoints are stored by a ``CheckpointWriter`` beside training
        (the step waits only for an in-memory snapshot); a failed write is raised after the next
        step, and ``fit`` returns or raises only once the last one submitted is stored.
        ``time.perf_counter``. ``on_checkpoint(info)`` is called on the training thread once each checkpoint this process wrote is stored.

        Raises ``DataError`` for an empty frame or a missing, non-binary or single-class label
        or a missing feature column, and ``SpecError`` when the checkpoint found was trained
        with a different model spec.
        """
        started = clock()
        y_train_np = self._labels(train, "train")
        y_val_np = self._labels(val, "val")
        previous_threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            # Leaving the block waits for the write in flight: whatever ends training, the last
            # checkpoint it submitted is stored (or its failure reported) before fit returns.
            with CheckpointWriter(self.store, on_stored=on_checkpoint) as writer:
                return self._fit(train, val, y_train_np, y_val_np, on_epoch, should_stop, clock, started, writer)
        finally:
            torch.set_num_threads(previous_threads)

    def _fit(
        self,
        train: pd.DataFrame,
        val: pd.DataFrame,
        y_train_np: np.ndarray,
        y_val_np: np.ndarray,
        on_epoch: Callable[[int, dict[str, float]], None] | None,
        should_stop: Callable[[], bool] | None,
        clock: Callable[[], float],
        started: float,
        writer: CheckpointWriter,
    ) -> TrainResult:
        spec = self.model_spec
        device = self.device
        ddp = self.distributed
        writes = ddp is None or ddp.is_main  # only rank 0 writes checkpoints
        torch.manual_seed(spec.seed)
        np.random.seed(spec.seed)
        random.seed(spec.seed)

        restored = self.store.latest_valid()
        if restored is not None:
            state, resumed_info = restored
            self._check_compatible(state, resumed_info)
            featurizer = Featurizer.from_dict(state["featurizer"])
        else:
            state, resumed_info = None, None
            featurizer = Featurizer.fit(train, spec.features, dataset="train")

        x_train = torch.from_numpy(featurizer.transform(train, dataset="train"))
        y_train = torch.from_numpy(y_train_np)
        x_val = featurizer.transform(val, dataset="val")
        fingerprint = _fingerprint(x_train, y_train)

        # Its own generators, not torch's global one: a fit beside others in this process (a sweep's
        # trials in threads) draws the same initial weights and dropout masks as it would alone.
        init_generator, dropout_generator = _model_generator(spec.seed, device)
        model = TabularMLP.from_spec(spec, featurizer.n_features, generator=init_generator).to(device)
        model.generator = dropout_generator
        optimizer = torch.optim.Adam(model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay)
        progress = _Progress()
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            progress = _Progress.from_state(state["progress"])
            _restore_rng(state["rng"], device, dropout_generator)  # every rank restores rank 0's states
            if state["train_sha256"] != fingerprint:
                log.warning(
                    "job %s resumes from %s on different training rows than it started with; training "
                    "continues, but the result will not match an uninterrupted run",
                    self.job, resumed_info.key,
                )
            log.info("job %s resumes from %s at step %d", self.job, resumed_info.key, progress.global_step)

        cp = self.checkpoint
        last_info = resumed_info
        saved_position = progress.position() if state is not None else None
        written = 0
        write_seconds = 0.0
        skipped = 0
        told = False
        last_save_time = started
        rate = self.preemptions_per_hour or 0.0
        # Until a write has been timed, the derived interval is its lower bound (write time 0).
        interval_s = (optimal_interval_s(0.0, rate) if cp.auto_interval
                      else cp.interval_minutes * 60 if cp.interval_minutes is not None else None)

        def save() -> None:
            nonlocal saved_position, written, write_seconds, interval_s
            if not writes:
                saved_position = progress.position()
                return
            # What training pays: gathering the state and its in-memory snapshot (plus waiting for
            # the previous write, when it is still going); storing it runs beside training.
            began = time.perf_counter()
            ckpt = {
                "format": STATE_FORMAT,
                "job": self.job,
                "model_spec": spec.model_dump(mode="json"),
                "model_config": model.config(),
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "featurizer": featurizer.to_dict(),
                "progress": progress.to_state(),
                "rng": _capture_rng(device, dropout_generator),
                "train_sha256": fingerprint,
            }
            writer.submit(ckpt, progress.global_step, keep_last=cp.keep_last)
            write_seconds += time.perf_counter() - began
            saved_position = progress.position()
            written += 1
            if cp.auto_interval:
                interval_s = optimal_interval_s(write_seconds / written, rate)

        def too_soon(now: float) -> bool:
            """Whether a step checkpoint now would push the checkpoints' cost over ``max_overhead``.

            One checkpoint's cost to training: the snapshot the step waited for, plus the CPU the
            writer's thread used (on a host whose cores training keeps busy, it comes out of
            training's share). The first is never skipped; one due while the previous write is
            still in flight always is (the step would wait for that write).
            """
            nonlocal skipped, told
            if cp.max_overhead is None or not writes or written == 0:
                return False
            if writer.busy:
                skipped += 1
                return True
            # The writer counts a write once it has ended (the step already called writer.check()).
            cost = write_seconds / written + writer.write_cpu_seconds / max(writer.written, 1)
            gap = cost / cp.max_overhead
            if now - last_save_time >= gap:
                return False
            if not told:
                told = True
                log.info(
                    "job %s: a checkpoint costs training about %.1f ms, so checkpoints every %d steps come at "
                    "least %.2f s apart (checkpoint.max_overhead %.3g; set it to null to checkpoint every %d steps)",
                    self.job, cost * 1000, cp.interval_steps, gap, cp.max_overhead, cp.interval_steps)
            skipped += 1
            return True

        def stored() -> CheckpointInfo | None:
            """The newest stored checkpoint, once the write in flight (if any) is stored."""
            return (writer.wait() or last_info) if writes else None

        n = len(x_train)
        batch = spec.batch_size
        n_batches = math.ceil(n / batch)
        loss_fn = nn.BCEWithLogitsLoss()
        net = model
        if ddp is not None:
            net = ddp.wrap(model)
            # Each rank's loss is its shard's sum scaled by world/len(batch): DDP averages gradients
            # over ranks, which then equals the gradient of the mean loss over the whole batch.
            shard_loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        samples = 0
        while progress.epoch < spec.epochs:
            order = epoch_permutation(n, spec.seed, progress.epoch)
            net.train()
            for b in range(progress.step_in_epoch, n_batches):
                idx = order[b * batch:(b + 1) * batch]
                optimizer.zero_grad(set_to_none=True)
                if ddp is None:
                    xb = x_train[idx].to(device, non_blocking=True)
                    yb = y_train[idx].to(device, non_blocking=True)
                    loss = loss_fn(model(xb), yb)
                    loss.backward()
                    batch_loss_sum = float(loss.item()) * len(idx)
                else:
                    part = ddp.shard(idx)
                    xb = x_train[part].to(device, non_blocking=True)
                    yb = y_train[part].to(device, non_blocking=True)
                    shard_loss = shard_loss_fn(net(xb), yb)
                    (shard_loss * (ddp.world_size / len(idx))).backward()
                    batch_loss_sum = ddp.all_sum(shard_loss)
                optimizer.step()
                if writes:
                    writer.check()  # a background write that failed stops training here
                progress.global_step += 1
                progress.step_in_epoch = b + 1
                progress.epoch_loss_sum += batch_loss_sum
                progress.epoch_samples += len(idx)
                samples += len(idx)

                step_due = cp.interval_steps is not None and progress.global_step % cp.interval_steps == 0
                now = clock() if step_due or interval_s is not None else None
                due = interval_s is not None and now - last_save_time >= interval_s
                if step_due and not due:
                    due = not too_soon(now)
                if due:
                    save()
                    # Any checkpoint restarts the time interval, whichever rule wrote it.
                    last_save_time = now if now is not None else last_save_time
                if should_stop is not None and (ddp.any(should_stop()) if ddp is not None else should_stop()):
                    if saved_position != progress.position():
                        save()
                    info = stored()  # the checkpoint is durable before anyone is told its key
                    key = info.key if info is not None else None
                    log.warning("job %s stopping at step %d on request; checkpoint %s",
                                self.job, progress.global_step, key)
                    raise Preempted(self.job, progress.global_step, key)

            val_metrics = binary_metrics(y_val_np, model_probabilities(model, x_val), dataset="val",
                                         label=self.label)
            metrics = {"train_loss": progress.epoch_loss_sum / max(progress.epoch_samples, 1)}
            metrics.update({f"val_{k}": v for k, v in val_metrics.items()})
            epoch = progress.epoch
            progress.history.append({"epoch": epoch, "global_step": progress.global_step, **metrics})
            value = val_metrics[self.best_metric]
            sign = 1.0 if HIGHER_IS_BETTER[self.best_metric] else -1.0
            if progress.best_value is None or sign * value > sign * progress.best_value:
                progress.best_value, progress.best_epoch = value, epoch
            progress.epoch += 1
            progress.step_in_epoch = 0
            progress.epoch_loss_sum = 0.0
            progress.epoch_samples = 0
            if on_epoch is not None and writes:
                on_epoch(epoch, metrics)

        if saved_position != progress.position():
            save()
        last_info = stored()
        seconds = clock() - started
        model = model.to("cpu").eval()
        model.generator = None  # training's state, not the model's: what callers save or export is plain
        return TrainResult(
            model=model,
            featurizer=featurizer,
            history=[dict(h) for h in progress.history],
            global_step=progress.global_step,
            epochs_completed=progress.epoch,
            resumed_from_step=resumed_info.step if resumed_info is not None else None,
            checkpoints_written=written,
            last_checkpoint=last_info,
            seconds=seconds,
            samples_per_second=samples / seconds if seconds > 0 else 0.0,
            best_epoch=progress.best_epoch,
            best_val_metric=progress.best_value,
            checkpoint_seconds=write_seconds,
            checkpoint_write_seconds=writer.write_seconds,
            checkpoint_interval_s=interval_s,
            checkpoints_skipped=skipped,
        )
