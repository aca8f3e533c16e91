"""ModelBundle: a signed, portable directory holding one model version and the evidence it was made and judged on.

Layout (and ``pack``/``unpack`` move the same files as one tar archive)::

    weights/...          the model: torch state_dict bytes (weights/model.pt) or the MLflow model files
    spec.json            the job spec that asked for it
    datasets.json        {"raw"|"curated"|"approved": {"path", "md5", "tier", "size", "site"}}
    evaluation.json      test metrics (and the champion's, the comparison, the gate report)
    lineage.json         lineage tags: spec hash, code version, training site, bytes synced
    environment.json     python, platform and every installed package's version (importlib.metadata)
    checkpoint.json      {"sha256": final checkpoint's SHA-256 or null, "uri": where it was}
    manifest.json        {"format": 1, "model", "version", "created",
                          "files": {path: {"sha256", "size"}} for every file above}
    signature.json       {"algorithm": "ed25519", "key_id", "signed": "manifest.json", "signature"}

The signature is Ed25519 over the exact bytes of ``manifest.json`` (written in canonical JSON),
and the manifest holds the SHA-256 and size of every other file, so ``verify(public_key)``
refuses — with ``BundleRejected`` naming each file — a bundle in which any byte of any file
changed, a file was added or removed, a symlink or special file appeared, the manifest was
edited, or that was signed by a key other than the trusted one. Nothing else in the bundle is
trusted before it verifies.

Example: a bundle built and signed at promotion; someone flips one byte of
``weights/model.pt`` on a release target; the target's ``accept`` calls ``verify`` and raises
``BundleRejected: weights/model.pt: content changed since signing (SHA-256 …, signed …)``.

Keys: ``hybridtrain.governance.signing_key`` (the private key comes from a Prefect Secret block).
"""

from __future__ import annotations

import base64
import copy
import functools
import gzip
import hashlib
import importlib.metadata
import json
import lzma
import os
import platform
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridtrain.errors import BundleRejected, Problem
from hybridtrain.governance.signing_key import ALGORITHM, SigningKey, VerifyKey

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
SIGNATURE = "signature.json"
WEIGHTS_DIR = "weights"
EVIDENCE_FILES = ("spec.json", "datasets.json", "evaluation.json", "lineage.json", "environment.json",
                  "checkpoint.json")
TIERS = ("raw", "curated", "approved")
_CHUNK = 1 << 20
#: What a damaged or truncated archive raises while it is read (tarfile passes some through unwrapped).
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)
NOT_AN_ARCHIVE_ADVICE = ("Give a bundle directory, or a packed bundle (.tar) copied whole from the bundle archive "
                         "(bundles/<model>/<version>.tar).")


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _pretty(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False, default=str) + "\n").encode()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class BundleDataset(BaseModel):
    """One dataset version a model was made from, as the bundle records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tier: Literal["raw", "curated", "approved"]
    path: str
    md5: str
    size: int | None = None
    site: str | None = None

    @classmethod
    def of(cls, version: Any) -> BundleDataset:
        """From a ``DatasetVersion`` (or anything with tier, path, md5, size and site attributes)."""
        return cls(tier=version.tier, path=version.path, md5=version.md5, size=getattr(version, "size", None),
                   site=getattr(version, "site", None))


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class BundleManifest(BaseModel):
    """What was signed: the model version and every file's SHA-256 and size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = BUNDLE_FORMAT
    model: str
    version: str
    created: str
    files: dict[str, FileEntry]


class BundleSignature(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["ed25519"] = ALGORITHM
    key_id: str
    signed: Literal["manifest.json"] = MANIFEST
    signature: str = Field(description="Base64 Ed25519 signature of the bytes of manifest.json.")


def environment_info() -> dict[str, Any]:
    """Python, platform and the version of every installed distribution (a fresh copy each call)."""
    return copy.deepcopy(_process_environment())


@functools.cache
def _process_environment() -> dict[str, Any]:
    """Read once per process: scanning every distribution's metadata takes most of a second, and a
    package upgraded on disk later would not change the code this process already imported."""
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            packages.setdefault(name.lower(), dist.version)
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": dict(sorted(packages.items())),
    }


