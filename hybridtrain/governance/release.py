"""Release: publishing signed model bundles to the targets that serve them, and keeping every target in step.

A *target* is a place a serving system reads models from, pluggable by ``kind`` (the name used
in a spec's ``promotion.release_targets``) through ``TARGET_KINDS``:

- ``directory`` (default) — an on-prem serving directory;
- ``object_store`` — a site's store from the sites catalog (S3 or its local stand-in), through
  the ``ObjectStore`` protocol, so it works with any implementation of it;
- ``edge`` — a small device's directory: only the edge export of each version (TorchScript
  network, featurizer JSON, a standalone ``score.py``) with the bundle's manifest and signature
  (``hybridtrain.governance.edge_package``).

Every target has the same layout::

    versions/<model>/<version>/...     the bundle's files, exactly as signed
    released/<model>/<version>.json    marker: the version is complete (manifest SHA-256, key id, time)
    current/<model>.json               pointer: the version served now

A target **verifies the bundle's signature itself** (with the public key *it* trusts) before
accepting it, and nothing half-published is visible: a directory target copies into a hidden
temporary directory, re-verifies the copy and renames it into place; an object-store target
uploads the files (manifest and signature last) and writes the marker only after all of them.
Readers go through the marker and the pointer, each one object written atomically, so they
see a version complete or not at all. ``remove`` deletes the marker first for the same reason.

``Releaser`` drives all of a spec's targets together: ``stage`` (archive the bundle, every
target accepts it — a refusal anywhere leaves every pointer where it was), ``activate`` (move
every pointer), ``publish`` (both), ``restore`` (rollback: re-release an earlier version from
the archive or a target that still holds it, then move the pointers) and ``retire`` (remove a
version from every target; its bundle stays in the archive as evidence). Each returns a
``ReleaseRecord`` saying which target holds which versions and which one it serves.

Longer than most modules on purpose: the release target kinds (directory, object store, edge) and the releaser that keeps them in step share one verification path, and splitting them would split that path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from hybridtrain.errors import BundleRejected, Problem, ReleaseRefused, SpecError
from hybridtrain.governance.bundle import ModelBundle
from hybridtrain.governance.edge_package import edge_files, verify_package
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.plugins import PluginRegistry
from hybridtrain.specs.job import MODEL_NAME_RE, ReleaseTargetSpec
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import ObjectStore
from hybridtrain.storage.staging import staged_dir

if TYPE_CHECKING:
    from hybridtrain.specs.sites import SitesCatalog

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MODEL_RE = re.compile(MODEL_NAME_RE)


def _check(model: str, version: str | None = None) -> None:
    if not _MODEL_RE.match(model):
        raise ValueError(f"invalid model name {model!r}: letters, digits and . _ - only")
    if version is not None and not VERSION_RE.match(str(version)):
        raise ValueError(f"invalid version {version!r}: letters, digits and . _ - only")


def version_order(version: str) -> tuple[int, int | str]:
    """Sort key: numeric versions (MLflow's) numerically, before any others."""
    return (0, int(version)) if version.isdigit() else (1, version)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ReleaseMarker(BaseModel):
    """Written last when a version is complete on a target; what ``versions()`` lists."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    version: str
    manifest_sha256: str
    key_id: str
    released_at: str


class CurrentPointer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    version: str
    manifest_sha256: str
    updated_at: str


class TargetHolding(BaseModel):
    """What one target holds for one model after an action."""

    model_config = ConfigDict(extra="forbid")

    target: str
    kind: str
    url: str
    current: str | None
    versions: list[str]


class ReleaseRecord(BaseModel):
    """The outcome of a release, rollback or retirement: which target holds which version, and serves which."""

    model_config = ConfigDict(extra="forbid")

    model: str
    version: str
    action: Literal["release", "rollback", "retire"]
    at: str
    manifest_sha256: str | None = None
    targets: list[TargetHolding]
    target_specs: list[dict[str, Any]] = []

    def tags(self) -> dict[str, str]:
        """MLflow version tags: per target whether it serves, holds or lacks this version, and the target specs
        (so ``hybridtrain rollback`` can reopen the targets without the job spec)."""
        out = {"hybridtrain.release.targets": ",".join(t.target for t in self.targets)}
        for t in self.targets:
            state = "current" if t.current == self.version else ("held" if self.version in t.versions else "absent")
            out[f"hybridtrain.release.{t.target}"] = f"{state} at {t.url}"
        if self.target_specs:
            out["hybridtrain.release.target_specs"] = json.dumps(self.target_specs, sort_keys=True)
        return out


class ReleaseTarget(Protocol):
    """One place serving systems read models from."""

    name: str
    kind: str
    spec: ReleaseTargetSpec | None

    @property
    def url(self) -> str: ...

    def accept(self, bundle: ModelBundle) -> ReleaseMarker: ...

    def set_current(self, model: str, version: str) -> None: ...

    def current(self, model: str) -> str | None: ...

    def versions(self, model: str) -> list[str]: ...

    def remove(self, model: str, version: str) -> bool: ...

    def fetch(self, model: str, version: str, dest: Path) -> ModelBundle: ...

    def verify_held(self, model: str, version: str) -> ReleaseMarker: ...


TARGET_KINDS: PluginRegistry[type] = PluginRegistry("release target kind", default="directory")


class _Target:
    """Markers and pointers, shared by every kind: each one JSON object in ``self.meta`` written atomically."""

    kind = ""

    def __init__(self, name: str, meta: ObjectStore, trusted_key: VerifyKey, spec: ReleaseTargetSpec | None):
        self.name = name
        self.meta = meta
        self.trusted_key = trusted_key
        self.spec = spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.url!r})"

    @property
    def url(self) -> str:
        return self.meta.url

    def _marker_key(self, model: str, version: str) -> str:
        return f"released/{model}/{version}.json"

    def marker(self, model: str, version: str) -> ReleaseMarker | None:
        _check(model, version)
        key = self._marker_key(model, version)
        try:
            raw = self.meta.get_bytes(key)
        except FileNotFoundError:
            return None
        fix = f"delete it and release v{version} there again"  # without its marker the version is not listed
        marker = self._read_json(ReleaseMarker, raw, model, key, "release marker", fix)
        if (marker.model, marker.version) != (model, version):
            raise self._unreadable(model, key, "release marker", f"it is for {marker.model} v{marker.version}", fix)
        return marker

    def versions(self, model: str) -> list[str]:
        _check(model)
        prefix = f"released/{model}/"
        found = [o.key[len(prefix):-len(".json")] for o in self.meta.list(prefix)
                 if o.key.endswith(".json") and "/" not in o.key[len(prefix):]]
        return sorted(found, key=version_order)

    def current(self, model: str) -> str | None:
        """The version the ``current`` pointer names; None without one. A pointer that is not one this module
        wrote (truncated, edited, naming a version that is not a version) raises ``ReleaseRefused`` naming it."""
        _check(model)
        key = f"current/{model}.json"
        try:
            raw = self.meta.get_bytes(key)
        except FileNotFoundError:
            return None
        fix = "release a version there again, which rewrites it"
        pointer = self._read_json(CurrentPointer, raw, model, key, "current pointer", fix)
        if pointer.model != model:
            raise self._unreadable(model, key, "current pointer", f"it names model {pointer.model!r}", fix)
        if not VERSION_RE.match(pointer.version):
            raise self._unreadable(model, key, "current pointer", f"{pointer.version!r} is not a version", fix)
        return pointer.version

    def _read_json(self, cls: type[BaseModel], raw: bytes, model: str, key: str, what: str, fix: str) -> Any:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            e = exc.errors()[0]  # the first says enough: the object as a whole is not one a release wrote
            where = ".".join(str(x) for x in e["loc"])
            raise self._unreadable(model, key, what, f"{where + ': ' if where else ''}{e['msg']}", fix) from None

    def _unreadable(self, model: str, key: str, what: str, why: str, fix: str) -> ReleaseRefused:
        # Only a release writes markers and pointers, each atomically: a bad one was edited or cut short by hand.
        return ReleaseRefused(model, f"target {self.name}'s {what} {self.url.rstrip('/')}/{key} is unreadable "
                                     f"({why}): it was edited or truncated; restore it from a backup, or {fix}")

    def accept(self, bundle: ModelBundle) -> ReleaseMarker:
        """Verify ``bundle`` with this target's key, store it, then mark it released. Idempotent for the same
        bundle; a different bundle under a released version is refused."""
        bundle.verify(self.trusted_key)
        model, version, sha = bundle.model, bundle.version, bundle.manifest_sha256
        _check(model, version)
        existing = self.marker(model, version)
        if existing is not None:
            if existing.manifest_sha256 == sha:
                return existing
            raise ReleaseRefused(model, f"target {self.name} already holds v{version} with other content (manifest "
                                        f"{existing.manifest_sha256[:12]}…, this bundle {sha[:12]}…); versions are "
                                        "immutable — retire it first")
        self._store_version(bundle)
        marker = ReleaseMarker(model=model, version=version, manifest_sha256=sha, key_id=bundle.key_id,
                               released_at=_now())
        self.meta.put_bytes(self._marker_key(model, version), marker.model_dump_json().encode())
        return marker

    def verify_held(self, model: str, version: str) -> ReleaseMarker:
        """Check that the copy of ``version`` this target holds is still exactly the bundle that was signed and
        released (its files, its signature, its manifest hash); ``BundleRejected`` if anything changed."""
        marker = self.marker(model, version)
        if marker is None:
            raise ReleaseRefused(model, f"target {self.name} does not hold v{version}; release it there first")
        with tempfile.TemporaryDirectory(prefix="hybridtrain-verify-") as tmp:
            bundle = self.fetch(model, version, Path(tmp) / "bundle").verify(self.trusted_key)
            if bundle.manifest_sha256 != marker.manifest_sha256:
                raise BundleRejected(f"{self.url} v{version}", [Problem(
                    "manifest.json", f"target {self.name} holds a bundle with manifest "
                                     f"{bundle.manifest_sha256[:12]}… but released {marker.manifest_sha256[:12]}…: "
                                     "it was replaced")])
        return marker

    def set_current(self, model: str, version: str) -> None:
        marker = self.marker(model, version)
        if marker is None:
            raise ReleaseRefused(model, f"target {self.name} does not hold v{version}; release it there first")
        pointer = CurrentPointer(model=model, version=version, manifest_sha256=marker.manifest_sha256,
                                 updated_at=_now())
        self.meta.put_bytes(f"current/{model}.json", pointer.model_dump_json().encode())

    def remove(self, model: str, version: str) -> bool:
        """Delete ``version`` (marker first, so it stops being listed at once); False when it was not there.
        Refused while the target serves it as current."""
        _check(model, version)
        if self.current(model) == version:
            raise ReleaseRefused(model, f"target {self.name} serves v{version} as current; roll back or promote "
                                        "another version first")
        had = self.marker(model, version) is not None
        self.meta.delete(self._marker_key(model, version))
        self._delete_version(model, version)
        return had

    def holding(self, model: str) -> TargetHolding:
        return TargetHolding(target=self.name, kind=self.kind, url=self.url, current=self.current(model),
                             versions=self.versions(model))

    # kind-specific storage of the version's files
    def _store_version(self, bundle: ModelBundle) -> None:
        raise NotImplementedError

    def _delete_version(self, model: str, version: str) -> None:
        raise NotImplementedError


@TARGET_KINDS.register("directory")
class DirectoryTarget(_Target):
    """An on-prem serving directory: each version a directory renamed into place complete."""

    kind = "directory"

    def __init__(self, name: str, root: Path | str, trusted_key: VerifyKey, spec: ReleaseTargetSpec | None = None):
        self.root = Path(root)
        super().__init__(name, LocalObjectStore(self.root), trusted_key, spec)

    @staticmethod
    def spec_problems(target: ReleaseTargetSpec, sites: SitesCatalog | None) -> list[tuple[str, str]]:
        p = []
        if not target.path:
            p.append(("path", "a directory target needs path: the serving directory"))
        if target.site is not None:
            p.append(("site", "applies to object_store targets; a directory target takes path"))
        return p

    @classmethod
    def open(cls, target: ReleaseTargetSpec, *, root: Path, sites: SitesCatalog | None,
             trusted_key: VerifyKey) -> DirectoryTarget:
        if not target.path:
            raise SpecError("job spec", [Problem("promotion.release_targets", f"target {target.name}: give path")])
        path = Path(target.path)
        return cls(target.name, path if path.is_absolute() else Path(root) / path, trusted_key, target)

    def _version_dir(self, model: str, version: str) -> Path:
        return self.root / "versions" / model / version

    def _store_version(self, bundle: ModelBundle) -> None:
        final = self._version_dir(bundle.model, bundle.version)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # left by a crash after the rename but before the marker: never visible, replace it
            self._discard(final)
        stage = staged_dir(final.parent)  # a killed writer's leftovers go first
        try:
            for rel in bundle.files():
                dest = stage / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bundle.root / rel, dest)
                with open(dest, "rb") as fh:
                    os.fsync(fh.fileno())
            ModelBundle(stage).verify(self.trusted_key)  # what landed here is what was signed
            os.rename(stage, final)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    def _discard(self, path: Path) -> None:
        # Rename first: a half-deleted version directory is never visible under its own name.
        doomed = staged_dir(path.parent)
        os.rename(path, doomed / path.name)
        shutil.rmtree(doomed)

    def _delete_version(self, model: str, version: str) -> None:
        path = self._version_dir(model, version)
        if path.exists():
            self._discard(path)

    def fetch(self, model: str, version: str, dest: Path) -> ModelBundle:
        if self.marker(model, version) is None:
            raise ReleaseRefused(model, f"target {self.name} does not hold v{version}")
        shutil.copytree(self._version_dir(model, version), dest)
        return ModelBundle(dest)


@TARGET_KINDS.register("edge")
class EdgeTarget(DirectoryTarget):
    """A small device's directory: per version only the edge export (``EdgePackage``), verified with the same key.

    ``accept`` verifies the full bundle first (as every kind does); the package written is the
    bundle's ``weights/artifacts/edge/`` files with its ``manifest.json`` and ``signature.json``,
    re-verified as a package before it is renamed into place. A device runs
    ``versions/<model>/<version>/weights/artifacts/edge/score.py`` with python and torch alone.
    """

    kind = "edge"

    def _store_version(self, bundle: ModelBundle) -> None:
        files = edge_files(bundle.manifest)
        if not files:
            raise ReleaseRefused(bundle.model, f"v{bundle.version} carries no edge export (weights/artifacts/edge/): "
                                               f"it was registered before models had one; retrain to release it to "
                                               f"edge target {self.name}")
        final = self._version_dir(bundle.model, bundle.version)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            self._discard(final)
        stage = staged_dir(final.parent)
        try:
            for rel in [*files, "manifest.json", "signature.json"]:
                dest = stage / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bundle.root / rel, dest)
            verify_package(stage, self.trusted_key)
            os.rename(stage, final)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    def fetch(self, model: str, version: str, dest: Path) -> ModelBundle:
        raise ReleaseRefused(model, f"edge target {self.name} holds only the edge export of v{version}, not its "
                                    "full bundle")

    def verify_held(self, model: str, version: str) -> ReleaseMarker:
        """The edge package this device holds still verifies under the trusted key and is the one released."""
        marker = self.marker(model, version)
        if marker is None:
            raise ReleaseRefused(model, f"target {self.name} does not hold v{version}; release it there first")
        verify_package(self._version_dir(model, version), self.trusted_key)
        return marker


@TARGET_KINDS.register("object_store")
class ObjectStoreTarget(_Target):
    """A prefix in any ``ObjectStore`` (S3, a local directory standing in for one)."""

    kind = "object_store"

    def __init__(self, name: str, store: ObjectStore, trusted_key: VerifyKey, spec: ReleaseTargetSpec | None = None):
        self.store = store
        super().__init__(name, store, trusted_key, spec)

    @staticmethod
    def spec_problems(target: ReleaseTargetSpec, sites: SitesCatalog | None) -> list[tuple[str, str]]:
        p = []
        if target.site is None:
            p.append(("site", "an object_store target needs site: the site whose store holds the releases"))
        elif sites is not None and target.site not in sites.names:
            p.append(("site", f"unknown site {target.site!r}; known: {', '.join(sites.names)}"))
        if target.path is not None:
            p.append(("path", "applies to directory targets; an object_store target takes site and prefix"))
        return p

    @classmethod
    def open(cls, target: ReleaseTargetSpec, *, root: Path, sites: SitesCatalog | None,
             trusted_key: VerifyKey) -> ObjectStoreTarget:

        if target.site is None or sites is None:
            raise SpecError("job spec", [Problem("promotion.release_targets",
                                                 f"target {target.name}: an object_store target needs site and the "
                                                 "sites catalog")])
        site = sites.get(target.site)
        return cls(target.name, open_store(site.store, Path(root), target.prefix, site=site.name), trusted_key, target)

    def _store_version(self, bundle: ModelBundle) -> None:
        prefix = f"versions/{bundle.model}/{bundle.version}/"
        for rel in bundle.files():  # manifest and signature last
            self.store.put_file(prefix + rel, bundle.root / rel)

    def _delete_version(self, model: str, version: str) -> None:
        for obj in self.store.list(f"versions/{model}/{version}/"):
            self.store.delete(obj.key)

    def fetch(self, model: str, version: str, dest: Path) -> ModelBundle:
        if self.marker(model, version) is None:
            raise ReleaseRefused(model, f"target {self.name} does not hold v{version}")
        prefix = f"versions/{model}/{version}/"
        for obj in self.store.list(prefix):
            self.store.get_file(obj.key, Path(dest) / obj.key[len(prefix):])
        return ModelBundle(dest)


def open_targets(specs: Sequence[ReleaseTargetSpec], *, root: Path, sites: SitesCatalog | None,
                 trusted_key: VerifyKey) -> list[ReleaseTarget]:
    """The targets a spec's ``promotion.release_targets`` names, each trusting ``trusted_key``."""
    return [TARGET_KINDS.get(t.kind).open(t, root=Path(root), sites=sites, trusted_key=trusted_key) for t in specs]


class BundleArchive:
    """Every bundle ever released, packed (``bundles/<model>/<version>.tar``) in an ``ObjectStore``: what a
    rollback re-releases from and what stays, as evidence, after a version is retired."""

    def __init__(self, store: ObjectStore):
        self.store = store

    def _key(self, model: str, version: str) -> str:
        _check(model, version)
        return f"bundles/{model}/{version}.tar"

    def put(self, bundle: ModelBundle) -> str:
        key = self._key(bundle.model, bundle.version)
        if not self.store.exists(key):
            with tempfile.TemporaryDirectory() as tmp:
                self.store.put_file(key, bundle.pack(Path(tmp) / "bundle.tar"))
        return key

    def has(self, model: str, version: str) -> bool:
        return self.store.exists(self._key(model, version))

    def versions(self, model: str) -> list[str]:
        _check(model)
        prefix = f"bundles/{model}/"
        found = [o.key[len(prefix):-len(".tar")] for o in self.store.list(prefix) if o.key.endswith(".tar")]
        return sorted(found, key=version_order)

    def get(self, model: str, version: str, dest: Path) -> ModelBundle:
        """Unpack the archived bundle into ``dest`` (not verified: targets verify what they accept)."""
        key = self._key(model, version)
        if not self.store.exists(key):
            raise ReleaseRefused(model, f"no archived bundle of v{version} in {self.store.url}")
        archive = Path(dest).with_name(Path(dest).name + ".tar")
        self.store.get_file(key, archive)
        try:
            return ModelBundle.unpack(archive, dest)
        finally:
            archive.unlink(missing_ok=True)


class Releaser:
    """Keeps all of a model's release targets in step (see the module docstring for the operations)."""

    def __init__(self, targets: Sequence[ReleaseTarget], archive: BundleArchive | None = None):
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"release target names must be unique: {names}")
        self.targets = list(targets)
        self.archive = archive

    def _record(self, model: str, version: str, action: str, sha: str | None) -> ReleaseRecord:
        specs = [t.spec.model_dump(mode="json") for t in self.targets if t.spec is not None]
        return ReleaseRecord(model=model, version=str(version), action=action, at=_now(), manifest_sha256=sha,
                             targets=[t.holding(model) for t in self.targets], target_specs=specs)

    def holdings(self, model: str) -> list[TargetHolding]:
        return [t.holding(model) for t in self.targets]

    def available_versions(self, model: str) -> list[str]:
        """Versions a rollback could re-release: in the archive or held by any target."""
        found = set(self.archive.versions(model) if self.archive else [])
        for t in self.targets:
            found.update(t.versions(model))
        return sorted(found, key=version_order)

    def stage(self, bundle: ModelBundle) -> None:
        """Archive ``bundle`` and have every target accept it; no pointer moves. A target that refuses raises
        (``BundleRejected``) before any pointer has moved anywhere."""
        if self.archive is not None:
            self.archive.put(bundle)
        for t in self.targets:
            t.accept(bundle)

    def activate(self, model: str, version: str) -> ReleaseRecord:
        """Point every target's ``current`` at ``version`` (each must hold it)."""
        missing = [t.name for t in self.targets if version not in t.versions(model)]
        if missing:
            raise ReleaseRefused(model, f"v{version} is not on target(s) {', '.join(missing)}; stage it first")
        for t in self.targets:
            t.set_current(model, version)
        return self._record(model, version, "release", None)

    def publish(self, bundle: ModelBundle) -> ReleaseRecord:
        """Stage ``bundle`` everywhere, then make it current everywhere."""
        self.stage(bundle)
        record = self.activate(bundle.model, bundle.version)
        return record.model_copy(update={"manifest_sha256": bundle.manifest_sha256})

    def restore(self, model: str, version: str) -> ReleaseRecord:
        """Rollback: make ``version`` current on every target, re-releasing it (from the archive, else from a
        target that still holds it) where it is missing. Every target verifies it again: the copy it holds is
        checked against the trusted key and its release marker *before any* pointer moves, so a tampered copy
        left on a target is refused (``BundleRejected``) instead of served again."""
        lacking = [t for t in self.targets if version not in t.versions(model)]
        sha = None
        if lacking:
            with tempfile.TemporaryDirectory(prefix="hybridtrain-restore-") as tmp:
                bundle = self._find(model, version, Path(tmp) / "bundle")
                sha = bundle.manifest_sha256
                for t in lacking:
                    t.accept(bundle)
        for t in self.targets:
            marker = t.verify_held(model, version)
            sha = sha or marker.manifest_sha256
        for t in self.targets:
            t.set_current(model, version)
        return self._record(model, version, "rollback", sha)

    def held_copy(self, model: str, version: str, dest: Path) -> ModelBundle | None:
        """The bundle of ``version`` already in the archive or on a target (unpacked into ``dest``, not verified),
        or None: what an interrupted promotion had staged, so finishing it releases that same bundle."""
        held = ((self.archive is not None and self.archive.has(model, version))
                or any(t.kind != "edge" and version in t.versions(model) for t in self.targets))
        return self._find(model, version, dest) if held else None

    def _find(self, model: str, version: str, dest: Path) -> ModelBundle:
        if self.archive is not None and self.archive.has(model, version):
            return self.archive.get(model, version, dest)
        for t in self.targets:
            if t.kind != "edge" and version in t.versions(model):  # an edge target keeps only the export
                return t.fetch(model, version, dest)
        raise ReleaseRefused(model, f"no signed bundle of v{version} is left in the archive or on any target, so it "
                                    "cannot be re-released; rebuild it from the registry version")

    def retire(self, model: str, version: str) -> ReleaseRecord:
        """Remove ``version`` from every target (refused, before anything is removed, while any target serves it);
        the archived bundle is kept."""
        serving = [t.name for t in self.targets if t.current(model) == version]
        if serving:
            raise ReleaseRefused(model, f"v{version} is served as current by {', '.join(serving)}; roll back or "
                                        "promote another version first")
        for t in self.targets:
            t.remove(model, version)
        return self._record(model, version, "retire", None)

