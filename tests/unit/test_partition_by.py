"""layout.partition_by: rows grouped by a column's period or value, validated, byte-stable outside the change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.preprocess import Preprocessor
from hybridtrain.errors import SpecError
from hybridtrain.specs.job import check_semantics, parse_spec

BASE = {
    "apiVersion": "hybridtrain/v1",
    "metadata": {"name": "tiny"},
    "dataset": {"path": "data/raw/tiny.csv", "md5": "0" * 32, "site": "onprem-dc1"},
    "schema": {"label": "y", "entity_key": "id",
               "columns": {"id": "string", "email": "string", "plan": "category", "score": "float",
                           "joined": "date", "born": "date", "y": "int"}},
    "sensitive": {"columns": {"email": {"treatment": "pseudonym"},
                              "born": {"treatment": "generalize", "level": "year"}},
                  "quasi_identifiers": ["born"]},
    "model": {"features": {"numeric": ["score"], "categorical": ["plan"]}},
    "registry": {"model_name": "tiny"},
    "split": {"train": 0.6, "val": 0.2, "test": 0.2, "seed": 3},
    "layout": {"partitions": 4},
}


def spec(partition_by: str | None):
    data = {**BASE, "layout": {"partitions": 4, "partition_by": partition_by}}
    return parse_spec(data)


def frame(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "id": [f"ID{i:05d}" for i in range(n)],
        "email": [f"user{i}@example.com" for i in range(n)],
        "plan": rng.choice(["basic", "plus", "pro"], n),
        "score": rng.normal(size=n).round(3).astype(str),
        "joined": pd.Timestamp("2023-01-01") + pd.to_timedelta(rng.integers(0, 730, n), unit="D"),
        "born": "1980-05-05",
        "y": rng.integers(0, 2, n).astype(str),
    }).assign(joined=lambda d: d["joined"].dt.strftime("%Y-%m-%d"))


def layout_problems(partition_by: str) -> list[str]:
    with pytest.raises(SpecError) as exc:
        spec(partition_by)
    return [f"{p.path}: {p.message}" for p in exc.value.problems]


@pytest.mark.parametrize(("value", "fragment"), [
    ("nope", "column 'nope' is not in schema.columns"),
    ("joined", "joined is a date: give a period, e.g. joined:month"),
    ("joined:week", "unknown period 'week'; use one of month, quarter, year"),
    ("plan:month", "a period (:month) applies to date columns only; plan is category"),
    ("score", "score is a float"),
    ("email", "email is a sensitive column or quasi-identifier"),
    ("born:year", "born is a sensitive column or quasi-identifier"),
])
def test_invalid_partition_by_is_refused_with_the_reason(value, fragment):
    found = layout_problems(value)
    assert any(line.startswith("layout.partition_by: ") and fragment in line for line in found), found


def test_partition_by_syntax_is_checked_by_the_model():
    with pytest.raises(SpecError) as exc:
        spec("joined:month:extra")
    assert exc.value.problems[0].path == "layout.partition_by"


def test_valid_partition_by_has_no_problems():
    for value in ("joined:month", "joined:quarter", "joined:year", "plan", None):
        assert check_semantics(spec(value)) == []
    assert spec("joined:quarter").layout.partition_column == ("joined", "quarter")
    assert spec("plan").layout.partition_column == ("plan", None)
    assert spec(None).layout.partition_column is None


def test_period_ids_by_granularity():
    dates = pd.Series(["2024-07-03", None, "1999-12-31"], dtype=object)
    assert partitioned.period_id(dates, "month").tolist() == [202407, 0, 199912]
    assert partitioned.period_id(dates, "quarter").tolist() == [20243, 0, 19994]
    assert partitioned.period_id(dates, "year").tolist() == [2024, 0, 1999]


def test_rows_of_one_period_share_a_partition_and_splits_stay_by_entity():
    df = frame()
    by_month = Preprocessor(spec("joined:month")).assign(df.copy())
    expected = df["joined"].str[:4].astype(int) * 100 + df["joined"].str[5:7].astype(int)
    assert (by_month[partitioned.PARTITION_COL] == expected).all()
    default = Preprocessor(spec(None)).assign(df.copy())
    assert (by_month[partitioned.SPLIT_COL] == default[partitioned.SPLIT_COL]).all()
    by_plan = Preprocessor(spec("plan")).assign(df.copy())
    assert by_plan.groupby("plan")[partitioned.PARTITION_COL].nunique().eq(1).all()
    assert set(by_plan[partitioned.PARTITION_COL]) <= set(range(4))


def run(tmp_path: Path, df: pd.DataFrame, partition_by: str | None) -> dict[str, bytes]:
    tmp_path.mkdir(parents=True)
    raw = tmp_path / "raw.csv"
    df.to_csv(raw, index=False)
    out = tmp_path / "curated"
    Preprocessor(spec(partition_by)).run(raw, out)
    return {str(p.relative_to(out)): p.read_bytes() for p in partitioned.files(out)}


def corrected(df: pd.DataFrame, month: str, rows: int) -> pd.DataFrame:
    """``rows`` records of one month get a corrected score (1 % of 600 rows = 6)."""
    out = df.copy()
    idx = out.index[out["joined"].str.startswith(month)][:rows]
    out.loc[idx, "score"] = "9.999"
    return out


def test_a_change_within_one_period_rewrites_only_that_periods_files(tmp_path):
    df = frame()
    before = run(tmp_path / "a", df, "joined:month")
    after = run(tmp_path / "b", corrected(df, "2024-02", 6), "joined:month")
    assert before.keys() == after.keys()
    changed = sorted(k for k in after if before[k] != after[k])
    assert changed and all(k.endswith("part-202402.parquet") for k in changed)
    assert len(before) > 60  # 24 months x 3 splits: everything else is byte-identical


def test_the_same_change_under_the_entity_hash_touches_most_files(tmp_path):
    df = frame()
    before = run(tmp_path / "a", df, None)
    after = run(tmp_path / "b", corrected(df, "2024-02", 6), None)
    changed = [k for k in after if before[k] != after[k]]
    # The month's rows are scattered over hash partitions: why partition_by exists.
    assert len({k.split("/")[1] for k in changed}) >= 2
