"""PartitionedDataset: a table stored as Parquet files by split and entity-hash partition.

Layout: ``<dir>/split=<train|val|test>/part-<NNNNN>.parquet``. Rows go to a partition by a
keyed hash of their entity key — or, with ``layout.partition_by``, by a column's period
(``period_id``: ``2024`` / ``20243`` / ``202407`` for year / quarter / month) or hashed value —
are sorted by the entity key inside it, and are written with fixed
writer settings, so a partition whose rows did not change is byte-identical to its previous
version; DVC's content addressing then moves only the partitions that changed. A directory is
written next to the target and swapped in whole, so readers never see a half-written version.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hybridtrain.storage.staging import staged_dir

SPLITS = ("train", "val", "test")
SPLIT_COL = "split"
PARTITION_COL = "partition"


def keyed_hash(values: pd.Series, salt: str) -> np.ndarray:
    """Stable 64-bit hash of each value (as text) under a salt; same input, same output, any platform."""
    key = (salt.encode() + b"\0" * 16)[:16].decode("latin-1")
    return pd.util.hash_pandas_object(values.astype("string"), index=False, hash_key=key).to_numpy()


def unit_interval(values: pd.Series, salt: str) -> np.ndarray:
    """Map each value to a stable number in [0, 1) (for splits and sampling that survive data changes)."""
    return (keyed_hash(values, salt) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def period_id(values: pd.Series, period: str) -> np.ndarray:
    """Partition number of each date (ISO text or datetime) by period: year ``2024``, quarter
    ``20243`` (year × 10 + quarter), month ``202407`` (year × 100 + month); a missing date → 0."""
    dt = pd.to_datetime(values, format="ISO8601", errors="coerce")
    year = dt.dt.year
    if period == "year":
        out = year
    elif period == "quarter":
        out = year * 10 + dt.dt.quarter
    elif period == "month":
        out = year * 100 + dt.dt.month
    else:
        raise ValueError(f"unknown period {period!r}; use month, quarter or year")
    return out.fillna(0).astype("int32").to_numpy()


def write(frame: pd.DataFrame, target: Path, sort_by: str | None) -> list[Path]:
    """Write ``frame`` (with split and partition columns) as a new version of ``target``, atomically."""
    missing = {SPLIT_COL, PARTITION_COL} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks layout columns {sorted(missing)}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staged_dir(target.parent, tag=f".{target.name}")  # a killed writer's leftovers go first
    written: list[Path] = []
    try:
        for (split, part), rows in frame.groupby([SPLIT_COL, PARTITION_COL], sort=True, observed=True):
            if sort_by is not None:
                rows = rows.sort_values(sort_by, kind="mergesort")
            rows = rows.drop(columns=[SPLIT_COL]).reset_index(drop=True)
            out = staging / f"split={split}" / f"part-{int(part):05d}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pandas(rows, preserve_index=False)
            # Drop pandas' schema metadata: it embeds library versions and would change bytes.
            table = table.replace_schema_metadata(None)
            pq.write_table(table, out, compression="zstd", write_statistics=True, use_dictionary=True)
            written.append(target / out.relative_to(staging))
        _swap(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written


def _swap(staging: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def files(directory: Path, splits: Iterable[str] | None = None) -> Iterator[Path]:
    wanted = set(splits) if splits is not None else None
    for split_dir in sorted(Path(directory).glob("split=*")):
        split = split_dir.name.split("=", 1)[1]
        if wanted is None or split in wanted:
            yield from sorted(split_dir.glob("part-*.parquet"))


def read(directory: Path, splits: Iterable[str] | None = None) -> pd.DataFrame:
    """Read the dataset (or some splits of it) back, with the split column restored."""
    frames = []
    for f in files(directory, splits):
        df = pq.read_table(f).to_pandas()
        df[SPLIT_COL] = f.parent.name.split("=", 1)[1]
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
