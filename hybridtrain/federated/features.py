"""FeatureStats: what a site tells the aggregator about its features, and the one global featurizer merged from them.

Every site must turn rows into the same input columns with the same scaling, or their weights
cannot be averaged. Each site fits a featurizer on its own approved training split and sends
its statistics (per numeric column: rows, mean, standard deviation, median, whether values are
missing; per categorical column: its vocabulary) — aggregates of approved data, never rows.
The merge pools means and variances exactly (weighted by rows); the median is the row-weighted
mean of the site medians (an approximation, used only to impute gaps); the vocabulary is the
sorted union, capped like a local one.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from hybridtrain.training.featurizer import MAX_CATEGORIES, CategoricalColumn, Featurizer, NumericColumn


class SiteFeatureStats(BaseModel):
    """One site's featurizer statistics and the rows they were computed on."""

    site: str
    rows: int
    featurizer: dict[str, Any]


def merge(stats: list[SiteFeatureStats], max_categories: int = MAX_CATEGORIES) -> Featurizer:
    """The global featurizer from every site's statistics (column order from the first site)."""
    if not stats:
        raise ValueError("no site statistics to merge")
    fitted = [(s.rows, Featurizer.from_dict(s.featurizer)) for s in stats]
    total = sum(n for n, _ in fitted)
    numeric = []
    for j, col in enumerate(fitted[0][1].numeric):
        cols = [(n, f.numeric[j]) for n, f in fitted]
        mean = sum(n * c.mean for n, c in cols) / total
        second = sum(n * (c.std ** 2 + c.mean ** 2) for n, c in cols) / total
        std = math.sqrt(max(second - mean ** 2, 0.0))
        median = sum(n * c.median for n, c in cols) / total
        numeric.append(NumericColumn(col.name, median, mean, std if std > 0 else 1.0,
                                     any(c.missing_indicator for _, c in cols)))
    categorical = []
    for j, col in enumerate(fitted[0][1].categorical):
        vocab = sorted({v for _, f in fitted for v in f.categorical[j].vocabulary})
        categorical.append(CategoricalColumn(col.name, tuple(vocab[:max_categories])))
    return Featurizer(numeric, categorical)
