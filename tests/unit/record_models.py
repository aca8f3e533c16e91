"""Real record models for the serving tests: churn records, a fitted featurizer, a TabularMLP, MLflow versions, bundles."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from hybridtrain.datasets.sample_data import generate_churn
from hybridtrain.governance.bundle import BundleDataset, ModelBundle
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import JobSpec, load_spec
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.model import TabularMLP
from hybridtrain.training.record_model import feature_columns

ROOT = Path(__file__).resolve().parents[2]
MODEL = "churn-classifier"


def churn_spec() -> JobSpec:
    return load_spec(ROOT / "jobs" / "churn.yaml")


def churn_records(rows: int = 300, seed: int = 5) -> pd.DataFrame:
    """Records as the approved data has them (date of birth generalized to its year), feature columns only."""
    spec = churn_spec()
    df = generate_churn(rows=rows, seed=seed)
    df["date_of_birth"] = pd.to_datetime(df["date_of_birth"]).dt.year.astype("int64")
    cols = list(feature_columns(spec))
    out = df.dropna(subset=["churned"])[cols].reset_index(drop=True)
    for name in spec.model.features.categorical:  # as a client sends them: plain strings
        out[name] = out[name].astype(str)
    return out


def fitted(seed: int = 0, rows: int = 600, shift: float = 0.0) -> tuple[TabularMLP, Featurizer, dict[str, str]]:
    """A featurizer fitted on generated records and an (untrained, seeded) network: scores differ per seed;
    ``shift`` is added to the output bias (a model that scores everyone higher)."""
    spec = churn_spec()
    feat = Featurizer.fit(churn_records(rows, seed=11), spec.model.features)
    torch.manual_seed(seed)
    net = TabularMLP.from_spec(spec.model, feat.n_features)
    with torch.no_grad():
        net.net[-1].bias += shift
    net.eval()
    return net, feat, feature_columns(spec)


def register_version(registry: Registry, seed: int = 0, champion: bool = True, shift: float = 0.0) -> str:
    """Log a RecordModel in a fresh run, register it under MODEL (and make it champion); returns the version."""
    net, feat, columns = fitted(seed, shift=shift)
    run_id = registry.start_run("serving-tests", f"seed-{seed}", {"hybridtrain.job": "churn"})
    ref = registry.log_model(run_id, net, feat.to_dict(), feat.n_features, columns=columns)
    registry.end_run(run_id)
    version = registry.register(ref.model_uri, MODEL, run_id, {"seed": seed}).version
    if champion:
        registry.move_champion(MODEL, version)
    return version


def release_bundle(registry: Registry, version: str, dest: Path, key: SigningKey) -> ModelBundle:
    """The signed bundle of a registered version, as promotion builds it (weights = the MLflow model files)."""
    import mlflow

    mlflow.set_tracking_uri(registry.tracking_uri)
    weights = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{MODEL}/{version}",
                                                       dst_path=str(dest.parent / f"model-{version}")))
    return ModelBundle.build(
        dest, model=MODEL, version=version, weights=weights, spec=churn_spec().to_dict(),
        datasets=[BundleDataset(tier=t, path=f"data/{t}/churn", md5="1" * 32, size=10, site="onprem-dc1")
                  for t in ("raw", "curated", "approved")],
        evaluation={"metrics": {"auc": 0.8}}, lineage={"hybridtrain.spec_hash": "ab" * 32},
        checkpoint_sha256=None, signing_key=key, environment={"python": "3.11"})
