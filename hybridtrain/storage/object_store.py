"""ObjectStore: a site's blob storage — keys to bytes — where an object is visible only when complete.

One interface serves checkpoints, bundles and artifacts. ``LocalObjectStore`` is a directory
(the embedded default and on-prem NFS); ``S3ObjectStore`` (``hybridtrain.storage.s3``) speaks to
any S3 endpoint; ``open_store`` picks the one a site's store config describes.
Writers never expose a partial object: local writes go to a temporary file in the same
directory and are renamed into place; S3 uploads become visible only when completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    pass

TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime


@runtime_checkable
class ObjectStore(Protocol):
    """Blob storage of one site. Keys are ``/``-separated relative paths."""

    @property
    def url(self) -> str: ...

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...

    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` only if no object has ``key``, atomically (two writers: one wins); False when one
        exists (nothing written). A retried create that won may answer False: compare the bytes to tell."""
        ...

    def put_file(self, key: str, path: Path) -> ObjectInfo: ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_file(self, key: str, dest: Path) -> Path: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> list[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...


def check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object key {key!r}: use a relative path like 'a/b/c'")
    if any(p.startswith(TMP_PREFIX) for p in parts):
        raise ValueError(f"invalid object key {key!r}: names starting with {TMP_PREFIX!r} are reserved")
    return key
