"""Preprocessing: schema errors name the column, cleaning rules, stable splits, byte-stable partitions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.preprocess import Preprocessor
from hybridtrain.errors import DataError
from hybridtrain.specs.job import parse_spec

BASE = {
    "apiVersion": "hybridtrain/v1",
    "metadata": {"name": "tiny"},
    "dataset": {"path": "data/raw/tiny.csv", "md5": "0" * 32, "site": "onprem-dc1"},
    "schema": {"label": "y", "entity_key": "id",
               "columns": {"id": "string", "email": "email", "age": "int", "score": "float",
                           "joined": "date", "vip": "bool", "y": "int"}},
    "model": {"features": {"numeric": ["age", "score"]}},
    "registry": {"model_name": "tiny"},
    "split": {"train": 0.6, "val": 0.2, "test": 0.2, "seed": 3},
    "layout": {"partitions": 4},
}


def frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "id": [f"ID{i:05d}" for i in range(n)],
        "email": [f"  User{i}@Example.com " for i in range(n)],
        "age": rng.integers(18, 80, n).astype(str),
        "score": rng.normal(size=n).round(3).astype(str),
        "joined": pd.date_range("2020-01-01", periods=n, freq="D").strftime("%Y-%m-%d"),
        "vip": rng.choice(["true", "false"], n),
        "y": rng.integers(0, 2, n).astype(str),
    })


def csv(tmp_path: Path, df: pd.DataFrame) -> Path:
    p = tmp_path / "tiny.csv"
    df.to_csv(p, index=False)
    return p


@pytest.fixture
def pre() -> Preprocessor:
    return Preprocessor(parse_spec(BASE))


def problems(exc: pytest.ExceptionInfo[DataError]) -> dict[str, str]:
    return {p.path: p.message for p in exc.value.problems}


def test_missing_column_and_wrong_type_are_named(tmp_path, pre):
    df = frame().drop(columns=["score"])
    df.loc[5, "age"] = "forty"
    df.loc[7, "joined"] = "31/02/2021"
    with pytest.raises(DataError) as exc:
        pre.run(csv(tmp_path, df), tmp_path / "out")
    found = problems(exc)
    assert "column is missing" in found["score"]
    assert "1 value(s) are not int" in found["age"] and "'forty'" in found["age"] and "data row 6" in found["age"]
    assert "are not date" in found["joined"]
    assert not (tmp_path / "out").exists()


def test_empty_file_and_header_only(tmp_path, pre):
    p = tmp_path / "empty.csv"
    p.write_text("")
    with pytest.raises(DataError) as exc:
        pre.run(p, tmp_path / "out")
    assert "empty" in str(exc.value)
    p.write_text(",".join(frame().columns) + "\n")
    with pytest.raises(DataError) as exc:
        pre.run(p, tmp_path / "out")
    assert "no data rows" in str(exc.value)


def test_all_null_label_and_non_binary_label(tmp_path, pre):
    df = frame()
    df["y"] = ""
    with pytest.raises(DataError) as exc:
        pre.run(csv(tmp_path, df), tmp_path / "out")
    assert "empty in every row" in problems(exc)["y"]
    df["y"] = "2"
    with pytest.raises(DataError) as exc:
        pre.run(csv(tmp_path, df), tmp_path / "out")
    assert "binary" in problems(exc)["y"]


def test_cleaning_dedupes_drops_unlabelled_and_undeclared_columns(tmp_path, pre):
    df = frame()
    df["ssn"] = "123-45-6789"  # undeclared: must never reach curated data
    df = pd.concat([df, df.iloc[[3, 4]]], ignore_index=True)
    df.loc[10, "y"] = ""
    report = pre.run(csv(tmp_path, df), tmp_path / "out")
    out = partitioned.read(tmp_path / "out")
    assert report.rows_in == 202 and report.duplicates_removed == 2 and report.null_label_removed == 1
    assert report.rows_out == len(out) == 199
    assert report.undeclared_columns_dropped == ["ssn"]
    assert "ssn" not in out.columns
    assert out["email"].str.match(r"^user\d+@example\.com$").all()
    assert out["id"].is_unique


def test_split_is_stable_when_rows_are_added(tmp_path, pre):
    small = pre.assign(pre.clean(pre.validate(frame(100)), _report()))
    big = pre.assign(pre.clean(pre.validate(frame(300)), _report()))
    merged = small.merge(big, on="id", suffixes=("_s", "_b"))
    assert len(merged) == 100
    assert (merged["split_s"] == merged["split_b"]).all()
    assert (merged["partition_s"] == merged["partition_b"]).all()
    counts = big["split"].value_counts(normalize=True)
    assert abs(counts["train"] - 0.6) < 0.1 and abs(counts["test"] - 0.2) < 0.1


def test_partitions_are_byte_identical_when_rewritten_and_only_changed_ones_differ(tmp_path, pre):
    df = frame(400)
    pre.run(csv(tmp_path, df), tmp_path / "a")
    pre.run(csv(tmp_path, df), tmp_path / "b")
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    changed = df.copy()
    changed.loc[changed["id"] == "ID00007", "score"] = "99.0"
    pre.run(csv(tmp_path, changed), tmp_path / "c")
    a, c = _digests(tmp_path / "a"), _digests(tmp_path / "c")
    assert a.keys() == c.keys()
    assert sum(a[k] != c[k] for k in a) == 1


def _report():
    from hybridtrain.datasets.preprocess import CleanReport

    return CleanReport()


def _digests(d: Path) -> dict[str, str]:
    return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest() for f in partitioned.files(d)}
