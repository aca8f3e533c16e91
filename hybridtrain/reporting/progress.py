"""Progress: what a lifecycle stage reports while it runs, as records on one logger that any front end shows.

Stages and the trainer call ``report`` (or wrap their body in ``stage``); they never know who is
watching. Each call is one ``logging`` record on the ``hybridtrain.progress`` logger carrying a
``ProgressEvent`` (``record.progress``), so the same events reach whatever is bound to that logger:
the Prefect run log and a progress artifact (``orchestration.progress``), the CLI's progress bars or plain
lines (``hybridtrain.cli.progress``), or nothing at all. An example sequence for one run::

    preprocess started at onprem-dc1
    preprocess finished at onprem-dc1 in 1.2 s: 6,000 rows in, 5,941 curated
    placement: cloud-eu (on_demand), est. $0.42, finish 14:05 UTC; pinned to cloud-eu by the spec
    sync started: onprem-dc1 -> cloud-eu
    sync finished: 1,204,113 bytes in 12 files, onprem-dc1 -> cloud-eu in 0.8 s (1.4 MiB/s)
    train epoch 1/4: loss 0.5512, val_auc 0.7710, 8,120 rows/s
    train checkpoint at step 40 written (31,200 bytes)
    evaluate verdict: better than champion v1 (auc +0.0120); thresholds met
    promote gates: 6 passed, 0 failed; champion -> v2
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: The logger every progress record goes to.
LOGGER = "hybridtrain.progress"

#: Stages with a measurable fraction done (a progress bar / progress artifact each).
MEASURED = ("sync", "train")


@dataclass(frozen=True)
class ProgressEvent:
    """One thing a stage reports: ``kind`` is start, end, failed, step (with ``done`` of ``total``),
    checkpoint, decision or verdict; ``fields`` are the numbers behind the message."""

    stage: str
    kind: str
    message: str
    done: float | None = None
    total: float | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        """Share done in [0, 1] when the event measures it, else None."""
        if self.done is None or not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))


def report(stage: str, kind: str, message: str, *, done: float | None = None, total: float | None = None,
           level: int = logging.INFO, **fields: Any) -> ProgressEvent:
    """Emit one progress event (a record on ``LOGGER`` whose ``progress`` attribute is the event)."""
    event = ProgressEvent(stage=stage, kind=kind, message=message, done=done, total=total, fields=fields)
    logging.getLogger(LOGGER).log(level, message, extra={"progress": event})
    return event


def event_of(record: logging.LogRecord) -> ProgressEvent | None:
    """The event a record carries, None for any other record."""
    event = getattr(record, "progress", None)
    return event if isinstance(event, ProgressEvent) else None


class StageProgress:
    """The running stage inside ``stage(...)``: set ``detail`` to say what it produced in its end line."""

    def __init__(self, name: str, site: str):
        self.name = name
        self.site = site
        self.detail = ""
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


@contextmanager
def stage(name: str, site: str, detail: str = "") -> Iterator[StageProgress]:
    """Report the start and end (or failure) of stage ``name`` at ``site``, with its duration."""
    running = StageProgress(name, site)
    report(name, "start", f"{name} started at {site}" + (f": {detail}" if detail else ""), site=site)
    try:
        yield running
    except BaseException as exc:
        report(name, "failed", f"{name} at {site} stopped after {running.seconds:.1f} s: {type(exc).__name__}: "
                               f"{exc}", level=logging.WARNING, site=site, seconds=running.seconds)
        raise
    report(name, "end", f"{name} finished at {site} in {running.seconds:.1f} s"
                        + (f": {running.detail}" if running.detail else ""), site=site, seconds=running.seconds)


def rate(nbytes: float, seconds: float) -> str:
    """A transfer rate as people read it: ``1.4 MiB/s``."""
    per_s = nbytes / seconds if seconds > 0 else 0.0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if per_s < 1024 or unit == "GiB":
            return f"{per_s:,.1f} {unit}/s"
        per_s /= 1024
    return f"{per_s:,.1f} GiB/s"  # pragma: no cover - the loop returns


def human_bytes(nbytes: float) -> str:
    """A byte count as people read it: ``4.2 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:,.0f} {unit}" if unit == "B" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:,.1f} GiB"  # pragma: no cover - the loop returns


