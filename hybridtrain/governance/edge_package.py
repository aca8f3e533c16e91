"""EdgePackage: the part of a signed bundle a small device keeps — its edge export plus the bundle's manifest and signature.

A device does not need the MLflow model, the evidence files or our stack, only
``weights/artifacts/edge/`` (TorchScript network, featurizer JSON, ``score.py``). The package
keeps the bundle's own ``manifest.json`` and ``signature.json``, so it is verified the same way
as the bundle, with the same key: the Ed25519 signature over the manifest bytes, then the
SHA-256 and size of every file the package holds against the manifest. Files of the bundle
outside the edge prefix are expected to be absent; any file under the prefix that is missing,
changed or not in the manifest is a problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from hybridtrain.errors import BundleRejected, Problem
from hybridtrain.governance.bundle import (
    MANIFEST,
    SIGNATURE,
    BundleManifest,
    BundleSignature,
    file_sha256,
    signature_problems,
)
from hybridtrain.governance.signing_key import VerifyKey

EDGE_PREFIX = "weights/artifacts/edge/"


def edge_files(manifest: BundleManifest) -> list[str]:
    """The bundle files an edge package holds (besides manifest and signature)."""
    return sorted(rel for rel in manifest.files if rel.startswith(EDGE_PREFIX))


def package_problems(root: Path, public_key: VerifyKey) -> list[Problem]:
    """Every reason to refuse the edge package at ``root`` under ``public_key`` (empty: it verifies)."""
    root = Path(root)
    try:
        manifest_bytes = (root / MANIFEST).read_bytes()
        signature = BundleSignature.model_validate_json((root / SIGNATURE).read_bytes())
        manifest = BundleManifest.model_validate(json.loads(manifest_bytes))
    except FileNotFoundError as exc:
        return [Problem(Path(exc.filename or MANIFEST).name, "missing")]
    except (ValidationError, ValueError):
        return [Problem(MANIFEST, "manifest or signature is unreadable")]
    problems = signature_problems(signature, public_key, manifest_bytes)
    expected = edge_files(manifest)
    if not expected:
        problems.append(Problem(EDGE_PREFIX, "the bundle has no edge export"))
    found = []
    for dirpath, _, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in (MANIFEST, SIGNATURE):
                found.append(rel)
    for rel in expected:
        path = root / rel
        if path.is_symlink() or not path.is_file():
            problems.append(Problem(rel, "missing (or not a plain file): it was signed"))
            continue
        entry = manifest.files[rel]
        if path.stat().st_size != entry.size or file_sha256(path) != entry.sha256:
            problems.append(Problem(rel, "content changed since signing"))
    for rel in sorted(set(found) - set(expected)):
        problems.append(Problem(rel, "added: not part of the signed edge export"))
    return problems


def verify_package(root: Path, public_key: VerifyKey) -> None:
    """Raise ``BundleRejected`` listing every problem unless the package is exactly what the key signed."""
    problems = package_problems(root, public_key)
    if problems:
        raise BundleRejected(str(root), problems)
