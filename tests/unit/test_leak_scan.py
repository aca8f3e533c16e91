"""LeakScan: clean output passes, planted raw values are caught anywhere, reports merge across partitions.

Includes the property the whole anonymize stage rests on: whatever the data and whichever of
drop / pseudonym / generalize each sensitive column gets, the scan of the anonymized output
finds nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hybridtrain.datasets.anonymizer import Anonymizer
from hybridtrain.datasets.leak_scan import LeakReport, LeakScan
from hybridtrain.datasets.sample_data import generate_churn
from hybridtrain.errors import LeakDetected
from hybridtrain.specs.job import JobSpec, load_spec, parse_spec
from tests.fixtures.anonymizer_specs import make_spec

ROOT = Path(__file__).resolve().parents[2]
KEY = b"leak-scan-test-key-0123456789abc"


def without_k(spec: JobSpec) -> JobSpec:
    """The same spec without k-anonymity: small samples of the churn data are all tiny QI groups."""
    data = spec.to_dict()
    data["sensitive"]["k_anonymity"] = None
    return parse_spec(data)


@pytest.fixture(scope="module")
def churn_spec() -> JobSpec:
    return load_spec(ROOT / "jobs" / "churn.yaml")


@pytest.fixture(scope="module")
def churn() -> pd.DataFrame:
    return generate_churn(5_000)


@pytest.fixture(scope="module")
def approved(churn_spec: JobSpec, churn: pd.DataFrame) -> pd.DataFrame:
    out = Anonymizer(without_k(churn_spec), KEY).apply(churn).frame
    assert len(out) == len(churn)
    return out


@pytest.fixture(scope="module")
def scan(churn_spec: JobSpec, churn: pd.DataFrame) -> LeakScan:
    return LeakScan.from_source(churn, churn_spec)


def test_clean_output_passes(scan: LeakScan, approved: pd.DataFrame) -> None:
    report = scan.scan(approved, "approved/train/part-0000.parquet")
    assert report.clean
    assert report.hits == {}
    assert report.values_checked == int(approved.notna().sum().sum())
    assert set(report.scanned_columns) == {"account_id", "full_name", "email", "phone", "date_of_birth", "postcode"}
    report.raise_if_leaky("data/approved/churn")  # does not raise


def test_the_raw_curated_frame_is_all_leaks(scan: LeakScan, churn: pd.DataFrame) -> None:
    report = scan.scan(churn, "curated")
    assert not report.clean
    for column in ("account_id", "full_name", "email", "phone", "date_of_birth", "postcode"):
        assert report.hits[column] >= len(churn)
        assert report.examples[column] == f"curated:{column}"


def test_raw_value_back_in_its_own_column_is_caught(
    scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame
) -> None:
    leaky = approved.copy()
    row = leaky.index[3]
    leaky.loc[row, "email"] = churn.loc[row, "email"].upper() + "  "  # case and whitespace do not hide it
    report = scan.scan(leaky, "part-7")
    assert report.hits == {"email": 1}
    assert report.examples == {"email": "part-7:email"}


@pytest.mark.parametrize(
    ("source", "dtype", "disguise"),
    [
        ("email", object, str.upper),
        ("phone", "str", lambda v: f"\t{v} "),
        ("full_name", "category", str.lower),
        ("postcode", "category", str),
        ("account_id", "string", str.lower),  # pandas' pd.NA string dtype
    ],
)
def test_raw_value_planted_in_another_column_is_caught(
    scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame, source: str, dtype: Any, disguise: Any
) -> None:
    leaky = approved.head(50).copy()
    cells = [disguise(churn[source].iloc[0])] + ["nothing to see"] * 49
    leaky["notes"] = pd.Series(cells, index=leaky.index, dtype=dtype)
    report = scan.scan(leaky, "approved/part-3.parquet")
    assert report.hits == {source: 1}
    assert report.examples == {source: "approved/part-3.parquet:notes"}


def test_raw_date_of_birth_in_a_datetime_or_text_column_is_caught(
    scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame
) -> None:
    leaky = approved.head(20).copy()
    dob = churn["date_of_birth"].iloc[0]
    leaky["event_time"] = pd.Timestamp("2026-01-01 10:00")
    leaky.loc[leaky.index[5], "event_time"] = dob + pd.Timedelta(hours=13)  # same date, with a time
    leaky["as_text"] = "x"
    leaky.loc[leaky.index[7], "as_text"] = dob.strftime("%Y-%m-%d")
    report = scan.scan(leaky, "p")
    assert report.hits == {"date_of_birth": 2}


def test_signup_dates_and_numbers_are_not_mistaken_for_leaks(scan: LeakScan, approved: pd.DataFrame) -> None:
    # Passthrough datetime, category, int, float and bool columns: none equals a raw identifier.
    report = scan.scan(approved[["signup_date", "region", "tenure_months", "monthly_charges", "has_streaming"]])
    assert report.clean


def test_raise_if_leaky_names_column_place_and_fix(scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame) -> None:
    leaky = approved.head(10).assign(notes=churn["email"].head(10).to_numpy())
    report = scan.scan(leaky, "approved/train/part-0003.parquet")
    with pytest.raises(LeakDetected) as exc:
        report.raise_if_leaky("data/approved/churn")
    err = exc.value
    assert err.dataset == "data/approved/churn"
    assert err.hits == {"email": 10}
    message = str(err)
    assert "email" in message
    assert "approved/train/part-0003.parquet:notes" in message
    assert "treatment" in message and "nothing was synced" in message


def test_reports_never_contain_the_raw_values(scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame) -> None:
    secret = churn["email"].iloc[0]
    leaky = approved.head(5).assign(notes=[secret, "a", "b", "c", "d"])
    report = scan.scan(leaky, "p")
    assert secret not in report.model_dump_json()
    with pytest.raises(LeakDetected) as exc:
        report.raise_if_leaky("d")
    assert secret not in str(exc.value)


def test_keep_columns_are_declared_not_leaks() -> None:
    spec = make_spec(
        {"id": "string", "city": "string", "email": "string"},
        {
            "id": {"treatment": "pseudonym"},
            "city": {"treatment": "keep", "reason": "coarse location, needed by the model"},
            "email": {"treatment": "drop"},
        },
    )
    raw = pd.DataFrame({"id": ["a1", "b2"], "city": ["Leeds", "York"], "email": ["x@y.com", "z@y.com"]})
    out = Anonymizer(spec, KEY).apply(raw).frame
    report = LeakScan.from_source(raw, spec).scan(out)
    assert report.clean
    assert report.kept_raw == ["city"]
    assert "city" not in report.scanned_columns
    assert out["city"].tolist() == ["Leeds", "York"]  # raw, by declaration


def test_blank_raw_values_prove_nothing() -> None:
    spec = make_spec(
        {"id": "string", "email": "string"}, {"id": {"treatment": "pseudonym"}, "email": {"treatment": "drop"}}
    )
    raw = pd.DataFrame({"id": ["a", "b"], "email": ["", "   "]})
    out = pd.DataFrame({"id": ["p_x", "p_y"], "comment": ["", " "]})
    assert LeakScan.from_source(raw, spec).scan(out).clean


def test_numeric_sensitive_columns_are_checked_by_shape_not_by_value() -> None:
    spec = make_spec(
        {"id": "string", "age": "int", "income": "float", "customer_no": "int"},
        {
            "id": {"treatment": "pseudonym"},
            "age": {"treatment": "drop"},
            "income": {"treatment": "generalize", "level": "bucket:1000"},
            "customer_no": {"treatment": "pseudonym"},
        },
    )
    raw = pd.DataFrame(
        {
            "id": ["a", "b", "c"],
            "age": [34, 51, 27],
            "income": [31_000.0, 72_000.5, 8_250.0],
            "customer_no": [17, 18, 19],
        }
    )
    scan = LeakScan.from_source(raw, spec)
    out = Anonymizer(spec, KEY).apply(raw).frame.assign(tenure_months=[34, 51, 17])
    report = scan.scan(out)
    assert report.clean  # tenure 34 is not "age 34"
    assert set(report.shape_checked) == {"age", "income", "customer_no"}

    still_there = out.assign(age=raw["age"].to_numpy())  # a dropped column that came back
    assert scan.scan(still_there).hits == {"age": 3}
    not_bucketed = out.assign(income=raw["income"].to_numpy())
    assert scan.scan(not_bucketed).hits == {"income": 2}  # 31000 is on the grid: a bucket, by value
    not_hashed = out.assign(customer_no=raw["customer_no"].to_numpy())
    assert scan.scan(not_hashed, "p").hits == {"customer_no": 3}


def test_number_like_raw_text_is_looked_for_in_numeric_columns() -> None:
    spec = make_spec(
        {"id": "string", "ref": "string"}, {"id": {"treatment": "pseudonym"}, "ref": {"treatment": "drop"}}
    )
    raw = pd.DataFrame({"id": ["a", "b"], "ref": ["90210", "x-1"]})
    out = pd.DataFrame({"id": ["p_1", "p_2"], "zip_as_int": [90210, 12345]})
    assert LeakScan.from_source(raw, spec).scan(out).hits == {"ref": 1}


def test_findings_do_not_depend_on_value_order_or_partitioning() -> None:
    # Found by the property below: pandas.factorize treats -0.0 and 0.0 (and 1, 1.0, True in an
    # object column) as one value, so the text compared used to depend on which came first.
    spec = make_spec(
        {"id": "string", "ref": "string"}, {"id": {"treatment": "pseudonym"}, "ref": {"treatment": "drop"}}
    )
    scan = LeakScan.from_source(pd.DataFrame({"id": ["a", "b"], "ref": ["0.0", "1"]}), spec)
    floats = pd.DataFrame({"x": [-0.0, 0.0]})
    assert scan.scan(floats).hits == {"ref": 1}
    assert scan.scan(floats.iloc[::-1]).hits == {"ref": 1}
    assert scan.scan_many([floats.iloc[:1], floats.iloc[1:]]).hits == {"ref": 1}
    mixed = pd.DataFrame({"o": pd.Series([1.0, True, 1], dtype=object)})
    assert scan.scan(mixed).hits == {"ref": 1}  # only the int 1 reads "1"


def test_reports_merge_across_partitions(scan: LeakScan, churn: pd.DataFrame, approved: pd.DataFrame) -> None:
    parts = {f"train/part-{i}.parquet": approved.iloc[i::3] for i in range(3)}
    leaky = parts["train/part-1.parquet"].copy()
    leaky.loc[leaky.index[0], "postcode"] = churn.loc[leaky.index[0], "postcode"]
    parts["train/part-1.parquet"] = leaky
    parts["val/part-0.parquet"] = approved.head(4).assign(note=churn["phone"].head(4).to_numpy())

    merged = scan.scan_many(parts)
    assert merged.hits == {"postcode": 1, "phone": 4}
    assert merged.examples == {"postcode": "train/part-1.parquet:postcode", "phone": "val/part-0.parquet:note"}
    assert merged.partitions == 4
    assert merged.values_checked == sum(int(f.notna().sum().sum()) for f in parts.values())
    assert not merged.clean

    by_hand = LeakReport()
    for where, frame in parts.items():
        by_hand = by_hand.merge(scan.scan(frame, where))
    assert by_hand.hits == merged.hits and by_hand.values_checked == merged.values_checked

    as_pairs = scan.scan_many(list(parts.items()))
    assert as_pairs.hits == merged.hits
    bare = scan.scan_many(list(parts.values()))
    assert bare.examples == {"postcode": "#1:postcode", "phone": "#3:note"}


def test_merge_keeps_the_first_example_and_adds_counts() -> None:
    a = LeakReport(hits={"email": 2}, examples={"email": "p0:email"}, values_checked=10, partitions=1)
    b = LeakReport(
        hits={"email": 1, "phone": 3}, examples={"email": "p1:x", "phone": "p1:y"}, values_checked=5, partitions=1
    )
    merged = a.merge(b)
    assert merged.hits == {"email": 3, "phone": 3}
    assert merged.examples == {"email": "p0:email", "phone": "p1:y"}
    assert (merged.values_checked, merged.partitions) == (15, 2)
    assert json.loads(merged.model_dump_json())["clean"] is False


def test_scan_of_churn_sized_data_is_vectorized(churn_spec: JobSpec) -> None:
    churn = generate_churn(20_000)
    out = Anonymizer(churn_spec, KEY).apply(churn).frame
    report = LeakScan.from_source(churn, churn_spec).scan(out)
    assert len(out) > 1_000
    assert report.clean and report.values_checked > 15 * len(out)


def test_missing_source_column_is_a_data_error(churn_spec: JobSpec, churn: pd.DataFrame) -> None:
    from hybridtrain.errors import DataError

    with pytest.raises(DataError) as exc:
        LeakScan.from_source(churn.drop(columns=["phone"]), churn_spec)
    assert "phone" in str(exc.value)


# -- normal form ---------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=30))
def test_normal_form_is_python_strip_casefold(values: list[str]) -> None:
    series = pd.Series(values, dtype="str")
    codes, forms = LeakScan.normalize(series)
    got = forms.to_pylist()
    assert [got[c] for c in codes] == [v.strip().casefold() for v in values]
    obj_codes, obj_forms = LeakScan.normalize(pd.Series(values, dtype=object))
    assert [obj_forms.to_pylist()[c] for c in obj_codes] == [v.strip().casefold() for v in values]


def test_normal_form_whitespace_matches_python() -> None:
    every_space = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
    values = [f"{every_space}Ab{every_space}", "\x1cX\x1f", "\u00a0ẞ\u3000", "İ", "ﬁ"]
    codes, forms = LeakScan.normalize(pd.Series(values, dtype="str"))
    assert [forms.to_pylist()[c] for c in codes] == [v.strip().casefold() for v in values]


# -- the property: anonymized output never leaks --------------------------------------------------

TEXT_LEVELS = ("outward", "area", "prefix:1", "prefix:3")
DATE_LEVELS = ("year", "year_month", "decade")
NUMBER_LEVELS = ("bucket:1", "bucket:10", "bucket:0.5", "bucket:1000")


def treatments(kind: str) -> st.SearchStrategy[dict[str, str]]:
    levels = {"string": TEXT_LEVELS, "category": TEXT_LEVELS, "date": DATE_LEVELS, "float": NUMBER_LEVELS,
              "int": NUMBER_LEVELS}[kind]  # fmt: skip
    return st.one_of(
        st.just({"treatment": "drop"}),
        st.just({"treatment": "pseudonym"}),
        st.sampled_from(levels).map(lambda level: {"treatment": "generalize", "level": level}),
    )


def variants(base: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A value as people type it: other case, surrounding whitespace."""
    space = st.sampled_from(["", " ", "  ", "\t", "\u00a0", "\u3000", "\n"])
    case = st.sampled_from([str, str.upper, str.lower, str.title, str.swapcase])
    return st.tuples(space, case, base, space).map(lambda t: t[0] + t[1](t[2]) + t[3])


