"""EdgeModel: the standalone scorer shipped to small devices as score.py — python and torch only.

Copied verbatim into every edge export (``edge_export.py``); it must import nothing from
hybridtrain, pandas or mlflow. It featurizes exactly as ``Featurizer.transform`` does
(impute the training median, standardize, missing indicators, one-hot over the vocabulary
with an ``__other__`` bucket), then runs the TorchScript network and a sigmoid.

    python score.py records.json [--public-key release.pub.pem]

``records.json`` is a list of objects (column -> value); the output is one probability per line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class EdgeError(ValueError):
    """A record the model cannot score, or a package that does not verify."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify_package(edge_dir: Path, public_key_pem: bytes) -> None:
    """Check the signature over the package's manifest and the hash of every edge file; raise EdgeError."""
    root = edge_dir.parents[2]  # <version>/weights/artifacts/edge
    manifest_bytes = (root / "manifest.json").read_bytes()
    sig = json.loads((root / "signature.json").read_text())
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
    except ImportError as exc:
        raise EdgeError("verifying the signature needs the cryptography package (pip install cryptography)") from exc
    key = load_pem_public_key(public_key_pem)
    try:
        key.verify(base64.b64decode(sig["signature"]), manifest_bytes)
    except InvalidSignature:
        raise EdgeError("manifest.json does not match its signature: the package was changed after signing") from None
    files = json.loads(manifest_bytes)["files"]
    rel_dir = edge_dir.relative_to(root).as_posix()
    for path in sorted(edge_dir.iterdir()):
        rel = f"{rel_dir}/{path.name}"
        entry = files.get(rel)
        if entry is None:
            raise EdgeError(f"{rel}: not in the signed manifest")
        if _sha256(path) != entry["sha256"]:
            raise EdgeError(f"{rel}: content changed since signing")


class EdgeModel:
    """Featurizer parameters + TorchScript network from one export directory."""

    def __init__(self, edge_dir: Path | str = HERE):
        import torch

        self.dir = Path(edge_dir)
        feat = json.loads((self.dir / "featurizer.json").read_text())
        meta = json.loads((self.dir / "columns.json").read_text())
        self.numeric = feat["numeric"]
        self.categorical = feat["categorical"]
        self.columns = meta["columns"]
        self.closed = set(meta["closed"])
        self.network = torch.jit.load(str(self.dir / "network.ts"), map_location="cpu")
        self.network.eval()

    def features(self, record: dict[str, Any]) -> list[float]:
        missing = [c for c in self.columns if c not in record]
        if missing:
            raise EdgeError(f"record lacks the feature column(s) {', '.join(missing)}")
        row: list[float] = []
        for col in self.numeric:
            value = record[col["name"]]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                is_missing, x = True, col["median"]
            else:
                try:
                    x = float(value)
                except (TypeError, ValueError):
                    raise EdgeError(f"column {col['name']}: {value!r} is not a number") from None
                is_missing = math.isnan(x)
                if is_missing:
                    x = col["median"]
            row.append((x - col["mean"]) / col["std"])
            if col["missing_indicator"]:
                row.append(1.0 if is_missing else 0.0)
        for col in self.categorical:
            vocab = col["vocabulary"]
            value = record[col["name"]]
            block = [0.0] * (len(vocab) + 1)
            name = None if value is None else str(value)
            if name in vocab:
                block[vocab.index(name)] = 1.0
            elif name is not None and col["name"] in self.closed:
                raise EdgeError(f"column {col['name']}: unseen category {name!r}; known values: {', '.join(vocab)}")
            else:
                block[-1] = 1.0
            row.extend(block)
        return row

    def score(self, records: list[dict[str, Any]]) -> list[float]:
        """Probability of the positive class per record."""
        import torch

        x = torch.tensor([self.features(r) for r in records], dtype=torch.float32)
        with torch.inference_mode():
            return torch.sigmoid(self.network(x)).double().tolist()


def main(argv: list[str]) -> int:
    args = list(argv)
    key = None
    if "--public-key" in args:
        i = args.index("--public-key")
        key = Path(args[i + 1]).read_bytes()
        del args[i:i + 2]
    if len(args) != 1:
        print("usage: score.py RECORDS.json [--public-key PEM]", file=sys.stderr)
        return 2
    try:
        if key is not None:
            verify_package(HERE, key)
        records = json.loads(Path(args[0]).read_text())
        for p in EdgeModel(HERE).score(records if isinstance(records, list) else [records]):
            print(f"{p:.8f}")
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