def signature_problems(signature: BundleSignature, public_key: VerifyKey, manifest_bytes: bytes) -> list[Problem]:
    """Why ``signature`` does not vouch for ``manifest_bytes`` under ``public_key`` (empty: it does)."""
    if signature.key_id != public_key.key_id:
        return [Problem(SIGNATURE, f"signed by key {signature.key_id}, but the trusted key is {public_key.key_id}")]
    try:
        raw_sig = base64.b64decode(signature.signature, validate=True)
    except ValueError:
        raw_sig = b""
    if not public_key.verify(raw_sig, manifest_bytes):
        return [Problem(MANIFEST, f"the signature in {SIGNATURE} does not match it: the manifest or {SIGNATURE} "
                                  "was changed after signing")]
    return []


class ModelBundle:
    """A bundle directory. Opening one checks nothing; call ``verify`` before trusting any of it.

    ``name`` is how refusals name the bundle (default: its directory); a bundle unpacked from an
    archive is named by the archive, the file the user gave, not the temporary directory.
    """

    def __init__(self, root: Path | str, *, name: str | None = None):
        self.root = Path(root)
        self.name = name or str(self.root)

    def __repr__(self) -> str:
        return f"ModelBundle({str(self.root)!r})"

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        dest: Path | str,
        *,
        model: str,
        version: str,
        weights: bytes | Path,
        spec: Mapping[str, Any],
        datasets: Mapping[str, BundleDataset] | list[BundleDataset],
        evaluation: Mapping[str, Any],
        lineage: Mapping[str, Any],
        checkpoint_sha256: str | None,
        signing_key: SigningKey,
        checkpoint_uri: str | None = None,
        environment: Mapping[str, Any] | None = None,
        created: datetime | None = None,
    ) -> ModelBundle:
        """Write a signed bundle at ``dest`` (which must not exist) and return it.

        ``weights``: the bytes of a torch state dict (stored as ``weights/model.pt``), a file,
        or a directory of model files (an MLflow model downloaded from the registry). The
        bundle appears at ``dest`` complete or not at all (built beside it, then renamed).
        """
        dest = Path(dest)
        if dest.exists():
            raise FileExistsError(f"{dest} already exists; a bundle is written once — choose a new directory")
        entries = list(datasets.values()) if isinstance(datasets, Mapping) else list(datasets)
        by_tier = {d.tier: d for d in entries}
        if len(by_tier) != len(entries):
            raise ValueError("datasets lists one tier twice; give one version per tier (raw, curated, approved)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-bundle-", dir=dest.parent))
        try:
            wdir = tmp / WEIGHTS_DIR
            if isinstance(weights, (bytes, bytearray, memoryview)):
                wdir.mkdir()
                (wdir / "model.pt").write_bytes(bytes(weights))
            elif Path(weights).is_dir():
                shutil.copytree(weights, wdir)
            elif Path(weights).is_file():
                wdir.mkdir()
                shutil.copyfile(weights, wdir / Path(weights).name)
            else:
                raise FileNotFoundError(f"weights {weights} is neither bytes, a file nor a directory")
            evidence = {
                "spec.json": dict(spec),
                "datasets.json": {t: d.model_dump(mode="json") for t, d in sorted(by_tier.items())},
                "evaluation.json": dict(evaluation),
                "lineage.json": dict(lineage),
                "environment.json": dict(environment) if environment is not None else environment_info(),
                "checkpoint.json": {"sha256": checkpoint_sha256, "uri": checkpoint_uri},
            }
            for name, content in evidence.items():
                (tmp / name).write_bytes(_pretty(content))
            when = (created or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            files = {rel: FileEntry(sha256=file_sha256(tmp / rel), size=(tmp / rel).stat().st_size)
                     for rel in _walk(tmp, [])}
            manifest = BundleManifest(model=model, version=str(version), created=when, files=files)
            manifest_bytes = _canonical(manifest.model_dump(mode="json"))
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            signature = BundleSignature(key_id=signing_key.key_id,
                                        signature=base64.b64encode(signing_key.sign(manifest_bytes)).decode())
            (tmp / SIGNATURE).write_bytes(_pretty(signature.model_dump(mode="json")))
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(dest)

    # -- reading -----------------------------------------------------------------------------

    def _read_json(self, name: str) -> Any:
        try:
            return json.loads((self.root / name).read_bytes())
        except FileNotFoundError:
            raise BundleRejected(self.name, [Problem(name, "missing")]) from None
        except OSError as exc:
            raise BundleRejected(self.name, [Problem(name, _unreadable(exc))]) from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BundleRejected(self.name, [Problem(name, "not valid JSON")]) from None

    @property
    def manifest(self) -> BundleManifest:
        try:
            return BundleManifest.model_validate(self._read_json(MANIFEST))
        except ValidationError as exc:
            raise BundleRejected(self.name, [Problem(MANIFEST, f"not a bundle manifest: {exc.errors()[0]['msg']}")]) \
                from None

    @property
    def manifest_sha256(self) -> str:
        """SHA-256 of ``manifest.json``: one hash that pins every byte of the bundle."""
        return file_sha256(self.root / MANIFEST)

    @property
    def model(self) -> str:
        return self.manifest.model

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def key_id(self) -> str:
        return self.signature.key_id

    @property
    def signature(self) -> BundleSignature:
        try:
            return BundleSignature.model_validate(self._read_json(SIGNATURE))
        except ValidationError as exc:
            raise BundleRejected(self.name, [Problem(SIGNATURE, f"not a bundle signature: "
                                                                     f"{exc.errors()[0]['msg']}")]) from None

    def datasets(self) -> dict[str, BundleDataset]:
        raw = self._read_json("datasets.json")
        try:
            return {tier: BundleDataset.model_validate(entry) for tier, entry in raw.items()}
        except (ValidationError, AttributeError) as exc:
            raise BundleRejected(self.name, [Problem("datasets.json", f"not a dataset list: {exc}")]) from None

    def evaluation(self) -> dict[str, Any]:
        return self._read_json("evaluation.json")

    def lineage(self) -> dict[str, Any]:
        return self._read_json("lineage.json")

    def spec(self) -> dict[str, Any]:
        return self._read_json("spec.json")

    def environment(self) -> dict[str, Any]:
        return self._read_json("environment.json")

    @property
    def checkpoint_sha256(self) -> str | None:
        value = self._read_json("checkpoint.json").get("sha256")
        return str(value) if value is not None else None

    # -- verifying ---------------------------------------------------------------------------

    def problems(self, public_key: VerifyKey) -> list[Problem]:
        """Every reason to refuse this bundle under ``public_key`` (empty: it verifies)."""
        problems: list[Problem] = []
        try:
            signature = self.signature
        except BundleRejected as exc:
            problems += exc.problems
            signature = None
        try:
            manifest_bytes = (self.root / MANIFEST).read_bytes()
        except FileNotFoundError:
            return problems + [Problem(MANIFEST, "missing: nothing says which files were signed")]
        except OSError as exc:
            return problems + [Problem(MANIFEST, f"{_unreadable(exc)}, so nothing says which files were signed")]
        if signature is not None:
            problems += signature_problems(signature, public_key, manifest_bytes)
        try:
            manifest = BundleManifest.model_validate(json.loads(manifest_bytes))
        except (ValidationError, json.JSONDecodeError, UnicodeDecodeError):
            return problems + [Problem(MANIFEST, "not a readable bundle manifest, so no file can be checked")]
        found = set(_walk(self.root, problems, skip={MANIFEST, SIGNATURE}))
        for rel, entry in sorted(manifest.files.items()):
            path = self.root / rel
            if rel not in found:
                if not path.is_symlink():
                    problems.append(Problem(rel, "missing: it was signed but is not in the bundle"))
                continue
            size = path.stat().st_size
            actual = file_sha256(path)
            if actual != entry.sha256 or size != entry.size:
                problems.append(Problem(rel, f"content changed since signing (SHA-256 {actual[:16]}…, {size} bytes; "
                                             f"signed {entry.sha256[:16]}…, {entry.size} bytes)"))
        for rel in sorted(found - manifest.files.keys()):
            problems.append(Problem(rel, "added: not in the signed manifest"))
        for name in EVIDENCE_FILES:
            if name not in manifest.files:
                problems.append(Problem(name, "not in the manifest: a bundle must carry it"))
        return problems

    def verify(self, public_key: VerifyKey) -> ModelBundle:
        """Raise ``BundleRejected`` listing every problem unless the bundle is exactly what the key signed.

        The refusal's advice fits the cause: signed by another key and otherwise intact → check it
        with that key's public half if it is one you trust; anything changed → rebuild and re-sign.
        """
        problems = self.problems(public_key)
        if problems:
            raise BundleRejected(self.name, problems, advice=self._advice(problems, public_key))
        return self

    def _advice(self, problems: list[Problem], public_key: VerifyKey) -> str:
        if not (self.root / MANIFEST).exists() and not (self.root / SIGNATURE).exists():
            return (f"{self.name} is not a model bundle (it has neither {MANIFEST} nor {SIGNATURE}): "
                    + NOT_AN_ARCHIVE_ADVICE[0].lower() + NOT_AN_ARCHIVE_ADVICE[1:])
        try:
            signer = self.signature.key_id
        except BundleRejected:
            signer = None
        if signer is not None and signer != public_key.key_id and len(problems) == 1:
            return (f"The bundle is intact but signed by key {signer}, not by the trusted {public_key.key_id}: if you "
                    "trust that key, check the bundle with its public key (--public-key PEM, or "
                    "HYBRIDTRAIN_RELEASE_PUBLIC_KEY); if not, do not use it — rebuild it from the registry version "
                    "and sign it again with the release key.")
        return ("Its files are not what was signed: do not use it; rebuild the bundle from the registry version and "
                "sign it again with the release key.")

    # -- transport ---------------------------------------------------------------------------

    def files(self) -> list[str]:
        """Every file of the bundle (relative POSIX paths), manifest and signature last."""
        rest = sorted(_walk(self.root, [], skip={MANIFEST, SIGNATURE}))
        return rest + [MANIFEST, SIGNATURE]

    def pack(self, archive: Path | str) -> Path:
        """Write the bundle as one uncompressed tar (sorted members, zeroed times and owners) at ``archive``."""
        archive = Path(archive)
        archive.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=archive.parent)
        os.close(fd)
        try:
            with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
                for rel in self.files():
                    info = tar.gettarinfo(str(self.root / rel), arcname=rel)
                    info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
                    with open(self.root / rel, "rb") as fh:
                        tar.addfile(info, fh)
            os.replace(tmp, archive)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return archive

    @classmethod
    def unpack(cls, archive: Path | str, dest: Path | str, *, name: str | None = None) -> ModelBundle:
        """Extract a packed bundle into ``dest`` (must not exist). Only plain files with relative paths are
        accepted; the result is not verified — call ``verify``. The bundle is named ``name`` (default: the
        archive's path) in refusals. An archive that is not a tar, or is damaged or cut short, is refused
        (``BundleRejected``) with nothing left at ``dest``."""
        dest = Path(dest)
        label = name or str(archive)
        if dest.exists():
            raise FileExistsError(f"{dest} already exists; unpack into a new directory")

        def refuse(what: str) -> BundleRejected:
            return BundleRejected(label, [Problem(Path(archive).name, what)], advice=NOT_AN_ARCHIVE_ADVICE)

        try:
            tar = tarfile.open(archive, "r:*")
        except _ARCHIVE_ERRORS:
            raise refuse("not a bundle archive: it is not a tar file") from None
        except OSError as exc:
            raise refuse(_unreadable(exc)) from None
        with tar:
            try:
                members = tar.getmembers()
            except _ARCHIVE_ERRORS:
                raise refuse("a damaged or truncated tar archive: its list of files cannot be read") from None
            bad = [Problem(m.name, "not a plain file with a relative path inside the bundle")
                   for m in members
                   if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts]
            if bad:
                raise BundleRejected(label, bad, advice=NOT_AN_ARCHIVE_ADVICE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-unpack-", dir=dest.parent))
            try:
                tar.extractall(tmp, filter="data")
                os.rename(tmp, dest)
            except _ARCHIVE_ERRORS:
                shutil.rmtree(tmp, ignore_errors=True)
                raise refuse("a damaged or truncated tar archive: a file in it is cut short") from None
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return cls(dest, name=label)


def _unreadable(exc: OSError) -> str:
    """A one-line reason a bundle file or archive cannot be read (a directory where a file belongs, no permission)."""
    if isinstance(exc, IsADirectoryError):
        return "a directory where a file belongs"
    return f"cannot be read ({exc.strerror or exc})"


def _walk(root: Path, problems: list[Problem], skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Regular files under ``root`` as relative POSIX paths; symlinks and special files become problems."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                problems.append(Problem((base / name).relative_to(root).as_posix(),
                                        "a symbolic link: bundles hold plain files only"))
        for name in sorted(filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if rel in skip:
                continue
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                problems.append(Problem(rel, "a symbolic link: bundles hold plain files only"))
            elif not stat.S_ISREG(mode):
                problems.append(Problem(rel, "not a plain file"))
            else:
                out.append(rel)
    return sorted(out)
