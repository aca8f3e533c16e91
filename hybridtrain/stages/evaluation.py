"""Evaluation stage: test metrics of a trained model against thresholds and the current champion."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.model_registry import CHAMPION, Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from hybridtrain.stages.results import EvaluateResult
from hybridtrain.stages.site_access import dataset_at
from hybridtrain.training.featurizer import Featurizer


def evaluate(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, model_uri: str) -> EvaluateResult:
    """Test-set metrics of the candidate and of the current champion, on the same rows."""
    from hybridtrain.training import evaluation  # lazy: heavy (torch, scipy)

    started = time.perf_counter()
    progress.report("evaluate", "start", f"evaluate started at {site}: {model_uri}", site=site)
    sites = ws.load_sites()
    data_dir = dataset_at(ws, sites, approved, site, spec.dataset.site)
    test_df = partitioned.read(data_dir, ["test"])
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    label = spec.data_schema.label
    model, feat = registry.load_uri(model_uri)
    metrics = evaluation.evaluate(model, Featurizer.from_dict(feat), test_df, label)
    champ = registry.by_alias(spec.registry.model_name, CHAMPION)
    champ_metrics = None
    if champ is not None:
        cmodel, cfeat = registry.load(champ.name, champ.version)
        champ_metrics = evaluation.evaluate(cmodel, Featurizer.from_dict(cfeat), test_df, label)
    cmp = evaluation.compare(metrics, champ_metrics, spec.evaluation.primary_metric, spec.evaluation.min_improvement)
    failures = evaluation.check_thresholds(metrics, spec.evaluation.thresholds)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k in ("auc", "accuracy", "f1"))
    progress.report("evaluate", "verdict", f"evaluate verdict at {site}: {shown}; {cmp.reason}; "
                    + ("thresholds failed: " + "; ".join(failures) if failures else "thresholds met"),
                    site=site, better=cmp.better, seconds=time.perf_counter() - started)
    return EvaluateResult(
        metrics=metrics,
        champion_version=champ.version if champ else None,
        champion_metrics=champ_metrics,
        better=cmp.better,
        delta=cmp.delta,
        reason=cmp.reason,
        threshold_failures=failures,
        site=site,
        seconds=time.perf_counter() - started,
    )
