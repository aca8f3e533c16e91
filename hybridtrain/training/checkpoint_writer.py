"""CheckpointWriter: stores checkpoints in a background thread, so training waits only for an in-memory snapshot.

``submit(state, step)`` copies the state to CPU memory (every tensor copied, every container
rebuilt: training may change the originals the moment ``submit`` returns; from the second
checkpoint on into the previous snapshot's buffers, whose write has ended) and hands the copy
to one writer thread, which calls ``CheckpointStore.save`` — serialization, the SHA-256
manifest, the two atomic object writes and retention, exactly as a synchronous save does. So
a checkpoint becomes visible only when its data and its manifest are both stored, whether the
process finishes, is preempted or is killed half-way through a write (a killed write leaves at
most data without a manifest, which readers ignore).

At most one write is in flight. A ``submit`` while the previous write is still going **waits**
for it, then snapshots: no requested checkpoint is dropped, at most one snapshot and its bytes
are held in memory, and a checkpoint interval shorter than a write slows training to the write
rate instead of queueing copies without bound.

Errors: a write that fails (store down, disk full, a state that is not weights-only) is
raised by the next call into the writer — ``check()``, which the trainer makes after every
step, ``submit`` or ``wait`` — as the store's own exception, so a ``TransientError`` stays
retryable. ``wait()`` blocks until the in-flight write is stored and returns the newest stored
checkpoint; preemption and the end of training call it, so the last checkpoint is durable before
the process reports it. Leaving the ``with`` block waits too; when an error is already on its
way out, a writer failure is logged instead of hiding it.

Example: interval 30 s, a 100 MB model. At t=30 s the step pauses ~40 ms for the copy; the
thread serializes, hashes and writes for ~1 s beside training. At t=47 s the spot notice
arrives: the trainer snapshots the state after the current step, ``wait()`` returns once it is
stored, and ``Preempted`` names that checkpoint.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self

import torch

from hybridtrain.training.checkpoint import CheckpointInfo, CheckpointStore

log = logging.getLogger(__name__)


def snapshot(state: Any, into: Any = None) -> Any:
    """A copy of ``state`` that shares no mutable object with it: tensors cloned to the CPU, containers rebuilt.

    ``into``: an earlier snapshot nobody reads any more. Its CPU tensors of the same shape, dtype
    and layout are overwritten in place (``copy_``) instead of allocated anew: a large state then
    costs the step one memory copy, not an allocation whose every page faults on first touch.
    """
    if isinstance(state, torch.Tensor):
        src = state.detach()
        if (isinstance(into, torch.Tensor) and into.device.type == "cpu" and into.shape == src.shape
                and into.dtype == src.dtype and into.layout == src.layout == torch.strided
                and into.is_contiguous() and type(into) is torch.Tensor and not src.is_quantized):
            return into.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(state, dict):
        spare = into if isinstance(into, dict) else {}
        return type(state)((k, snapshot(v, spare.get(k))) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        spare = into if isinstance(into, (list, tuple)) and len(into) == len(state) else [None] * len(state)
        items = [snapshot(v, o) for v, o in zip(state, spare, strict=True)]
        return items if isinstance(state, list) else tuple(items)
    if isinstance(state, (str, int, float, bool, type(None))):
        return state
    return copy.deepcopy(state)


class CheckpointWriter:
    """One run's background checkpoint writes into ``store`` (use as a context manager)."""

    def __init__(self, store: CheckpointStore,
                 on_stored: Callable[[CheckpointInfo], None] | None = None):
        self.store = store
        #: Called on the caller's (training) thread with each checkpoint once it is stored.
        self.on_stored = on_stored
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future[CheckpointInfo] | None = None
        self.last: CheckpointInfo | None = None
        #: Checkpoints stored so far, and the seconds the thread spent storing them.
        self.written = 0
        self.write_seconds = 0.0
        #: CPU seconds the writer's thread used storing them (on a busy host, taken from training's threads).
        self.write_cpu_seconds = 0.0
        #: Seconds callers spent blocked in ``submit`` (snapshot + waiting for the previous write).
        self.blocked_seconds = 0.0
        #: The last snapshot handed to the writer; once its write has ended, the next snapshot reuses its tensors.
        self._spare: Any = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self.wait()
            elif self._pending is not None:
                failure = self._pending.exception()  # blocks until the write ends
                self._pending = None
                if failure is not None:
                    log.warning("checkpoint write failed while training was already stopping on %s: %s",
                                type(exc).__name__, failure)
        finally:
            self._pool.shutdown(wait=True)

    def _store(self, state: dict[str, Any], step: int, keep_last: int | None) -> CheckpointInfo:
        began, cpu = time.perf_counter(), time.thread_time()
        info = self.store.save(state, step, keep_last=keep_last)
        self.write_seconds += time.perf_counter() - began
        self.write_cpu_seconds += time.thread_time() - cpu
        self.written += 1
        return info

    def _collect(self, block: bool) -> None:
        """Take the in-flight write's outcome when it has ended (or wait for it with ``block``)."""
        pending = self._pending
        if pending is None or not (block or pending.done()):
            return
        self._pending = None
        self.last = pending.result()  # raises the writer's error here, on the training thread
        if self.on_stored is not None:
            self.on_stored(self.last)

    @property
    def busy(self) -> bool:
        """Whether a write is still in flight (a ``submit`` now would wait for it)."""
        return self._pending is not None and not self._pending.done()

    def check(self) -> None:
        """Raise the error of a write that failed since the last call; cheap enough for every step."""
        if self._pending is not None and self._pending.done():
            self._collect(block=False)

    def submit(self, state: dict[str, Any], step: int, *, keep_last: int | None = None) -> None:
        """Snapshot ``state`` now and store it as the checkpoint for ``step`` in the background.

        Waits first for a write still in flight (raising its error, if it failed).
        """
        began = time.perf_counter()
        self._collect(block=True)  # the previous write has ended: its snapshot is free to overwrite
        copied = snapshot(state, self._spare)
        self._spare = copied
        self._pending = self._pool.submit(self._store, copied, step, keep_last)
        self.blocked_seconds += time.perf_counter() - began

    def wait(self) -> CheckpointInfo | None:
        """Block until no write is in flight; the newest stored checkpoint (None: none yet). Raises a failed write's error."""
        self._collect(block=True)
        return self.last
