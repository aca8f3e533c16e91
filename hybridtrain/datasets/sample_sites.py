"""SampleSites: the sample churn data split over N sites, non-IID — each site its own regions, size and churn rate.

Site ``i`` of ``n`` gets the customers of a contiguous block of ``sample_data.REGIONS`` (so
sites differ in size and in their region mix: the first block holds London and the South East),
and keeps each churner with probability ``1 - 0.25 * i`` (so the label rate falls from site to
site). The same arguments give the same bytes, as for ``sample_data``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hybridtrain.datasets.sample_data import DEFAULT_SEED, REGIONS, generate_churn

#: Share of churners each further site drops (site i keeps 1 - CHURN_DROP_STEP * i of them, at least 25 %).
CHURN_DROP_STEP = 0.25


def split_by_site(frame: pd.DataFrame, n_sites: int, seed: int = DEFAULT_SEED) -> list[pd.DataFrame]:
    """``frame`` (from ``generate_churn``) split into ``n_sites`` non-IID parts, in site order."""
    if not 1 <= n_sites <= len(REGIONS):
        raise ValueError(f"n_sites must be between 1 and {len(REGIONS)}, got {n_sites}")
    blocks = np.array_split(np.arange(len(REGIONS)), n_sites)
    codes = frame["region"].cat.codes.to_numpy()
    parts = []
    for i, block in enumerate(blocks):
        part = frame[np.isin(codes, block)]
        keep_churn = max(1.0 - CHURN_DROP_STEP * i, 0.25)
        rng = np.random.default_rng([seed, i])
        churner = part["churned"].fillna(0).to_numpy() == 1
        keep = ~churner | (rng.random(len(part)) < keep_churn)
        parts.append(part[keep].reset_index(drop=True))
    return parts


def write_site_csvs(paths: list, rows: int, seed: int = DEFAULT_SEED) -> list:
    """Generate ``rows`` rows once and write site ``i``'s part to ``paths[i]`` (CSV, as ``write_churn_csv``)."""
    import os
    import tempfile
    from pathlib import Path

    parts = split_by_site(generate_churn(rows, seed), len(paths), seed)
    out = []
    for path, part in zip(paths, parts, strict=True):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".csv")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                part.to_csv(fh, index=False, lineterminator="\n", float_format="%.2f", date_format="%Y-%m-%d")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        out.append(path)
    return out
