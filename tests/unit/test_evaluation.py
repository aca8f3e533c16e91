import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from hybridtrain.errors import DataError
from hybridtrain.specs.job import FeatureSpec
from hybridtrain.training.evaluation import binary_metrics, check_thresholds, compare, evaluate
from hybridtrain.training.featurizer import Featurizer

# Hand-checked case: threshold 0.5 predicts [1, 0, 0, 1, 1, 0], so TP=2 (rows 0, 3),
# FN=1 (row 2), FP=1 (row 4), TN=2 (rows 1, 5). Of the 9 positive/negative pairs, 8 rank the
# positive higher (only 0.4 < 0.6 does not), so AUC = 8/9.
Y = np.array([1, 0, 1, 1, 0, 0])
P = np.array([0.9, 0.2, 0.4, 0.7, 0.6, 0.1])


def test_metrics_match_hand_computed_values():
    m = binary_metrics(Y, P)
    assert m["auc"] == pytest.approx(8 / 9)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    expected_ll = -np.mean(np.log([0.9, 0.8, 0.4, 0.7, 0.4, 0.9]))
    assert m["log_loss"] == pytest.approx(expected_ll)
    assert m["n"] == 6
    assert m["positive_rate"] == 0.5


def test_threshold_moves_the_decision():
    m = binary_metrics(Y, P, threshold=0.65)  # predicts [1, 0, 0, 1, 0, 0]: TP=2, FN=1, FP=0
    assert m["precision"] == 1.0
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["accuracy"] == pytest.approx(5 / 6)
    assert m["auc"] == pytest.approx(8 / 9)  # ranking metric: unchanged
    # A probability equal to the threshold counts as positive.
    assert binary_metrics(Y, P, threshold=0.4)["recall"] == 1.0


def test_no_positive_predictions_give_zero_precision_not_an_error():
    m = binary_metrics(Y, P, threshold=0.95)
    assert m["precision"] == 0.0
    assert m["recall"] == 0.0
    assert m["f1"] == 0.0


def test_single_class_split_is_a_data_error():
    with pytest.raises(DataError) as err:
        binary_metrics(np.ones(4), np.full(4, 0.7), dataset="test", label="churned")
    assert err.value.problems[0].path == "churned"
    assert "test split has a single class" in str(err.value)


class Identity(nn.Module):
    """Undoes the featurizer's standardization so the logit is the raw 'logit' column."""

    def __init__(self, mean, std):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        with torch.no_grad():
            self.lin.weight.fill_(std)
            self.lin.bias.fill_(mean)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def test_evaluate_runs_the_model_on_the_featurized_frame():
    df = pd.DataFrame({"logit": np.log(P / (1 - P)), "churned": Y})
    f = Featurizer.fit(df, FeatureSpec(numeric=["logit"]))
    col = f.numeric[0]
    model = Identity(col.mean, col.std).train()
    m = evaluate(model, f, df, "churned")
    assert m["auc"] == pytest.approx(8 / 9)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["log_loss"] == pytest.approx(binary_metrics(Y, P)["log_loss"], rel=1e-5)
    assert model.training  # mode restored

    with pytest.raises(DataError) as err:
        evaluate(model, f, df.drop(columns="churned"), "churned")
    assert "churned" in str(err.value)


def test_check_thresholds_minimums_and_log_loss_maximum():
    metrics = {"auc": 0.80, "accuracy": 0.70, "log_loss": 0.45}
    assert check_thresholds(metrics, {"auc": 0.75, "log_loss": 0.5}) == []
    assert check_thresholds(metrics, {"auc": 0.80}) == []  # equal to a minimum passes
    failures = check_thresholds(metrics, {"auc": 0.85, "accuracy": 0.7, "log_loss": 0.4})
    assert len(failures) == 2
    assert "auc 0.8000 is below the minimum 0.85" in failures[0]
    assert "log_loss 0.4500 is above the maximum 0.4" in failures[1]


def test_check_thresholds_fails_on_missing_or_nan_metric():
    failures = check_thresholds({"auc": math.nan}, {"auc": 0.5, "f1": 0.5})
    assert len(failures) == 2
    assert "NaN" in failures[0]
    assert "f1: not computed" in failures[1]


def test_compare_without_champion_is_better():
    c = compare({"auc": 0.6}, None, "auc", 0.0)
    assert c.better
    assert c.delta is None
    assert "no champion" in c.reason


def test_compare_requires_strictly_more_than_min_improvement():
    assert compare({"auc": 0.82}, {"auc": 0.80}, "auc", 0.01).better
    tie = compare({"auc": 0.80}, {"auc": 0.80}, "auc", 0.0)
    assert not tie.better
    assert tie.delta == 0.0
    assert "tie" in tie.reason
    # Exactly the margin (0.81 - 0.80 is 0.010000000000000009 in floats) is not "more than".
    at_margin = compare({"auc": 0.81}, {"auc": 0.80}, "auc", 0.01)
    assert not at_margin.better
    assert "no more than" in at_margin.reason
    worse = compare({"auc": 0.79}, {"auc": 0.80}, "auc", 0.0)
    assert not worse.better
    assert worse.delta == pytest.approx(-0.01)
    assert "worse" in worse.reason


def test_compare_log_loss_lower_is_better():
    better = compare({"log_loss": 0.30}, {"log_loss": 0.40}, "log_loss", 0.05)
    assert better.better
    assert better.delta == pytest.approx(-0.10)
    assert not compare({"log_loss": 0.40}, {"log_loss": 0.30}, "log_loss", 0.0).better
    assert not compare({"log_loss": 0.36}, {"log_loss": 0.40}, "log_loss", 0.05).better


def test_compare_refuses_unknown_or_missing_metrics():
    with pytest.raises(ValueError) as err:
        compare({"auc": 0.9}, None, "roc", 0.0)
    assert "auc" in str(err.value)
    with pytest.raises(ValueError):
        compare({"auc": 0.9}, {"f1": 0.5}, "auc", 0.0)
    assert not compare({"auc": math.nan}, None, "auc", 0.0).better
