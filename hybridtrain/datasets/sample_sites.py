"""SampleSites: the sample churn data split over N sites, non-IID — each site its own regions, size and churn rate.

Site ``i`` of ``n`` gets the customers of a contiguous block of ``sample_data.REGIONS`` (so
sites differ in size and in their region mix: the first block holds London and the South East),
and keeps each churner with probability ``1 - 0.25 * i`` (so the label rate falls from site to
site). The same arguments give the same bytes, as for ``sample_data``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hybridtrain.datasets.sample_data import DEFAULT_SEED, MIN_ROWS, POSTCODE_AREAS, REGIONS, generate_churn

#: Share of churners each further site drops (site i keeps 1 - CHURN_DROP_STEP * i of them, at least 25 %).
CHURN_DROP_STEP = 0.25
#: Most sites the sample can be split over: each site gets at least one region.
MAX_SITES = len(REGIONS)
#: The sample's churn rate (about 25 %), for the expected size of each site's part.
CHURN_RATE = 0.25


def expected_shares(n_sites: int) -> list[float]:
    """The share of the generated rows each of ``n_sites`` sites is expected to keep (its regions'
    population share, less the churners it drops), in site order; e.g. 3 sites: about 47 %, 30 %, 18 %."""
    if not 1 <= n_sites <= MAX_SITES:
        raise ValueError(f"n_sites must be between 1 and {MAX_SITES}, got {n_sites}")
    population = np.zeros(len(REGIONS))
    for _, region, pop, _ in POSTCODE_AREAS:
        population[REGIONS.index(region)] += pop
    share = population / population.sum()
    blocks = np.array_split(np.arange(len(REGIONS)), n_sites)
    return [float(share[block].sum()) * (1.0 - CHURN_RATE * (1.0 - _keep_churn(i))) for i, block in enumerate(blocks)]


def min_rows(n_sites: int, per_site: int = MIN_ROWS) -> int:
    """Fewest rows to generate so that every one of ``n_sites`` parts holds ``per_site`` rows, rounded up to a
    hundred; e.g. 100 for 1 site, 800 for 3, 6,600 for 12. Which region a customer lives in is random, so a
    part's size varies around its expected share: the smallest is aimed at three standard deviations above
    ``per_site``."""
    target = per_site if n_sites == 1 else per_site + 3 * math.sqrt(per_site)  # one site keeps every row
    return math.ceil(round(target / min(expected_shares(n_sites)) / 100, 6)) * 100  # 1.0000000001 is 1


def _keep_churn(i: int) -> float:
    return max(1.0 - CHURN_DROP_STEP * i, 0.25)


def split_by_site(frame: pd.DataFrame, n_sites: int, seed: int = DEFAULT_SEED) -> list[pd.DataFrame]:
    """``frame`` (from ``generate_churn``) split into ``n_sites`` non-IID parts, in site order."""
    if not 1 <= n_sites <= MAX_SITES:
        raise ValueError(f"n_sites must be between 1 and {MAX_SITES}, got {n_sites}")
    blocks = np.array_split(np.arange(len(REGIONS)), n_sites)
    codes = frame["region"].cat.codes.to_numpy()
    parts = []
    for i, block in enumerate(blocks):
        part = frame[np.isin(codes, block)]
        keep_churn = _keep_churn(i)
        rng = np.random.default_rng([seed, i])
        churner = part["churned"].fillna(0).to_numpy() == 1
        keep = ~churner | (rng.random(len(part)) < keep_churn)
        parts.append(part[keep].reset_index(drop=True))
    return parts


def site_parts(rows: int, n_sites: int, seed: int = DEFAULT_SEED) -> list[pd.DataFrame]:
    """Generate ``rows`` rows once and split them over ``n_sites`` (``split_by_site``); nothing is written."""
    return split_by_site(generate_churn(rows, seed), n_sites, seed)


def write_site_csvs(paths: list, rows: int, seed: int = DEFAULT_SEED) -> list:
    """Generate ``rows`` rows once and write site ``i``'s part to ``paths[i]`` (CSV, as ``write_churn_csv``)."""
    return write_parts(paths, site_parts(rows, len(paths), seed))


def write_parts(paths: list, parts: list[pd.DataFrame]) -> list:
    """Write ``parts[i]`` (from ``site_parts``) to ``paths[i]``, each atomically (CSV, as ``write_churn_csv``)."""
    import os
    from pathlib import Path

    from hybridtrain.storage import staging

    out = []
    for path, part in zip(paths, parts, strict=True):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = staging.staged_file(path.parent, suffix=".csv")
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
