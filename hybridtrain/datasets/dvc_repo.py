"""DvcRepo: a DVC repository holding versioned datasets, and the remotes (site stores) they move through.

A dataset version is its DVC content hash; the ``.dvc`` pointer (md5, size, nfiles) is enough
to fetch it from any remote that has it, which is how a stage at another site gets its input:
write the pointer into that site's working copy and pull from that site's store. DVC holds a
repository lock with a 3 s timeout, so every operation here is serialized per checkout with a
file lock of our own (waits instead of failing when two stages touch one repo).

Remotes are given as a URL or as a dvc remote section (``{"url": "s3://bucket/dvc",
"endpointurl": ..., "region": ...}``) and written to the git-ignored ``.dvc/config.local``.
Credentials are kept apart: ``secrets`` (per remote, e.g. ``access_key_id``,
``secret_access_key``) live only in this object's memory and are merged into DVC's config on
every operation (``Repo(root, config=...)``); they are never written to a file.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml
from filelock import FileLock, Timeout
from fsspec.callbacks import Callback
from pydantic import BaseModel, ConfigDict

from hybridtrain.errors import DataError, Problem, SiteUnavailable, SpecError, TransientError
from hybridtrain.specs.schema_bounds import bound_numbers

Tier = Literal["raw", "curated", "approved"]
#: A remote as its URL, or as a dvc remote section without secrets.
RemoteConfig = str | Mapping[str, str]
#: Remote options that are credentials: accepted only through ``secrets``, never written.
SECRET_OPTIONS = frozenset({"access_key_id", "secret_access_key", "session_token", "password", "key_secret",
                            "gdrive_client_secret", "account_key", "sas_token", "client_secret"})
#: Told how a push is going: ``(files done, files to move, bytes done, bytes to move)``.
PushProgress = Callable[[int, int, int, int], None]
log = logging.getLogger(__name__)


class DatasetVersion(BaseModel):
    """One content version of a DVC-tracked dataset, at a tier, held by a site's store."""

    model_config = ConfigDict(frozen=True, json_schema_extra=bound_numbers)  # a stage's form: see specs.schema_bounds

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


def _init_lock(root: Path) -> FileLock:
    """A lock for creating the DVC repository at ``root`` (before it has a .dvc of its own)."""
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(root).encode()).hexdigest()[:16]
    return FileLock(str(Path(tempfile.gettempdir()) / f"hybridtrain-dvc-init-{digest}.lock"), timeout=300)


