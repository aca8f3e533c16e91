"""Featurizer: the mapping, fitted on the training split, from a frame's feature columns to the model's float32 matrix.

Numeric columns (bool included) become floats: missing values are imputed with the training
median, a ``<col>__missing`` indicator column is added when the training data had gaps, and the
result is standardized with the training mean and standard deviation (a constant column keeps
std 1). Categorical columns are one-hot encoded over the training vocabulary — the most frequent
values, at most ``max_categories``, in sorted order — plus a ``<col>=__other__`` column that
takes unseen values and nulls. The fitted statistics are plain Python numbers, so ``to_dict()``
is JSON-serializable and ``from_dict(to_dict())`` transforms bit-identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from hybridtrain.errors import DataError, Problem
from hybridtrain.specs.job import FeatureSpec

FORMAT_VERSION = 1
MAX_CATEGORIES = 50
MISSING_SUFFIX = "__missing"
OTHER = "__other__"


@dataclass(frozen=True)
class NumericColumn:
    """How one numeric column is imputed and standardized (statistics from the training split)."""

    name: str
    median: float
    mean: float
    std: float
    missing_indicator: bool


@dataclass(frozen=True)
class CategoricalColumn:
    """The training vocabulary of one categorical column; anything else goes to the other bucket."""

    name: str
    vocabulary: tuple[str, ...]


def _missing_columns(df: pd.DataFrame, columns: Sequence[str], dataset: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(
            dataset,
            [
                Problem(c, "feature column is missing from the frame; add it to the data or remove it "
                           "from model.features in the job spec")
                for c in missing
            ],
        )


def _as_float(series: pd.Series, dataset: str) -> np.ndarray:
    """The column as float64 with NaN for missing values; non-numeric values are a DataError."""
    if pd.api.types.is_bool_dtype(series.dtype) or pd.api.types.is_numeric_dtype(series.dtype):
        # to_numpy with na_value handles nullable (masked) dtypes such as Int64 and boolean.
        return series.to_numpy(dtype="float64", na_value=np.nan)
    values = series.astype("object")
    # Python bools in an object column are numbers here, not category names.
    values = values.map(lambda v: float(v) if isinstance(v, (bool, np.bool_)) else v)
    coerced = pd.to_numeric(values, errors="coerce")
    bad = coerced.isna() & series.notna()
    if bad.any():
        example = series[bad].iloc[0]
        raise DataError(
            dataset,
            [Problem(str(series.name), f"{int(bad.sum())} value(s) are not numbers (e.g. {example!r}); "
                                       "clean the column or list it under model.features.categorical")],
        )
    return coerced.to_numpy(dtype="float64", na_value=np.nan)


def _as_category(series: pd.Series) -> pd.Series:
    """Category names as strings; nulls stay null."""
    return series.astype("object").where(series.notna(), None).map(lambda v: None if v is None else str(v))


class Featurizer:
    """Turns frames into the model's input matrix using statistics fitted on the training split."""

    def __init__(self, numeric: Sequence[NumericColumn], categorical: Sequence[CategoricalColumn]):
        self.numeric = tuple(numeric)
        self.categorical = tuple(categorical)
        names: list[str] = []
        for col in self.numeric:
            names.append(col.name)
            if col.missing_indicator:
                names.append(col.name + MISSING_SUFFIX)
        for col in self.categorical:
            names.extend(f"{col.name}={v}" for v in col.vocabulary)
            names.append(f"{col.name}={OTHER}")
        self._names = tuple(names)

    @classmethod
    def fit(
        cls,
        train: pd.DataFrame,
        features: FeatureSpec,
        *,
        max_categories: int = MAX_CATEGORIES,
        dataset: str = "train",
    ) -> Featurizer:
        """Fit on the training frame. Raises ``DataError`` naming any feature column it lacks."""
        if max_categories < 1:
            raise ValueError(f"max_categories must be at least 1, got {max_categories}")
        _missing_columns(train, [*features.numeric, *features.categorical], dataset)
        if len(train) == 0:
            raise DataError(dataset, [Problem("", "the frame has no rows, so nothing can be fitted; "
                                                  "check the split fractions and the dataset version")])
        numeric = []
        for name in features.numeric:
            values = _as_float(train[name], dataset)
            missing = np.isnan(values)
            # A column that is entirely missing in train imputes 0 (and relies on its indicator).
            median = float(np.median(values[~missing])) if (~missing).any() else 0.0
            filled = np.where(missing, median, values)
            mean = float(filled.mean())
            std = float(filled.std())
            if not np.isfinite(std) or std == 0.0:
                std = 1.0
            numeric.append(NumericColumn(name, median, mean, std, bool(missing.any())))
        categorical = []
        for name in features.categorical:
            counts = _as_category(train[name]).value_counts(dropna=True)
            # Most frequent first; ties broken by name so the vocabulary is deterministic.
            ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_categories]
            vocab = tuple(sorted(str(v) for v, _ in ranked))
            categorical.append(CategoricalColumn(name, vocab))
        return cls(numeric, categorical)

    @property
    def feature_names(self) -> list[str]:
        """Names of the output columns, in order."""
        return list(self._names)

    @property
    def n_features(self) -> int:
        return len(self._names)

    @property
    def columns(self) -> list[str]:
        """The input columns the featurizer reads."""
        return [c.name for c in self.numeric] + [c.name for c in self.categorical]

    def transform(self, df: pd.DataFrame, *, dataset: str = "input") -> np.ndarray:
        """The (rows, n_features) float32 matrix for ``df``; extra columns are ignored."""
        _missing_columns(df, self.columns, dataset)
        out = np.zeros((len(df), self.n_features), dtype=np.float32)
        j = 0
        for col in self.numeric:
            values = _as_float(df[col.name], dataset)
            missing = np.isnan(values)
            filled = np.where(missing, col.median, values)
            out[:, j] = (filled - col.mean) / col.std
            j += 1
            if col.missing_indicator:
                out[:, j] = missing
                j += 1
        rows = np.arange(len(df))
        for col in self.categorical:
            codes = pd.Categorical(_as_category(df[col.name]), categories=list(col.vocabulary)).codes
            # Code -1 (unseen or null) lands in the other bucket, the last column of the block.
            codes = np.where(codes < 0, len(col.vocabulary), codes)
            out[rows, j + codes] = 1.0
            j += len(col.vocabulary) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (plain lists, strings and floats)."""
        return {
            "format": FORMAT_VERSION,
            "numeric": [asdict(c) for c in self.numeric],
            "categorical": [{"name": c.name, "vocabulary": list(c.vocabulary)} for c in self.categorical],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Featurizer:
        """Rebuild from ``to_dict()`` output."""
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"featurizer format {data.get('format')!r} is not supported (expected {FORMAT_VERSION}); "
                "re-train the model with this version of hybridtrain"
            )
        numeric = [NumericColumn(**c) for c in data["numeric"]]
        categorical = [CategoricalColumn(c["name"], tuple(c["vocabulary"])) for c in data["categorical"]]
        return cls(numeric, categorical)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Featurizer):
            return NotImplemented
        return self.numeric == other.numeric and self.categorical == other.categorical

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Featurizer({len(self.numeric)} numeric, {len(self.categorical)} categorical -> {self.n_features} features)"
