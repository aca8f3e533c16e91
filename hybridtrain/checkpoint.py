"""CheckpointStore: a training run's checkpoints in an object store, each one verified by a SHA-256 manifest.

Layout under the run's prefix (e.g. ``checkpoints/churn/<run_id>/``)::

    ckpt-000000000200-000.pt     torch.save bytes of the state dict
    ckpt-000000000200-000.json   manifest: step, revision, sha256, size, created

The data object is written first and the manifest second, each atomically by the object store,
so a crash in between leaves data without a manifest — which is ignored. A checkpoint counts
only when both objects exist and the data's SHA-256 matches the manifest; ``latest_valid()``
walks from the newest down, skipping (with a warning naming the key) any that fails.

The revision number lets two checkpoints share a step (say, one written by the step interval
and one after that epoch's validation) without overwriting each other: newest means highest
(step, revision).

States must be "weights-only" compatible — tensors, dicts, lists, tuples, strings, numbers,
bools and None — because they are read with ``torch.load(..., weights_only=True)``, which
refuses arbitrary pickled objects even if someone else wrote into the store.

Example: saves at steps 100, 200, 300 with ``keep_last=2`` → 100 is deleted once 300 is
stored. The job is preempted while writing 400 (data stored, no manifest): that object is
ignored and the run resumes from 300. Its next save of step 400 takes revision 001, and
retention then deletes the orphaned revision 000 because it is older than the new checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import re
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import torch

from hybridtrain.errors import ChecksumMismatch
from hybridtrain.object_store import ObjectStore

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
_NAME_RE = re.compile(r"^ckpt-(?P<step>[0-9]{12})-(?P<rev>[0-9]{3,})\.(?P<ext>pt|json)$")


@dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint: where its data lives and what its bytes must hash to."""

    key: str
    manifest_key: str
    uri: str
    step: int
    revision: int
    sha256: str
    size: int
    created: datetime

    @property
    def order(self) -> tuple[int, int]:
        """Sort key: newer checkpoints compare greater."""
        return (self.step, self.revision)