# Postcode- and email-like text, text that looks like the *outputs* of other treatments (years,
# "YYYY-MM", numbers, outward codes: the collisions the anonymizer must withhold), and arbitrary
# unicode (no surrogates: they cannot be stored).
text_values = st.one_of(
    st.from_regex(r"[A-Z]{1,2}[0-9]{1,2}[A-Z]? [0-9][A-Z]{2}", fullmatch=True),
    st.from_regex(r"[A-Z]{1,2}[0-9]{1,2}", fullmatch=True),
    st.from_regex(r"[a-z]{1,6}\.[a-z]{1,6}[0-9]{0,3}@[a-z]{2,5}\.(com|co\.uk)", fullmatch=True),
    st.from_regex(r"(19|20)[0-9]{2}(-[01][0-9](-[0-3][0-9])?)?", fullmatch=True),
    st.integers(-20, 3000).map(str),
    st.sampled_from(["0.0", "10.0", "-10.0", "1000.0", "0.5", "True", "nan", "p_0123456789abcdef0123"]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
)
dates = st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2100, 12, 31))


@st.composite
def raw_frames(draw: st.DrawFn) -> tuple[pd.DataFrame, JobSpec]:
    n = draw(st.integers(1, 25))
    kinds = {"t1": "string", "t2": "string", "c1": "category", "d1": "date", "x1": "float", "i1": "int"}
    chosen = draw(st.lists(st.sampled_from(list(kinds)), min_size=1, max_size=6, unique=True))
    columns = {name: kinds[name] for name in ["t1", *[c for c in chosen if c != "t1"]]}
    sensitive = {name: draw(treatments(kind)) for name, kind in columns.items()}

    data: dict[str, Any] = {}
    for name, kind in columns.items():
        if kind in ("string", "category"):
            pool = draw(st.lists(text_values, min_size=1, max_size=6))
            cells = draw(st.lists(st.one_of(st.none(), variants(st.sampled_from(pool))), min_size=n, max_size=n))
            dtype = "category" if kind == "category" else draw(st.sampled_from(["str", object]))
            data[name] = pd.Series(cells, dtype=dtype)
        elif kind == "date":
            cells = draw(st.lists(st.one_of(st.none(), dates), min_size=n, max_size=n))
            as_text = draw(st.booleans())
            if as_text:  # ISO text, some of it padded
                text = [None if d is None else (" " * (i % 2)) + d.isoformat() for i, d in enumerate(cells)]
                data[name] = pd.Series(text, dtype=object)
            else:
                data[name] = pd.Series(pd.to_datetime(cells))
        elif kind == "float":
            floats = st.one_of(st.none(), st.floats(-1e9, 1e9, allow_nan=False))
            data[name] = pd.Series(draw(st.lists(floats, min_size=n, max_size=n)), dtype="float64")
        else:
            data[name] = pd.Series(draw(st.lists(st.integers(-10**9, 10**9), min_size=n, max_size=n)), dtype="int64")
    frame = pd.DataFrame(data)
    frame["split"] = draw(st.lists(st.sampled_from(["train", "val", "test"]), min_size=n, max_size=n))

    qis = [c for c, t in sensitive.items() if t["treatment"] == "generalize"]
    extra: dict[str, Any] = {}
    if qis and draw(st.booleans()):
        extra = {"quasi_identifiers": qis[:2], "k_anonymity": draw(st.integers(2, 3)), "on_k_violation": "suppress"}
    spec = make_spec(columns, sensitive, **extra)
    return frame, spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw_frames())
