"""Preprocessor: turns a raw dataset into the curated one — schema checked, cleaned, split, partitioned.

Steps, each deterministic: read the raw file; check it against the spec's schema (missing
column, unparsable values, empty file, all-null label, non-binary label, missing entity keys
→ ``DataError`` naming the column and what to fix); keep only declared columns (an undeclared
column could carry personal data nobody classified); clean (trim text, lower-case type email,
drop rows without a label, keep one row per entity key); assign each entity to train/val/test
by a keyed hash of its key so the split survives data changes; assign a partition — a keyed
hash of the entity key, or ``layout.partition_by`` (a date's period, another column's hash).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hybridtrain.datasets import partitioned
from hybridtrain.errors import DataError, Problem
from hybridtrain.specs.job import TEXT_TYPES, ColumnType, JobSpec

TRUE_WORDS = {"true", "1", "yes", "y", "t"}
FALSE_WORDS = {"false", "0", "no", "n", "f"}


@dataclass
class CleanReport:
    rows_in: int = 0
    rows_out: int = 0
    duplicates_removed: int = 0
    null_label_removed: int = 0
    undeclared_columns_dropped: list[str] = field(default_factory=list)
    split_counts: dict[str, int] = field(default_factory=dict)
    positive_rate: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Preprocessor:
    """Validate → clean → split → partition, driven by one job spec."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.schema = spec.data_schema

    # -- read + validate ---------------------------------------------------------------------

    def read(self, path: Path) -> pd.DataFrame:
        path = Path(path)
        name = self.spec.dataset.path
        if not path.exists():
            raise DataError(name, [Problem(name, f"file not found at {path}")])
        if path.is_file() and path.stat().st_size == 0:
            raise DataError(name, [Problem(name, "the file is empty; expected a header row and data rows")])
        try:
            if self.spec.dataset.format == "csv":
                df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
            else:
                df = pd.read_parquet(path)
        except pd.errors.EmptyDataError:
            raise DataError(name, [Problem(name, "the file is empty; expected a header row and data rows")]) from None
        except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
            raise DataError(name, [Problem(name, f"cannot be parsed as {self.spec.dataset.format}: {exc}")]) from None
        if df.empty:
            raise DataError(name, [Problem(name, "the file has a header but no data rows")])
        return df

    def validate(self, df: pd.DataFrame) -> pd.DataFrame:
        """Coerce declared types; raise one DataError listing every column problem."""
        name = self.spec.dataset.path
        problems: list[Problem] = []
        out = pd.DataFrame(index=df.index)
        for col, ctype in self.schema.columns.items():
            if col not in df.columns:
                problems.append(Problem(col, f"column is missing (schema.columns.{col} declares it as {ctype.value})"))
                continue
            coerced, bad = _coerce(df[col], ctype)
            if bad.any():
                rows = np.flatnonzero(bad.to_numpy())
                examples = ", ".join(repr(v) for v in df[col][bad].head(3).tolist())
                problems.append(
                    Problem(col, f"{int(bad.sum())} value(s) are not {ctype.value} (e.g. {examples} "
                                 f"at data row {int(rows[0]) + 1}); fix the data or schema.columns.{col}")
                )
            out[col] = coerced
        label, key = self.schema.label, self.schema.entity_key
        if label in out.columns and not problems:
            values = out[label].dropna()
            if values.empty:
                problems.append(Problem(label, "the label column is empty in every row"))
            elif not set(values.astype("int64").unique()) <= {0, 1}:
                problems.append(Problem(label, f"the label must be binary 0/1, found {sorted(values.unique())[:5]}"))
        if key in out.columns and out[key].isna().all():
            problems.append(Problem(key, "the entity key is empty in every row"))
        if problems:
            raise DataError(name, problems)
        return out

    # -- clean, split, partition -------------------------------------------------------------

    def clean(self, df: pd.DataFrame, report: CleanReport) -> pd.DataFrame:
        label, key = self.schema.label, self.schema.entity_key
        for col, ctype in self.schema.columns.items():
            if ctype in TEXT_TYPES:
                df[col] = df[col].str.strip()
                if ctype is ColumnType.email:  # by declared type, whatever the column is called
                    df[col] = df[col].str.lower()
        before = len(df)
        df = df[df[label].notna()]
        report.null_label_removed = before - len(df)
        before = len(df)
        df = df[df[key].notna()]
        # Keep the last record per entity: exports append corrections after the original row.
        df = df.drop_duplicates(subset=[key], keep="last")
        report.duplicates_removed = before - len(df)
        df = df.copy()
        df[label] = df[label].astype("int64")
        return df

    def assign(self, df: pd.DataFrame) -> pd.DataFrame:
        """Add the split column (keyed hash of the entity key) and the partition column.

        The partition is a keyed hash of the entity key into ``layout.partitions`` buckets, or with
        ``layout.partition_by`` the period of a date (``signup_date:month`` → ``202407``) or a
        keyed hash of another column's value — so rows of one period share their files.
        """
        key = df[self.schema.entity_key]
        u = partitioned.unit_interval(key, f"split:{self.spec.split.seed}")
        s = self.spec.split
        split = np.where(u < s.train, "train", np.where(u < s.train + s.val, "val", "test"))
        df[partitioned.SPLIT_COL] = split
        n = np.uint64(self.spec.layout.partitions)
        by = self.spec.layout.partition_column
        if by is None:
            part = partitioned.keyed_hash(key, "partition") % n
        elif by[1] is not None:
            part = partitioned.period_id(df[by[0]], by[1])
        else:
            part = partitioned.keyed_hash(df[by[0]], "partition") % n
        df[partitioned.PARTITION_COL] = part.astype("int32")
        return df

    def run(self, raw_path: Path, curated_dir: Path) -> CleanReport:
        """The whole step: raw file in, curated partitioned dataset out (atomically replaced)."""
        report = CleanReport()
        raw = self.read(raw_path)
        report.rows_in = len(raw)
        report.undeclared_columns_dropped = [c for c in raw.columns if c not in self.schema.columns]
        df = self.clean(self.validate(raw), report)
        df = self.assign(df)
        report.rows_out = len(df)
        for name in partitioned.SPLITS:
            report.split_counts[name] = int((df[partitioned.SPLIT_COL] == name).sum())
        empty = [n for n, c in report.split_counts.items() if c == 0]
        if empty:
            raise DataError(
                self.spec.dataset.path,
                [Problem("split", f"split(s) {empty} received no rows from {report.rows_out} cleaned rows; "
                                  "use more data or larger split fractions")],
            )
        report.positive_rate = float(df[self.schema.label].mean())
        partitioned.write(df, curated_dir, sort_by=self.schema.entity_key)
        return report


