"""Evaluation: a model's metrics on a labelled split, checked against thresholds and compared with the champion.

Metrics (``hybridtrain.specs.job.METRICS``): auc, accuracy, f1, precision, recall and log_loss,
computed with scikit-learn from predicted probabilities, plus ``n`` (rows) and
``positive_rate`` (share of rows whose true label is 1). Threshold-based metrics classify a
row positive when its probability is >= ``threshold``. A split with a single class has no
AUC, which is a ``DataError``: the split is too small or was drawn wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from sklearn import metrics as skm
from torch import nn

from hybridtrain.datasets.label import binary_labels
from hybridtrain.errors import DataError, Problem
from hybridtrain.specs.job import HIGHER_IS_BETTER, METRICS
from hybridtrain.training.featurizer import Featurizer

# Differences this small are float noise, not improvement (0.81 - 0.80 is 0.010000000000000009).
TIE_TOLERANCE = 1e-12


def model_probabilities(model: nn.Module, x: np.ndarray | torch.Tensor, *, batch_size: int = 8192) -> np.ndarray:
    """P(label = 1) per row of a featurized matrix, as float64, computed on the model's device.

    Runs without gradients in eval mode (no dropout) and returns the model to its previous
    mode afterwards.
    """
    x = torch.as_tensor(x, dtype=torch.float32)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            parts = [torch.sigmoid(model(x[i:i + batch_size].to(device))).cpu() for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    probs = torch.cat(parts) if parts else torch.zeros(0)
    return probs.numpy().astype(np.float64)


def predict_proba(model: nn.Module, featurizer: Featurizer, df: pd.DataFrame, *, batch_size: int = 8192,
                  dataset: str = "input") -> np.ndarray:
    """P(label = 1) per row of ``df`` (featurized with ``featurizer``), as float64."""
    return model_probabilities(model, featurizer.transform(df, dataset=dataset), batch_size=batch_size)


def binary_metrics(y_true: np.ndarray, y_prob: np.ndarray, threshold: float = 0.5, *,
                   dataset: str = "test", label: str = "label") -> dict[str, float]:
    """All metrics for true 0/1 labels and predicted probabilities. Raises ``DataError`` for one class."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_true.shape != y_prob.shape or y_true.ndim != 1:
        raise ValueError(f"y_true {y_true.shape} and y_prob {y_prob.shape} must be 1-D and the same length")
    if len(y_true) == 0:
        raise DataError(dataset, [Problem("", f"the {dataset} split has no rows; check the split fractions")])
    classes = np.unique(y_true)
    if len(classes) < 2:
        raise DataError(
            dataset,
            [Problem(label, f"the {dataset} split has a single class ({label} is always {classes[0]:g}), so AUC "
                            "is undefined; use more data or check how the split is drawn")],
        )
    y = y_true.astype(int)
    pred = (y_prob >= threshold).astype(int)
    return {
        "auc": float(skm.roc_auc_score(y, y_prob)),
        "accuracy": float(skm.accuracy_score(y, pred)),
        "f1": float(skm.f1_score(y, pred, zero_division=0)),
        "precision": float(skm.precision_score(y, pred, zero_division=0)),
        "recall": float(skm.recall_score(y, pred, zero_division=0)),
        "log_loss": float(skm.log_loss(y, y_prob, labels=[0, 1])),
        "n": float(len(y)),
        "positive_rate": float(y.mean()),
    }


def evaluate(model: nn.Module, featurizer: Featurizer, df: pd.DataFrame, label: str, threshold: float = 0.5, *,
             dataset: str = "test") -> dict[str, float]:
    """Metrics of ``model`` on ``df`` (see the module docstring). ``dataset`` names the split in errors."""
    y = binary_labels(df, label, dataset=dataset)
    probs = predict_proba(model, featurizer, df, dataset=dataset)
    return binary_metrics(y, probs, threshold, dataset=dataset, label=label)


def check_thresholds(metrics: Mapping[str, float], thresholds: Mapping[str, float]) -> list[str]:
    """One human-readable line per threshold not met; empty when all pass.

    ``log_loss`` is a maximum; every other metric is a minimum. A threshold on a metric that
    was not computed (or is NaN) fails, so a typo cannot pass a gate.
    """
    failures = []
    for name, bound in thresholds.items():
        value = metrics.get(name)
        if value is None:
            failures.append(f"{name}: not computed (known metrics: {', '.join(METRICS)})")
        elif math.isnan(value):
            failures.append(f"{name}: is NaN, so it cannot meet {bound:g}")
        elif HIGHER_IS_BETTER.get(name, True) and value < bound:
            failures.append(f"{name} {value:.4f} is below the minimum {bound:g}")
        elif not HIGHER_IS_BETTER.get(name, True) and value > bound:
            failures.append(f"{name} {value:.4f} is above the maximum {bound:g}")
    return failures


@dataclass(frozen=True)
class Comparison:
    """Whether a candidate should replace the champion. ``delta`` is candidate − champion (None without one)."""

    better: bool
    delta: float | None
    reason: str


def compare(candidate: Mapping[str, float], champion: Mapping[str, float] | None, primary: str,
            min_improvement: float) -> Comparison:
    """Does the candidate beat the champion on ``primary`` by more than ``min_improvement``?

    No champion: better. Otherwise the improvement (delta, sign-flipped for log_loss where
    lower is better) must be strictly greater than ``min_improvement`` — a tie keeps the
    champion. Differences within ``TIE_TOLERANCE`` count as ties.
    """
    if primary not in HIGHER_IS_BETTER:
        raise ValueError(f"unknown primary metric {primary!r}; use one of {', '.join(METRICS)}")
    if min_improvement < 0:
        raise ValueError(f"min_improvement must be >= 0, got {min_improvement}")
    if primary not in candidate:
        raise ValueError(f"the candidate has no {primary!r} metric; evaluate it before comparing")
    cand = float(candidate[primary])
    if math.isnan(cand):
        return Comparison(False, None, f"candidate {primary} is NaN; it cannot replace anything")
    if champion is None:
        return Comparison(True, None, f"no champion yet; the candidate ({primary} {cand:.4f}) becomes the first")
    if primary not in champion or math.isnan(float(champion[primary])):
        raise ValueError(
            f"the champion has no usable {primary!r} metric; re-evaluate the champion on the same test split "
            "or choose another evaluation.primary_metric"
        )
    champ = float(champion[primary])
    delta = cand - champ
    improvement = delta if HIGHER_IS_BETTER[primary] else -delta
    direction = "higher" if HIGHER_IS_BETTER[primary] else "lower"
    detail = f"{primary} {cand:.4f} vs champion {champ:.4f} ({direction} is better, delta {delta:+.4f})"
    if improvement > min_improvement + TIE_TOLERANCE:
        return Comparison(True, delta, f"{detail} improves by more than {min_improvement:g}")
    if abs(improvement) <= TIE_TOLERANCE:
        return Comparison(False, delta, f"{detail}: a tie, so the champion stays")
    if improvement <= 0:
        return Comparison(False, delta, f"{detail}: worse than the champion")
    return Comparison(False, delta, f"{detail}: improves by no more than the required {min_improvement:g}")
