import json

import numpy as np
import pandas as pd
import pytest

from hybridtrain.errors import DataError
from hybridtrain.specs.job import FeatureSpec
from hybridtrain.training.featurizer import Featurizer


def test_numeric_median_imputation_indicator_and_standardization():
    train = pd.DataFrame({"x": [1.0, 2.0, np.nan, 5.0], "k": [3, 3, 3, 3]})
    f = Featurizer.fit(train, FeatureSpec(numeric=["x", "k"]))

    assert f.feature_names == ["x", "x__missing", "k"]
    # Median of {1, 2, 5} is 2; imputed column [1, 2, 2, 5] has mean 2.5 and std 1.5.
    filled = np.array([1.0, 2.0, 2.0, 5.0])
    expected_x = (filled - 2.5) / 1.5
    out = f.transform(train)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0], expected_x, rtol=1e-6)
    np.testing.assert_array_equal(out[:, 1], [0, 0, 1, 0])
    # A constant column keeps std 1, so it becomes all zeros rather than NaN.
    np.testing.assert_array_equal(out[:, 2], [0, 0, 0, 0])

    # New data: missing values are imputed with the *train* median and flagged.
    new = pd.DataFrame({"x": [np.nan, 8.0], "k": [4, np.nan]})
    out = f.transform(new)
    np.testing.assert_allclose(out[:, 0], [(2.0 - 2.5) / 1.5, (8.0 - 2.5) / 1.5], rtol=1e-6)
    np.testing.assert_array_equal(out[:, 1], [1, 0])
    np.testing.assert_array_equal(out[:, 2], [1, 0])  # k had no gaps in train: no indicator, median 3


def test_column_without_train_gaps_gets_no_indicator_and_bools_are_numbers():
    train = pd.DataFrame({"flag": [True, False, True, True], "n": pd.array([1, None, 3, 4], dtype="Int64")})
    f = Featurizer.fit(train, FeatureSpec(numeric=["flag", "n"]))
    assert f.feature_names == ["flag", "n", "n__missing"]
    out = f.transform(train)
    # flag: mean 0.75, std sqrt(0.1875)
    np.testing.assert_allclose(out[:, 0], (np.array([1, 0, 1, 1]) - 0.75) / np.sqrt(0.1875), rtol=1e-6)
    np.testing.assert_array_equal(out[:, 2], [0, 1, 0, 0])


def test_one_hot_sorted_vocabulary_with_other_bucket_for_unseen_and_null():
    train = pd.DataFrame({"c": ["b", "a", "b", None, "c"]})
    f = Featurizer.fit(train, FeatureSpec(categorical=["c"]))
    assert f.feature_names == ["c=a", "c=b", "c=c", "c=__other__"]
    out = f.transform(pd.DataFrame({"c": ["c", "a", "zzz", None]}))
    np.testing.assert_array_equal(
        out, [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]]
    )
    assert (out.sum(axis=1) == 1).all()


def test_vocabulary_is_capped_at_the_most_frequent_values():
    values = ["a"] * 5 + ["b"] * 4 + ["c"] * 3 + ["d"] * 1 + ["e"] * 1
    f = Featurizer.fit(pd.DataFrame({"c": values}), FeatureSpec(categorical=["c"]), max_categories=3)
    assert f.feature_names == ["c=a", "c=b", "c=c", "c=__other__"]
    out = f.transform(pd.DataFrame({"c": ["d", "a"]}))
    np.testing.assert_array_equal(out, [[0, 0, 0, 1], [1, 0, 0, 0]])


def test_round_trip_through_json_transforms_identically():
    rng = np.random.default_rng(3)
    n = 500
    train = pd.DataFrame({
        "x": np.where(rng.random(n) < 0.1, np.nan, rng.normal(10, 3, n)),
        "y": rng.integers(0, 100, n),
        "c": rng.choice(["red", "green", "blue", None], n),
    })
    f = Featurizer.fit(train, FeatureSpec(numeric=["x", "y"], categorical=["c"]))
    g = Featurizer.from_dict(json.loads(json.dumps(f.to_dict())))
    assert g == f
    assert g.feature_names == f.feature_names
    assert g.n_features == f.n_features == 2 + 1 + 4
    a, b = f.transform(train), g.transform(train)
    assert a.tobytes() == b.tobytes()


def test_missing_feature_column_is_a_data_error_naming_it():
    f = Featurizer.fit(pd.DataFrame({"x": [1.0, 2.0], "c": ["a", "b"]}), FeatureSpec(numeric=["x"], categorical=["c"]))
    with pytest.raises(DataError) as err:
        f.transform(pd.DataFrame({"x": [1.0]}), dataset="test")
    assert [p.path for p in err.value.problems] == ["c"]
    assert "model.features" in str(err.value)

    with pytest.raises(DataError) as err:
        Featurizer.fit(pd.DataFrame({"x": [1.0]}), FeatureSpec(numeric=["x", "tenure"]))
    assert "tenure" in str(err.value)


def test_non_numeric_value_in_numeric_feature_is_a_data_error():
    with pytest.raises(DataError) as err:
        Featurizer.fit(pd.DataFrame({"x": ["1", "two", None]}), FeatureSpec(numeric=["x"]))
    assert err.value.problems[0].path == "x"
    assert "categorical" in str(err.value)


def test_unknown_format_is_refused_with_a_fix():
    with pytest.raises(ValueError) as err:
        Featurizer.from_dict({"format": 99, "numeric": [], "categorical": []})
    assert "re-train" in str(err.value)