class DvcRepo:
    """A DVC checkout: the on-prem workspace, or a site's working copy (``scm=False``)."""

    LOCK_TIMEOUT_S = 900.0

    def __init__(self, root: Path | str, *, secrets: Mapping[str, Mapping[str, str]] | None = None):
        self.root = Path(root).resolve()
        # remote name -> credential options, merged into DVC's config in memory only.
        self._secrets = {name: dict(opts) for name, opts in (secrets or {}).items() if opts}
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
        remotes: Mapping[str, RemoteConfig],
        default_remote: str | None = None,
        *,
        scm: bool | None = None,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> DvcRepo:
        """Initialise DVC in ``root`` if needed and (re)write its remotes in ``.dvc/config.local``.

        Remotes are machine-local (paths, endpoints), so they go to the git-ignored local config;
        the sites catalog is their source of truth. ``secrets`` maps a remote to its credentials,
        which the returned object holds in memory only. ``scm=None`` uses git when ``root`` is a git repo.
        """
        from dvc.repo import Repo  # lazy: heavy (dvc)

        _quiet_dvc()
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        # Runs that first use a site's working copy at the same moment would each init it: a forced
        # init removes the .dvc another has just made, and a run that finds .dvc half-made opens it
        # without its settings (seen under load: "Directory not empty", "unable to open database
        # file", "not a git repository"). The repo's own lock lives in .dvc, so this one is
        # host-wide, keyed by the path, and held by every run until the init is complete.
        with _init_lock(root):
            if not (root / ".dvc").is_dir():
                use_scm = (root / ".git").exists() if scm is None else scm
                Repo.init(str(root), no_scm=not use_scm, force=True)
            (root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
        sections = {name: _remote_section(name, conf) for name, conf in remotes.items()}
        repo = cls(root, secrets={name: opts for name, opts in (secrets or {}).items() if name in sections})
        with repo._locked():
            r = Repo(str(root))
            try:
                with r.config.edit("repo") as conf:
                    conf.setdefault("core", {})["analytics"] = False
                with r.config.edit("local") as conf:
                    conf["remote"] = sections
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
        from dvc.repo import Repo  # lazy: heavy (dvc)

        _quiet_dvc()
        with self._locked():
            r = Repo(str(self.root), config={"remote": self._secrets} if self._secrets else None)
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

    def cached_version(self, path: str, md5: str, tier: Tier, site: str) -> DatasetVersion | None:
        """``path`` at content ``md5`` with the size and file count of its objects in the local cache (what
        ``add`` recorded for it), or None when the cache lacks any of them. Reads only."""
        with self._repo() as r:
            top = self._cache_object(r, md5)
            if not top.is_file():
                return None
            if not md5.endswith(".dir"):
                return DatasetVersion(path=path, md5=md5, size=top.stat().st_size, tier=tier, site=site)
            objects = [self._cache_object(r, e["md5"]) for e in json.loads(top.read_text())]
            if not all(o.is_file() for o in objects):
                return None
            return DatasetVersion(path=path, md5=md5, size=sum(o.stat().st_size for o in objects),
                                  nfiles=len(objects), tier=tier, site=site)

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
                                           f"(`dvc push -r {remote or 'REMOTE'} {version.path}`; for the churn sample, "
                                           "`hybridtrain data generate`) or pin a version that exists.")],
                ) from None
        return self.root / version.path

    def missing_on(self, version: DatasetVersion, remote: str) -> tuple[int, int]:
        """Files and bytes of ``version`` that ``remote`` does not have yet (what a push would move).

        Sizes are those of the cached objects a push sends (a directory's ``.dir`` manifest
        included); a version that is not complete in the local cache is checked out first.
        """
        if not self._cached(version):
            self.checkout(version)
        with self._repo() as r:
            try:
                status = r.status(targets=[str(self.pointer_path(version.path))], cloud=True, remote=remote)
            except PermissionError as exc:  # s3fs: the endpoint answered 403
                raise SpecError(f"DVC remote {remote}", [Problem(
                    "store", f"the store behind remote {remote!r} refused access ({exc}); fix the site's "
                             "credentials (access_key_id / secret_access_key in its block) or its permissions")]) from None
            except _unreachable_errors() as exc:
                raise SiteUnavailable(remote, f"the store behind DVC remote {remote!r} could not be reached: {exc}; "
                                              "check that its endpoint is up") from None
            sizes = self._object_sizes(r, version)
            files, size = 0, 0
            for rel, state in status.items():
                if state not in ("new", "missing"):
                    continue
                files += 1
                if Path(rel).is_absolute():
                    rel = Path(rel).relative_to(self.root).as_posix()
                size += sizes.get(rel.rstrip("/"), 0)
        return files, size

    def _cached(self, version: DatasetVersion) -> bool:
        """True when the local cache holds every object of ``version`` (what push and status read)."""
        with self._repo() as r:
            manifest = self._cache_object(r, version.md5)
            if not manifest.is_file():
                return False
            if not version.is_dir:
                return True
            return all(self._cache_object(r, e["md5"]).is_file() for e in json.loads(manifest.read_text()))

    def _object_sizes(self, r: Any, version: DatasetVersion) -> dict[str, int]:
        """Workspace-relative path -> size of its cached object; a directory's path maps to its manifest."""

        def size(md5: str) -> int:
            obj = self._cache_object(r, md5)
            return obj.stat().st_size if obj.is_file() else 0

        out = {version.path: size(version.md5)}
        if version.is_dir:
            for entry in json.loads(self._cache_object(r, version.md5).read_text()):
                out[f"{version.path}/{entry['relpath']}"] = size(entry["md5"])
        return out

    def push(self, version: DatasetVersion, remote: str, on_progress: PushProgress | None = None) -> PushResult:
        """Upload what ``remote`` lacks of ``version``; content addressing skips unchanged files.

        ``on_progress`` is called as objects arrive — after each file and as a large file's bytes
        go — with ``(files done, files to move, bytes done, bytes to move)``, first with nothing
        done and last with everything done. It runs in the caller's context (context variables
        included), whichever of DVC's transfer threads moved the bytes, one call at a time.
        """
        files, size = self.missing_on(version, remote)
        counter = _PushCounter(files, size, on_progress)
        counter.emit()
        started = time.perf_counter()
        if files:
            with self._repo() as r:
                self._transfer(r, version, remote, counter)
        counter.finish()
        return PushResult(files=files, bytes=size, seconds=time.perf_counter() - started)

    @staticmethod
    def _transfer(r: Any, version: DatasetVersion, remote: str, callback: Callback) -> None:
        """DVC's object transfer from the local cache to ``remote`` (what ``dvc push`` runs for a
        pointer), driven by our callback instead of DVC's terminal bars."""
        from dvc.exceptions import UploadError  # lazy: heavy (dvc)
        from dvc_data.hashfile.db import get_index  # lazy: heavy (dvc)
        from dvc_data.hashfile.hash_info import HashInfo  # lazy: heavy (dvc)
        from dvc_data.hashfile.transfer import transfer  # lazy: heavy (dvc)

        odb = r.cloud.get_remote_odb(remote, "push")
        cache = r.cache.local
        oids = [version.md5]
        if version.is_dir:  # the files first, then the manifest that names them (DVC uploads it last)
            oids[:0] = [e["md5"] for e in json.loads(DvcRepo._cache_object(r, version.md5).read_text())]
        with closing(get_index(odb)) as dest_index:
            result = transfer(cache, odb, [HashInfo("md5", oid) for oid in oids], dest_index=dest_index, cache_odb=cache,
                              validate_status=r.cloud._log_missing, callback=callback)
        if result.failed:
            raise UploadError(len(result.failed))

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


