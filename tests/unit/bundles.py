"""A small signed model bundle for the governance tests: real files, real Ed25519 signature."""

from __future__ import annotations

from pathlib import Path

from hybridtrain.governance.bundle import BundleDataset, ModelBundle
from hybridtrain.governance.signing_key import SigningKey

DATASETS = {"raw": "1" * 32, "curated": "2" * 32 + ".dir", "approved": "3" * 32 + ".dir"}
CHECKPOINT_SHA = "c" * 64


def make_bundle(dest: Path, key: SigningKey, *, model: str = "churn-classifier", version: str = "1",
                weights: bytes | None = None, datasets: dict[str, str] | None = None,
                checkpoint_sha256: str | None = CHECKPOINT_SHA) -> ModelBundle:
    md5s = datasets or DATASETS
    return ModelBundle.build(
        dest,
        model=model,
        version=version,
        weights=weights if weights is not None else f"weights of {model} v{version}".encode() * 64,
        spec={"metadata": {"name": "churn"}, "registry": {"model_name": model}},
        datasets=[BundleDataset(tier=t, path=f"data/{t}/churn", md5=m, size=100, site="onprem-dc1")
                  for t, m in md5s.items()],
        evaluation={"metrics": {"auc": 0.8, "accuracy": 0.8}},
        lineage={"hybridtrain.spec_hash": "ab" * 32},
        checkpoint_sha256=checkpoint_sha256,
        signing_key=key,
        environment={"python": "3.11", "packages": {"torch": "2.13.0"}},
    )
