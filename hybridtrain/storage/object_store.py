"""ObjectStore: a site's blob storage — keys to bytes — where an object is visible only when complete.

One interface serves checkpoints, bundles and artifacts. ``LocalObjectStore`` is a directory
(the embedded default and on-prem NFS); ``S3ObjectStore`` (``hybridtrain.storage.s3``) speaks to
any S3 endpoint; ``open_store`` picks the one a site's store config describes.
Writers never expose a partial object: local writes go to a temporary file in the same
directory and are renamed into place; S3 uploads become visible only when completed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hybridtrain.specs.sites import LocalStore, S3Store

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

    def put_file(self, key: str, path: Path) -> ObjectInfo: ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_file(self, key: str, dest: Path) -> Path: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> list[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object key {key!r}: use a relative path like 'a/b/c'")
    if any(p.startswith(TMP_PREFIX) for p in parts):
        raise ValueError(f"invalid object key {key!r}: names starting with {TMP_PREFIX!r} are reserved")
    return key


class LocalObjectStore:
    """A directory as an object store. Atomic puts: temp file + fsync + rename."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _info(self, key: str, path: Path) -> ObjectInfo:
        st = path.stat()
        return ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def _atomic_write(self, target: Path, write) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        target = self._path(key)
        self._atomic_write(target, lambda fh: fh.write(data))
        return self._info(key, target)

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        target = self._path(key)
        with open(path, "rb") as src:
            self._atomic_write(target, lambda fh: shutil.copyfileobj(src, fh, 1 << 20))
        return self._info(key, target)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.url}")
        return path.read_bytes()

    def get_file(self, key: str, dest: Path) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.url}")
        dest = Path(dest)
        with open(path, "rb") as src:
            self._atomic_write(dest, lambda fh: shutil.copyfileobj(src, fh, 1 << 20))
        return dest

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.rglob("*"):
            if not path.is_file() or any(p.startswith(TMP_PREFIX) for p in path.parts):
                continue
            key = path.relative_to(self.root).as_posix()
            if key.startswith(prefix):
                try:
                    out.append(self._info(key, path))
                except FileNotFoundError:
                    continue  # deleted since the directory was read (a writer pruning old checkpoints)
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def open_store(
    store: LocalStore | S3Store, root: Path, subdir: str = "", *, site: str | None = None
) -> ObjectStore:
    """The ObjectStore a site's ``store`` config describes, under ``subdir``.

    A ``LocalStore`` path is relative to ``root`` (the workspace) unless absolute; an ``S3Store``
    opens an ``S3ObjectStore`` on its bucket and prefix (boto3 is imported only then). ``site``
    names the site in errors.
    """
    from hybridtrain.specs.sites import S3Store

    if isinstance(store, S3Store):
        from hybridtrain.storage.s3 import S3ObjectStore

        return S3ObjectStore(store, subdir, site=site)
    base = Path(store.path)
    base = base if base.is_absolute() else (Path(root) / base).resolve()
    return LocalObjectStore(base / subdir if subdir else base)
