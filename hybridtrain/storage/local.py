"""LocalObjectStore: a directory as a site's object store — atomic puts, verified listing."""


from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from hybridtrain.storage.object_store import TMP_PREFIX, ObjectInfo, check_key


class LocalObjectStore:
    """A directory as an object store. Atomic puts: temp file + fsync + rename."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

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

    def create(self, key: str, data: bytes) -> bool:
        """Write-if-absent: the complete temp file is hard-linked into place (``link`` fails if the name exists)."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, target)
            return True
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)

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
