"""Label: the binary target column of a frame, checked and read as 0/1.

Accepted encodings: booleans, the numbers 0 and 1, and the strings "0"/"1"/"true"/"false"
(any case). Anything else — nulls, other numbers, other strings — is a ``DataError`` naming
the column, because a silently re-coded label trains the wrong model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hybridtrain.errors import DataError, Problem

_TEXT = {"0": 0.0, "1": 1.0, "false": 0.0, "true": 1.0}


def binary_labels(df: pd.DataFrame, label: str, *, dataset: str = "input") -> np.ndarray:
    """The label column as a float32 array of 0.0/1.0. Raises ``DataError`` naming the column."""
    if label not in df.columns:
        raise DataError(
            dataset,
            [Problem(label, f"label column is missing from the {dataset} frame; add it or fix schema.label "
                            "in the job spec")],
        )
    series = df[label]
    nulls = int(series.isna().sum())
    if nulls:
        raise DataError(
            dataset,
            [Problem(label, f"{nulls} row(s) have no label; drop them in preprocessing before training")],
        )

    if pd.api.types.is_bool_dtype(series.dtype) or pd.api.types.is_numeric_dtype(series.dtype):
        # Vectorized path for the common encodings; the per-value path below handles objects.
        numbers = series.to_numpy(dtype=np.float64)
        if np.isin(numbers, (0.0, 1.0)).all():
            return numbers.astype(np.float32)

    def read(v: object) -> float | None:
        if isinstance(v, (bool, np.bool_)):
            return float(v)
        if isinstance(v, (int, float, np.integer, np.floating)):
            return float(v) if v in (0, 1) else None
        if isinstance(v, str):
            return _TEXT.get(v.strip().lower())
        return None

    values = series.astype("object").map(read)
    bad = values.isna()
    if bad.any():
        examples = sorted({repr(v) for v in series[bad].unique()[:5]})
        raise DataError(
            dataset,
            [Problem(label, f"label must be binary (0/1 or true/false) but has {', '.join(examples)}; "
                            "map it to 0/1 in preprocessing or choose another schema.label")],
        )
    return values.to_numpy(dtype=np.float32)