def _coerce(series: pd.Series, ctype: ColumnType) -> tuple[pd.Series, pd.Series]:
    """Return the column in its declared type and a mask of non-empty values that did not parse."""
    present = series.notna()
    if ctype in TEXT_TYPES:
        return series.astype("string").astype(object).where(present, None), pd.Series(False, index=series.index)
    if ctype in (ColumnType.int, ColumnType.float):
        num = pd.to_numeric(series, errors="coerce")
        bad = present & num.isna()
        if ctype is ColumnType.int:
            bad |= num.notna() & (num % 1 != 0)
            if not bad.any() and not num.isna().any():
                return num.astype("int64"), bad
        # Integers with gaps stay float64 (NaN) so numpy-based consumers need no nullable types.
        return num.astype("float64"), bad
    if ctype is ColumnType.bool:
        text = series.astype("string").str.strip().str.lower()
        is_true, is_false = text.isin(TRUE_WORDS).fillna(False), text.isin(FALSE_WORDS).fillna(False)
        bad = present & ~(is_true | is_false)
        if not series.isna().any():
            return is_true.astype(bool), bad
        return is_true.astype(float).where(present), bad
    if ctype is ColumnType.date:
        dt = pd.to_datetime(series, format="%Y-%m-%d", errors="coerce")
        bad = present & dt.isna()
        # Keep dates as ISO text in curated data: stable bytes and no timezone ambiguity.
        return dt.dt.strftime("%Y-%m-%d").astype(object).where(dt.notna(), None), bad
    raise AssertionError(f"unhandled type {ctype}")