class _PushCounter(Callback):
    """The fsspec callback DVC's transfer drives: one step per object, each object's bytes through
    the branch it opens for it; tells ``on_progress`` in the caller's context."""

    def __init__(self, files: int, size: int, on_progress: PushProgress | None):
        super().__init__(size=files)
        self.files_total, self.bytes_total = files, size
        self.bytes_done = 0
        self.on_progress = on_progress
        self.context = contextvars.copy_context()
        self.lock = threading.Lock()

    def branched(self, path_1: Any, path_2: Any, **kwargs: Any) -> Callback:
        return _ObjectCounter(self, path_1)

    def call(self, *args: Any, **kwargs: Any) -> None:  # an object finished (or the count was set)
        self.emit()

    def add_bytes(self, n: int) -> None:
        if n > 0:
            with self.lock:
                self.bytes_done += n
            self.emit()

    def emit(self) -> None:
        if self.on_progress is None:
            return
        with self.lock:  # one call at a time: a context may be entered by one thread only
            files = min(int(self.value), self.files_total)
            self.context.run(self.on_progress, files, self.files_total, min(self.bytes_done, self.bytes_total),
                             self.bytes_total)

    def finish(self) -> None:
        """Everything arrived (objects the remote had meanwhile are counted as done)."""
        with self.lock:
            self.value, self.bytes_done = self.files_total, self.bytes_total
        self.emit()


class _ObjectCounter(Callback):
    """One object's bytes: partial updates as the filesystem reports them, the rest when it closes."""

    def __init__(self, parent: _PushCounter, source: Any):
        super().__init__()
        self.parent = parent
        self.expected = os.path.getsize(source) if isinstance(source, str) and os.path.isfile(source) else None
        self.counted = 0

    def call(self, *args: Any, **kwargs: Any) -> None:
        cap = self.expected if self.expected is not None else self.value
        now = min(int(self.value or 0), cap)
        self.parent.add_bytes(now - self.counted)
        self.counted = max(self.counted, now)

    def close(self) -> None:
        total = self.expected if self.expected is not None else int(self.size or self.value or 0)
        self.parent.add_bytes(total - self.counted)
        self.counted = max(self.counted, total)


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """Exception types meaning "the remote's endpoint did not answer" (botocore's when S3 is in use)."""
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError  # lazy: heavy ()
        from botocore.exceptions import HTTPClientError  # lazy: heavy ()
    except ImportError:
        return (ConnectionError, TimeoutError)
    return (ConnectionError, TimeoutError, BotoConnectionError, HTTPClientError)


def _remote_section(name: str, conf: RemoteConfig) -> dict[str, str]:
    """The ``remote "name"`` section to write: a URL, or a secret-free dvc remote section."""
    if isinstance(conf, str):
        return {"url": conf}
    section = {k: str(v) for k, v in conf.items()}
    leaked = sorted(SECRET_OPTIONS & section.keys())
    if leaked:
        raise ValueError(
            f"DVC remote {name!r}: {', '.join(leaked)} would be written to .dvc/config.local; pass credentials "
            "as DvcRepo.ensure(..., secrets={remote: {...}}) so they stay in memory"
        )
    if "url" not in section:
        raise ValueError(f"DVC remote {name!r} needs a url")
    return section