class TransferProgress:
    """Reports a transfer's bytes as they move (``sync`` step events): an event per ``step`` of the whole
    (a quarter) or per ``every_s`` seconds (10), and always the last one (all files stored); few enough
    lines for a run log, while the progress artifact and the CLI bar follow every event. Feed it
    ``update(files done, files, bytes done, bytes)`` — the shape of ``DvcRepo.push``'s
    ``on_progress`` — and it reports ``sync 1.2 MiB of 4.8 MiB (3/12 files) ... 1.4 MiB/s``."""

    def __init__(self, stage: str, source: str, destination: str, step: float = 0.25, every_s: float = 10.0,
                 clock: Any = time.perf_counter):
        self.stage, self.source, self.destination = stage, source, destination
        self.step, self.every_s, self.clock = step, every_s, clock
        self.started = clock()
        self.last_at = self.started
        self.last_fraction = -1.0
        self.finished = False

    def update(self, files_done: int, files: int, bytes_done: int, total: int) -> None:
        if not files and not total:  # nothing to move: the end line says so
            return
        fraction = bytes_done / total if total else files_done / files
        now = self.clock()
        if files_done >= files and bytes_done >= total:  # all there: reported once
            if self.finished:
                return
            self.finished = True
        elif fraction >= 1.0 or fraction <= self.last_fraction or (
                fraction - self.last_fraction < self.step and now - self.last_at < self.every_s):
            return  # the last file's bytes are in but it is not stored yet, nothing new, or too soon
        self.last_fraction, self.last_at = fraction, now
        report(self.stage, "step", f"{self.stage} {human_bytes(bytes_done)} of {human_bytes(total)} ({files_done}/{files} files), "
                                   f"{self.source} -> {self.destination}, {rate(bytes_done, now - self.started)}",
               done=bytes_done if total else fraction, total=total or 1.0, site=self.source,
               destination=self.destination, bytes=bytes_done, files=files_done)


#: A host's epoch line (``hybridtrain.remote.host_training``): ``hybridtrain: epoch 2/4 train_loss=0.5 val_auc=0.7``.
HOST_EPOCH = re.compile(r"epoch (\d+)/(\d+)((?: [A-Za-z_]+=\S+)*)\s*$")
#: A host's checkpoint line: ``hybridtrain: checkpoint step 40 written (31200 bytes)``.
HOST_CHECKPOINT = re.compile(r"checkpoint step (\d+) written \((\d+) bytes\)\s*$")


class TrainingProgress:
    """Reports one training's epochs (loss, validation metric, throughput) and checkpoints.

    ``rows`` is the number of training rows (an epoch's samples), from which throughput is the
    rows of an epoch over the time since the previous report. Works the same for training in
    this process (fed by the trainer's callbacks) and on an SSH host (fed by its log lines).
    """

    def __init__(self, site: str, epochs: int, rows: int | None = None, metric: str = "val_auc",
                 clock: Any = time.perf_counter):
        self.site = site
        self.epochs = epochs
        self.rows = rows
        self.metric = metric
        self.clock = clock
        self.last = clock()
        self.epochs_seen: set[int] = set()

    def start(self, detail: str = "") -> None:
        self.last = self.clock()
        report("train", "start", f"train started at {self.site}: {self.epochs} epochs"
                                 + (f", {self.rows:,} rows" if self.rows else "") + (f"; {detail}" if detail else ""),
               done=0, total=self.epochs, site=self.site)

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        """Epoch ``epoch`` (0-based) ended with ``metrics`` (``train_loss``, ``val_<metric>`` ...)."""
        now = self.clock()
        seconds, self.last = now - self.last, now
        self.epochs_seen.add(epoch)
        throughput = (self.rows / seconds) if self.rows and seconds > 0 else None
        val = metrics.get(self.metric)
        report("train", "step",
               f"train epoch {epoch + 1}/{self.epochs} at {self.site}: loss {metrics.get('train_loss', float('nan')):.4f}"
               + (f", {self.metric} {val:.4f}" if val is not None else "")
               + (f", {throughput:,.0f} rows/s" if throughput else ""),
               done=epoch + 1, total=self.epochs, site=self.site, epoch=epoch, rows_per_second=throughput,
               **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def checkpoint(self, step: int, size: int, key: str = "") -> None:
        report("train", "checkpoint", f"train checkpoint at step {step} written at {self.site} ({size:,} bytes)"
                                      + (f": {key}" if key else ""), site=self.site, step=step, bytes=size)

    def end(self, steps: int, seconds: float, samples_per_second: float, resumed_from: int | None) -> None:
        report("train", "end", f"train finished at {self.site} in {seconds:.1f} s: {steps} steps, "
                               f"{samples_per_second:,.0f} samples/s"
                               + (f", resumed from step {resumed_from}" if resumed_from is not None else ""),
               done=self.epochs, total=self.epochs, site=self.site, seconds=seconds)

    def host_line(self, line: str) -> tuple[int, dict[str, float]] | None:
        """Report a host's epoch or checkpoint line; the epoch (0-based) and its metrics for an epoch
        line, None for any other line (checkpoint lines are reported and also give None)."""
        m = HOST_CHECKPOINT.search(line)
        if m:
            self.checkpoint(int(m.group(1)), int(m.group(2)))
            return None
        m = HOST_EPOCH.search(line)
        if not m:
            return None
        metrics = {}
        for pair in m.group(3).split():
            k, _, v = pair.partition("=")
            try:
                metrics[k] = float(v)
            except ValueError:
                continue
        epoch = int(m.group(1)) - 1
        self.epoch(epoch, metrics)
        return epoch, metrics
