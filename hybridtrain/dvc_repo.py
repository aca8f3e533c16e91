"""DvcRepo: a DVC repository holding versioned datasets, and the remotes (site stores) they move through.

A dataset version is its DVC content hash; the ``.dvc`` pointer (md5, size, nfiles) is enough
to fetch it from any remote that has it, which is how a stage at another site gets its input:
write the pointer into that site's working copy and pull from that site's store. DVC holds a
repository lock with a 3 s timeout, so every operation here is serialized per checkout with a
file lock of our own (waits instead of failing when two stages touch one repo).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml
from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict

from hybridtrain.errors import DataError, Problem, SpecError, TransientError

Tier = Literal["raw", "curated", "approved"]
log = logging.getLogger(__name__)


class DatasetVersion(BaseModel):
    """One content version of a DVC-tracked dataset, at a tier, held by a site's store."""

    model_config = ConfigDict(frozen=True)

    path: str
    md5: str
    size: int
    nfiles: int | None = None
    tier: Tier
    site: str

    @property
    def short(self) -> str:
        return self.md5[:12]

    @property
    def is_dir(self) -> bool:
        return self.md5.endswith(".dir")

    def pointer(self) -> dict[str, Any]:
        out: dict[str, Any] = {"md5": self.md5, "size": self.size, "hash": "md5", "path": Path(self.path).name}
        if self.nfiles is not None:
            out["nfiles"] = self.nfiles
        return {"outs": [out]}

    def pointer_text(self) -> str:
        return yaml.safe_dump(self.pointer(), sort_keys=False)

    def at(self, site: str) -> DatasetVersion:
        """The same content, now also held by ``site``'s store."""
        return self.model_copy(update={"site": site})


class PushResult(BaseModel):
    files: int
    bytes: int
    seconds: float


def _quiet_dvc() -> None:
    # DVC's API prints git hints ("To track the changes with git...") on stdout; we log instead.
    logging.getLogger("dvc").setLevel(logging.WARNING)


