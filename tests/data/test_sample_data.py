"""The generated churn dataset: stable bytes, the declared schema, real-looking PII, dirt, a learnable label."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hybridtrain.datasets.sample_data import COLUMNS, SNAPSHOT, generate_churn, write_churn_csv
from hybridtrain.specs.job import ColumnType, load_spec

ROOT = Path(__file__).resolve().parents[2]
ROWS = 30_000

EMAIL_RE = re.compile(r"[a-z0-9]+([._][a-z0-9]+)*@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}")
PHONE_RE = re.compile(r"07\d{3} \d{6}|\+44 7\d{3} \d{6}")
POSTCODE_RE = re.compile(r"[A-Z]{1,2}\d[A-Z\d]? \d[ABD-HJLNP-UW-Z]{2}")
ACCOUNT_RE = re.compile(r"ACC-\d{8}")
ISO_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")

# md5 of write_churn_csv(rows=2_000) with the default seed. If the generator changes on purpose,
# update this, regenerate data/raw/churn.csv (dvc add) and the md5 pinned in jobs/churn.yaml.
PINNED_MD5_2000 = "c57aebdf1b77d255c9a931da421606ff"


@pytest.fixture(scope="module")
def churn() -> pd.DataFrame:
    return generate_churn(ROWS)


@pytest.fixture(scope="module")
def customers(churn: pd.DataFrame) -> pd.DataFrame:
    """One row per customer: the exact duplicates removed."""
    return churn.drop_duplicates()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_writes_byte_identical_files(tmp_path: Path) -> None:
    a = write_churn_csv(tmp_path / "a" / "churn.csv", rows=5_000, seed=7)
    b = write_churn_csv(tmp_path / "b" / "churn.csv", rows=5_000, seed=7)
    assert sha256(a) == sha256(b)


def test_different_seed_writes_different_bytes(tmp_path: Path) -> None:
    a = write_churn_csv(tmp_path / "a.csv", rows=5_000, seed=7)
    b = write_churn_csv(tmp_path / "b.csv", rows=5_000, seed=8)
    assert sha256(a) != sha256(b)


def test_bytes_are_pinned_for_the_default_seed(tmp_path: Path) -> None:
    path = write_churn_csv(tmp_path / "churn.csv", rows=2_000)
    assert hashlib.md5(path.read_bytes()).hexdigest() == PINNED_MD5_2000


def test_write_is_atomic_and_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "churn.csv"
    target.write_text("old contents\n")
    returned = write_churn_csv(target, rows=500)
    assert returned == target
    assert target.read_text().startswith(",".join(COLUMNS) + "\n")
    assert [p.name for p in tmp_path.iterdir()] == ["churn.csv"]  # no temporary file left behind


def test_csv_format_is_stable_text(tmp_path: Path) -> None:
    raw = write_churn_csv(tmp_path / "churn.csv", rows=3_000).read_bytes()
    assert b"\r" not in raw  # LF line endings only
    lines = raw.decode("utf-8").split("\n")
    assert lines[0] == ",".join(COLUMNS)  # header, no index column
    assert lines[-1] == ""  # ends with a newline
    back = pd.read_csv(tmp_path / "churn.csv", dtype=str, keep_default_na=False)
    assert len(back) == 3_000
    assert back["date_of_birth"].str.fullmatch(ISO_DATE_RE.pattern).all()
    assert back["signup_date"].str.fullmatch(ISO_DATE_RE.pattern).all()
    filled = back["monthly_charges"][back["monthly_charges"] != ""]
    assert filled.str.fullmatch(r"\d+\.\d{2}").all()
    assert set(back["has_streaming"]) == {"True", "False"}
    assert set(back["churned"]) <= {"0", "1", ""}


def test_columns_and_types_match_the_churn_spec(churn: pd.DataFrame) -> None:
    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    declared = spec.data_schema.columns
    assert list(churn.columns) == list(declared) == list(COLUMNS)
    check = {
        ColumnType.string: pd.api.types.is_string_dtype,
        ColumnType.email: pd.api.types.is_string_dtype,
        ColumnType.date: pd.api.types.is_datetime64_dtype,
        ColumnType.category: lambda d: isinstance(d, pd.CategoricalDtype),
        ColumnType.int: pd.api.types.is_integer_dtype,
        ColumnType.float: pd.api.types.is_float_dtype,
        ColumnType.bool: pd.api.types.is_bool_dtype,
    }
    wrong = {c: str(churn[c].dtype) for c, t in declared.items() if not check[t](churn[c].dtype)}
    assert wrong == {}
    assert churn[spec.data_schema.entity_key].notna().all()


def test_row_count_is_exact_even_when_tiny() -> None:
    assert len(generate_churn(1)) == 1
    assert len(generate_churn(7, seed=3)) == 7
    with pytest.raises(ValueError) as exc:
        generate_churn(0)
    assert "positive" in str(exc.value)


def test_pii_looks_real(customers: pd.DataFrame) -> None:
    assert customers["account_id"].str.fullmatch(ACCOUNT_RE.pattern).all()
    assert customers["phone"].str.fullmatch(PHONE_RE.pattern).all()
    assert customers["postcode"].str.fullmatch(POSTCODE_RE.pattern).all()
    emails = customers["email"].str.strip().str.lower()
    assert emails.str.fullmatch(EMAIL_RE.pattern).all()
    assert emails.str.split("@").str[1].nunique() >= 8  # several providers
    names = customers["full_name"].str.split()
    assert (names.str.len() >= 2).all()
    # Emails are derived from the names: the last name appears in most of them.
    last = names.str[-1].str.lower().str.replace(r"[^a-z]", "", regex=True)
    share = np.mean([ln in e for ln, e in zip(last, emails, strict=True)])
    assert share > 0.95
    assert customers["full_name"].nunique() > 5_000


def test_identifiers_are_unique_per_customer(customers: pd.DataFrame) -> None:
    assert customers["account_id"].is_unique
    assert customers["phone"].is_unique
    assert customers["email"].str.strip().str.casefold().is_unique


def test_dates_of_birth_give_adult_ages(customers: pd.DataFrame) -> None:
    snapshot = pd.Timestamp(SNAPSHOT)
    dob = customers["date_of_birth"]
    before_birthday = (dob.dt.month > snapshot.month) | (
        (dob.dt.month == snapshot.month) & (dob.dt.day > snapshot.day)
    )
    age = snapshot.year - dob.dt.year - before_birthday.astype(int)  # whole years on the snapshot day
    assert age.between(18, 85).all()
    assert age.min() == 18 and age.max() == 85
    assert 35 < age.mean() < 55
    assert (customers["signup_date"] <= snapshot).all()
    assert (customers["signup_date"] >= dob + pd.DateOffset(years=18)).all()  # adult at signup


def test_region_follows_the_postcode_area(customers: pd.DataFrame) -> None:
    area = customers["postcode"].str.extract(r"^([A-Z]+)")[0]
    regions_per_area = customers.groupby(area, observed=True)["region"].nunique()
    assert (regions_per_area == 1).all()
    assert customers["region"].nunique() == 12


def test_dirt_is_present_in_the_expected_proportions(churn: pd.DataFrame) -> None:
    dup = churn.duplicated(keep="first")
    assert 0.004 <= dup.mean() <= 0.006
    # Duplicates are whole-row copies, so they repeat the account id.
    assert churn["account_id"].duplicated().sum() == dup.sum()
    assert 0.001 <= churn["churned"].isna().mean() <= 0.0035
    email = churn["email"]
    padded = email != email.str.strip()
    mixed = email.str.strip() != email.str.strip().str.lower()
    assert 0.006 <= padded.mean() <= 0.015
    assert 0.01 <= mixed.mean() <= 0.02
    assert churn.loc[churn["tenure_months"] == 0, "total_charges"].isna().all()
    missing_total = churn.loc[churn["tenure_months"] > 0, "total_charges"].isna().mean()
    assert 0.002 <= missing_total <= 0.01
    assert 0.09 <= churn["satisfaction_score"].isna().mean() <= 0.15


def test_values_are_plausible(customers: pd.DataFrame) -> None:
    assert customers["tenure_months"].between(0, 72).all()
    assert customers["monthly_charges"].between(9.99, 200).all()
    assert set(customers["satisfaction_score"].dropna().unique()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert customers["num_products"].between(1, 4).all()
    assert (customers["support_calls_90d"] >= 0).all()
    fibre = customers["internet_service"] == "fibre"
    assert customers.loc[fibre, "monthly_charges"].mean() > customers.loc[~fibre, "monthly_charges"].mean()
    assert (customers.loc[customers["internet_service"] == "none", "avg_monthly_gb"] == 0).all()


def test_churn_rate_is_realistic(customers: pd.DataFrame) -> None:
    rate = customers["churned"].dropna().astype(int).mean()
    assert 0.20 <= rate <= 0.30


def test_label_is_learnable_by_logistic_regression(customers: pd.DataFrame) -> None:
    d = customers.dropna(subset=["churned"])
    age = (pd.Timestamp(SNAPSHOT) - d["date_of_birth"]).dt.days / 365.2425
    numeric = d[["tenure_months", "monthly_charges", "support_calls_90d", "late_payments_12m",
                 "avg_monthly_gb", "num_products"]].astype(float)  # fmt: skip
    features = pd.concat(
        [
            numeric,
            d["total_charges"].fillna(0.0),
            d["satisfaction_score"].fillna(d["satisfaction_score"].median()),
            d["satisfaction_score"].isna().astype(float).rename("satisfaction_missing"),
            d["has_streaming"].astype(float),
            age.rename("age"),
            pd.get_dummies(d[["contract", "payment_method", "internet_service", "region"]], dtype=float),
        ],
        axis=1,
    ).to_numpy()
    y = d["churned"].astype(int).to_numpy()
    train, test = slice(0, 20_000), slice(20_000, None)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1_000)).fit(features[train], y[train])
    p = model.predict_proba(features[test])[:, 1]
    auc = roc_auc_score(y[test], p)
    accuracy = ((p > 0.5) == y[test]).mean()
    majority = max(y[test].mean(), 1 - y[test].mean())
    assert auc >= 0.80
    assert accuracy >= majority + 0.03