def test_anonymized_output_never_contains_a_raw_sensitive_value(case: tuple[pd.DataFrame, JobSpec]) -> None:
    frame, spec = case
    scan = LeakScan.from_source(frame, spec)
    # The split column is not sensitive and is not the anonymizer's to change: a raw value that
    # happens to read "train" would be a finding about the raw data, not about the anonymizer.
    assume(not scan.matches(frame["split"]).any())
    result = Anonymizer(spec, KEY).apply(frame)
    report = scan.scan(result.frame, "out")
    assert report.hits == {}, (report.hits, report.examples)
    # And the same holds partition by partition.
    halves = {"a": result.frame.iloc[::2], "b": result.frame.iloc[1::2]}
    assert scan.scan_many(halves).clean


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), variants(text_values)), min_size=1, max_size=40))
def test_pseudonyms_never_equal_raw_values_and_keep_equalities(values: list[str | None]) -> None:
    spec = make_spec({"id": "string"}, {"id": {"treatment": "pseudonym"}})
    raw = pd.DataFrame({"id": pd.Series(values, dtype="str")})
    out = Anonymizer(spec, KEY).apply(raw).frame["id"]
    assert LeakScan.from_source(raw, spec).scan(out.to_frame()).clean
    normal = [None if v is None or not v.strip() else v.strip().casefold() for v in values]
    for i in range(len(values)):
        assert pd.isna(out.iloc[i]) == (normal[i] is None)
        for j in range(i):
            if normal[i] is not None and normal[j] is not None:
                assert (out.iloc[i] == out.iloc[j]) == (normal[i] == normal[j])