class CheckpointStore:
    """The checkpoints of one run: every object under ``prefix`` in ``store``."""

    def __init__(self, store: ObjectStore, prefix: str, *, keep_last: int = 3):
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        prefix = prefix.strip("/")
        if not prefix:
            raise ValueError("give a key prefix for the run, e.g. 'checkpoints/<job>/<run_id>'")
        self.store = store
        self.prefix = prefix + "/"
        self.keep_last = keep_last

    @classmethod
    def for_run(cls, store: ObjectStore, job: str, run_id: str, *, keep_last: int = 3) -> CheckpointStore:
        """The conventional location ``checkpoints/<job>/<run_id>/``."""
        return cls(store, f"checkpoints/{job}/{run_id}", keep_last=keep_last)

    def _key(self, step: int, revision: int, ext: str) -> str:
        return f"{self.prefix}ckpt-{step:012d}-{revision:03d}.{ext}"

    def _scan(self) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], str]]:
        """Data keys and manifest keys under the prefix, by (step, revision)."""
        data: dict[tuple[int, int], str] = {}
        manifests: dict[tuple[int, int], str] = {}
        for obj in self.store.list(self.prefix):
            m = _NAME_RE.match(obj.key[len(self.prefix):])
            if not m:
                continue
            order = (int(m["step"]), int(m["rev"]))
            (data if m["ext"] == "pt" else manifests)[order] = obj.key
        return data, manifests

    def _read_manifest(self, key: str, order: tuple[int, int]) -> CheckpointInfo | None:
        try:
            raw = json.loads(self.store.get_bytes(key))
            if raw.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown manifest format {raw.get('format')!r}")
            data_key = self._key(order[0], order[1], "pt")
            if raw["step"] != order[0] or raw["revision"] != order[1] or raw["key"] != data_key:
                raise ValueError("manifest does not describe the object next to it")
            return CheckpointInfo(
                key=data_key,
                manifest_key=key,
                uri=f"{self.store.url.rstrip('/')}/{data_key}",
                step=int(raw["step"]),
                revision=int(raw["revision"]),
                sha256=str(raw["sha256"]),
                size=int(raw["size"]),
                created=datetime.fromisoformat(raw["created"]),
            )
        except FileNotFoundError:
            return None  # deleted between listing and reading (retention of another process)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring checkpoint manifest %s: it cannot be read (%s)", key, exc)
            return None

    def list(self) -> list[CheckpointInfo]:
        """Checkpoints whose data and manifest both exist, oldest first. Checksums are not read here."""
        data, manifests = self._scan()
        out = []
        for order in sorted(manifests.keys() & data.keys()):
            info = self._read_manifest(manifests[order], order)
            if info is not None:
                out.append(info)
        return out

    def save(self, state: dict[str, Any], step: int, *, keep_last: int | None = None) -> CheckpointInfo:
        """Store ``state`` as the checkpoint for ``step``, then apply keep-last-N retention.

        The state is serialized with ``torch.save`` and must be weights-only compatible
        (tensors, containers, strings, numbers, None); anything else is refused here rather
        than at resume time. Returns the new checkpoint's info.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        keep = self.keep_last if keep_last is None else keep_last
        if keep < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep}")
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        # Checking now turns a bad state into an error at the save that caused it, not a
        # checkpoint that every future resume skips.
        try:
            torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise TypeError(
                "checkpoint state must hold only tensors, dicts, lists, tuples, strings, numbers and None "
                f"(torch weights_only): {exc}"
            ) from exc
        data, manifests = self._scan()
        revision = 1 + max((rev for s, rev in data.keys() | manifests.keys() if s == step), default=-1)
        sha = hashlib.sha256(blob).hexdigest()
        data_key = self._key(step, revision, "pt")
        manifest_key = self._key(step, revision, "json")
        created = datetime.now(UTC)
        self.store.put_bytes(data_key, blob)
        manifest = {
            "format": MANIFEST_FORMAT,
            "key": data_key,
            "step": step,
            "revision": revision,
            "sha256": sha,
            "size": len(blob),
            "created": created.isoformat(),
        }
        # The manifest goes second: its presence is what makes the checkpoint count.
        self.store.put_bytes(manifest_key, json.dumps(manifest, indent=1).encode())
        info = CheckpointInfo(
            key=data_key,
            manifest_key=manifest_key,
            uri=f"{self.store.url.rstrip('/')}/{data_key}",
            step=step,
            revision=revision,
            sha256=sha,
            size=len(blob),
            created=created,
        )
        self._retain(info, keep)
        return info

    def _retain(self, saved: CheckpointInfo, keep: int) -> None:
        """Delete all but the newest ``keep`` checkpoints (``saved`` always stays), and leftovers
        of interrupted saves older than ``saved``."""
        others = [c for c in self.list() if c.order != saved.order]
        doomed = others[: max(0, len(others) - (keep - 1))]
        for c in doomed:
            # Manifest first: a crash mid-delete leaves data without a manifest, which is ignored.
            self.store.delete(c.manifest_key)
            self.store.delete(c.key)
        data, manifests = self._scan()
        for order in data.keys() ^ manifests.keys():
            if order < saved.order:
                self.store.delete(data.get(order) or manifests[order])

    def _load(self, info: CheckpointInfo) -> dict[str, Any] | None:
        """The verified state, or None (with a warning naming the key) when it is unusable."""
        try:
            blob = self.store.get_bytes(info.key)
        except FileNotFoundError:
            log.warning("skipping checkpoint %s: its data object disappeared", info.key)
            return None
        except ChecksumMismatch as exc:  # a store that verifies on read (S3) found it corrupt
            log.warning("skipping checkpoint %s: %s", info.key, exc)
            return None
        actual = hashlib.sha256(blob).hexdigest()
        if actual != info.sha256 or len(blob) != info.size:
            log.warning(
                "skipping checkpoint %s: SHA-256 %s (%d bytes) does not match its manifest %s (%d bytes); "
                "the object is corrupt or partial",
                info.key, actual, len(blob), info.sha256, info.size,
            )
            return None
        try:
            # weights_only=True: a checkpoint is data, never code, whoever wrote the bytes.
            state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as exc:
            log.warning("skipping checkpoint %s: checksum matches but it does not load (%s)", info.key, exc)
            return None
        if not isinstance(state, dict):
            log.warning("skipping checkpoint %s: it holds a %s, not a state dict", info.key, type(state).__name__)
            return None
        return state

    def latest_valid(self) -> tuple[dict[str, Any], CheckpointInfo] | None:
        """The newest checkpoint that verifies and loads, with its info; None when there is none."""
        for info in reversed(self.list()):
            state = self._load(info)
            if state is not None:
                return state, info
        return None