class DvcRepo:
    """A DVC checkout: the on-prem workspace, or a site's working copy (``scm=False``)."""

    LOCK_TIMEOUT_S = 900.0

    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()
        if not (self.root / ".dvc").is_dir():
            raise SpecError(
                str(self.root), [Problem(".dvc", "not a DVC repository; run `hybridtrain init` in the workspace")]
            )
        self._lock = FileLock(str(self.root / ".dvc" / "tmp" / "hybridtrain.lock"))

    # -- setup -------------------------------------------------------------------------------

    @classmethod
    def ensure(
        cls,
        root: Path | str,
        remotes: dict[str, str],
        default_remote: str | None = None,
        *,
        scm: bool | None = None,
    ) -> DvcRepo:
        """Initialise DVC in ``root`` if needed and (re)write its remotes in ``.dvc/config.local``.

        Remotes are machine-local (paths, endpoints), so they go to the git-ignored local config;
        the sites catalog is their source of truth. ``scm=None`` uses git when ``root`` is a git repo.
        """
        from dvc.repo import Repo

        _quiet_dvc()
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if not (root / ".dvc").is_dir():
            use_scm = (root / ".git").exists() if scm is None else scm
            Repo.init(str(root), no_scm=not use_scm, force=True)
        (root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
        repo = cls(root)
        with repo._locked():
            r = Repo(str(root))
            try:
                with r.config.edit("repo") as conf:
                    conf.setdefault("core", {})["analytics"] = False
                with r.config.edit("local") as conf:
                    conf["remote"] = {name: {"url": url} for name, url in remotes.items()}
                    if default_remote:
                        conf.setdefault("core", {})["remote"] = default_remote
            finally:
                r.close()
        return repo

    def ignore(self, pattern: str) -> None:
        """Make DVC skip ``pattern`` (gitignore syntax) when collecting pointers, via ``.dvcignore``."""
        path = self.root / ".dvcignore"
        lines = path.read_text().splitlines() if path.exists() else []
        if pattern not in lines:
            with self._locked():
                path.write_text("\n".join([*lines, pattern]) + "\n")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            with self._lock.acquire(timeout=self.LOCK_TIMEOUT_S):
                yield
        except Timeout:
            raise TransientError(
                f"DVC repository {self.root} stayed locked for {self.LOCK_TIMEOUT_S:.0f} s by another stage; "
                "retry when it has finished"
            ) from None

    @contextmanager
    def _repo(self) -> Iterator[Any]:
        from dvc.repo import Repo

        _quiet_dvc()
        with self._locked():
            r = Repo(str(self.root))
            try:
                yield r
            finally:
                r.close()

    # -- versions ----------------------------------------------------------------------------

    def pointer_path(self, path: str) -> Path:
        return self.root / f"{path}.dvc"

    def version(self, path: str, tier: Tier, site: str) -> DatasetVersion | None:
        """The version recorded in ``path.dvc``, or None if the path is not tracked."""
        ptr = self.pointer_path(path)
        if not ptr.is_file():
            return None
        data = yaml.safe_load(ptr.read_text())
        out = data["outs"][0]
        return DatasetVersion(
            path=path, md5=out["md5"], size=int(out.get("size", 0)), nfiles=out.get("nfiles"), tier=tier, site=site
        )

    def add(self, path: str, tier: Tier, site: str) -> DatasetVersion:
        """Track ``path`` (file or directory) and return its new version."""
        target = self.root / path
        if not target.exists():
            raise DataError(path, [Problem(path, "nothing to track: the file or directory does not exist")])
        with self._repo() as r:
            stages = r.add(str(target))
        out = stages[0].outs[0]
        return DatasetVersion(
            path=path,
            md5=out.hash_info.value,
            size=int(out.meta.size or 0),
            nfiles=out.meta.nfiles,
            tier=tier,
            site=site,
        )

    def is_present(self, version: DatasetVersion) -> bool:
        """True when the workspace holds exactly ``version`` (pointer matches and data unchanged)."""
        current = self.version(version.path, version.tier, version.site)
        if current is None or current.md5 != version.md5 or not (self.root / version.path).exists():
            return False
        with self._repo() as r:
            status = r.status(targets=[str(self.pointer_path(version.path))])
        return not status

    def checkout(self, version: DatasetVersion, remote: str | None = None) -> Path:
        """Make the workspace hold ``version``: write its pointer, then checkout from cache or pull."""
        ptr = self.pointer_path(version.path)
        current = self.version(version.path, version.tier, version.site)
        if current is None or current.md5 != version.md5:
            ptr.parent.mkdir(parents=True, exist_ok=True)
            tmp = ptr.with_name(ptr.name + ".tmp")
            tmp.write_text(version.pointer_text())
            os.replace(tmp, ptr)
        elif self.is_present(version):
            return self.root / version.path
        with self._repo() as r:
            try:
                r.pull(targets=[str(ptr)], remote=remote, force=True)
            except Exception as exc:  # dvc raises several unrelated types for "not found"
                raise DataError(
                    version.path,
                    [Problem(version.path, f"version {version.md5} could not be fetched from remote "
                                           f"{remote or '(default)'}: {exc}. Push it there first "
                                           "(hybridtrain data add) or pin a version that exists.")],
                ) from None
        return self.root / version.path

    def missing_on(self, version: DatasetVersion, remote: str) -> tuple[int, int]:
        """Files and bytes of ``version`` that ``remote`` does not have yet (what a push would move)."""
        if not self.is_present(version):
            self.checkout(version)
        with self._repo() as r:
            status = r.status(targets=[str(self.pointer_path(version.path))], cloud=True, remote=remote)
            files, size = 0, 0
            for rel, state in status.items():
                if state not in ("new", "missing"):
                    continue
                files += 1
                p = Path(rel) if Path(rel).is_absolute() else self.root / rel
                if p.is_file():
                    size += p.stat().st_size
                elif rel.rstrip("/") == version.path and version.is_dir:
                    # The .dir manifest object itself.
                    manifest = self._cache_object(r, version.md5)
                    size += manifest.stat().st_size if manifest.is_file() else 0
        return files, size

    def push(self, version: DatasetVersion, remote: str) -> PushResult:
        """Upload what ``remote`` lacks of ``version``; content addressing skips unchanged files."""
        files, size = self.missing_on(version, remote)
        started = time.perf_counter()
        if files:
            with self._repo() as r:
                r.push(targets=[str(self.pointer_path(version.path))], remote=remote)
        return PushResult(files=files, bytes=size, seconds=time.perf_counter() - started)

    def pull_pointer(self, version: DatasetVersion, remote: str) -> Path:
        """Fetch ``version`` from ``remote`` into this checkout by its pointer alone."""
        return self.checkout(version, remote=remote)

    def remote_url(self, version: DatasetVersion, remote: str) -> str:
        """Where ``version``'s object lives on ``remote`` (the source recorded in MLflow lineage)."""
        with self._repo() as r:
            conf = r.config["remote"].get(remote)
        if conf is None:
            raise SpecError(str(self.root), [Problem("remote", f"DVC remote {remote!r} is not configured")])
        base = str(conf["url"]).rstrip("/")
        return f"{base}/files/md5/{version.md5[:2]}/{version.md5[2:]}"

    @staticmethod
    def _cache_object(r: Any, md5: str) -> Path:
        return Path(r.cache.local.oid_to_path(md5))
