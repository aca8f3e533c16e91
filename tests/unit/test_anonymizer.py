"""Anonymizer: each treatment, output types, k-anonymity, and the key rules."""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridtrain.datasets.anonymizer import AnonymizationReport, Anonymizer
from hybridtrain.datasets.sample_data import generate_churn
from hybridtrain.errors import DataError, SpecError
from hybridtrain.specs.job import ColumnType, JobSpec, load_spec, parse_spec
from tests.fixtures.anonymizer_specs import make_spec

ROOT = Path(__file__).resolve().parents[2]
KEY = b"unit-test-key-0123456789abcdef!!"
OTHER_KEY = b"another-key-for-unit-tests-00000"


def without_k(spec: JobSpec) -> JobSpec:
    """The same spec without k-anonymity: small samples of the churn data are all tiny QI groups."""
    data = spec.to_dict()
    data["sensitive"]["k_anonymity"] = None
    return parse_spec(data)


# -- an independent reference of the documented pseudonym ---------------------------------------

_M64 = (1 << 64) - 1


def siphash24(key: bytes, message: bytes) -> int:
    """SipHash-2-4 (Aumasson & Bernstein 2012), straight from the paper, in pure Python."""

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & _M64

    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def sip_round() -> None:
        v[0] = (v[0] + v[1]) & _M64
        v[1] = rotl(v[1], 13) ^ v[0]
        v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & _M64
        v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & _M64
        v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & _M64
        v[1] = rotl(v[1], 17) ^ v[2]
        v[2] = rotl(v[2], 32)

    n = len(message)
    whole = n - n % 8
    last = (n & 0xFF) << 56 | int.from_bytes(message[whole:], "little")
    for m in [*struct.unpack_from(f"<{whole // 8}Q", message), last]:
        v[3] ^= m
        sip_round()
        sip_round()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def mix64(x: int) -> int:
    """The fixed invertible mixer ``pandas.util.hash_array`` applies after SipHash (splitmix64 finalizer)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def subkeys(key: bytes) -> tuple[bytes, bytes]:
    if len(key) > 64:
        key = hashlib.blake2b(key).digest()
    return tuple(  # type: ignore[return-value]
        hashlib.blake2b(key=key, digest_size=16, person=p).digest() for p in (b"hybridtrain/psk0", b"hybridtrain/psk1")
    )


def keyed_label(value: str, key: bytes = KEY) -> str:
    """The documented pseudonym, computed independently: "p_" + the first 10 bytes of h0 || h1 in hex."""
    k0, k1 = subkeys(key)
    message = value.encode()
    h0, h1 = mix64(siphash24(k0, message)), mix64(siphash24(k1, message))
    return f"p_{h0:016x}{h1 >> 48:04x}"


def test_reference_siphash_matches_the_published_test_vectors() -> None:
    key = bytes(range(16))  # the paper's key 00..0f; messages 00, 00 01, ... (Appendix A and the reference vectors)
    assert siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5
    assert siphash24(key, b"") == 0x726FDB47DD0E0E31
    assert siphash24(key, bytes(range(8))) == 0x93F5F5799A932462


def is_type(series: pd.Series, t: ColumnType) -> bool:
    d = series.dtype
    return {
        ColumnType.string: lambda: isinstance(d, pd.StringDtype),
        ColumnType.int: lambda: pd.api.types.is_integer_dtype(d),
        ColumnType.float: lambda: pd.api.types.is_float_dtype(d),
        ColumnType.bool: lambda: pd.api.types.is_bool_dtype(d),
        ColumnType.date: lambda: pd.api.types.is_datetime64_any_dtype(d),
        ColumnType.category: lambda: isinstance(d, pd.CategoricalDtype),
    }[t]()


# -- the key -------------------------------------------------------------------------------------


def test_short_key_is_refused_with_a_clear_message() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    with pytest.raises(ValueError) as exc:
        Anonymizer(spec, b"too-short")
    assert "9 bytes" in str(exc.value)
    assert "at least 16" in str(exc.value)
    assert "Prefect Secret" in str(exc.value)


def test_text_key_is_refused() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    with pytest.raises(ValueError) as exc:
        Anonymizer(spec, "a-text-key-that-is-long-enough")  # type: ignore[arg-type]
    assert "must be bytes" in str(exc.value)


def test_key_is_not_kept_or_shown() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    derived = [k.decode("latin-1") for k in subkeys(KEY)]
    for shown in (repr(anonymizer), repr(vars(anonymizer)), str(vars(anonymizer))):
        assert KEY.decode() not in shown
        assert not any(k in shown for k in derived)
    assert all(v != KEY for v in vars(anonymizer).values())


def test_anonymizer_with_its_keys_cannot_be_pickled() -> None:
    import copy

    import cloudpickle

    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    for dump in (pickle.dumps, cloudpickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled"):
            dump(anonymizer)


def test_keys_longer_than_64_bytes_are_hashed_to_64_bytes_first() -> None:
    long_key = bytes(range(100))
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    out = Anonymizer(spec, long_key).pseudonymize(pd.Series(["x@y.com"], dtype="str"))
    assert out.iloc[0] == keyed_label("x@y.com", long_key)
    assert out.iloc[0] == keyed_label("x@y.com", hashlib.blake2b(long_key).digest())


# -- pseudonym -----------------------------------------------------------------------------------


# Pinned outputs: pseudonyms must not change across runs, processes or (pinned) pandas versions,
# because approved datasets of different runs are joined on them.
KNOWN = {
    "ann.lee@example.com": "p_734ac5312db60a98f89a",
    "strasse@x.de": "p_0eeb3666e388d3a31354",
    "acc-00000042": "p_44e73d5d28281875c889",
    "1234567": "p_b0bc0db5fb66e40daaa9",
    "1985-03-02": "p_6e6f5a35408e71851801",
    "zoë@ünïcode.example": "p_22e333b8230c0b4eef44",
}


def test_known_pseudonyms_are_pinned_and_match_the_reference() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    values = list(KNOWN)
    out = Anonymizer(spec, KEY).pseudonymize(pd.Series(values, dtype="str"))
    assert out.tolist() == [KNOWN[v] for v in values]
    assert [keyed_label(v) for v in KNOWN] == list(KNOWN.values())


def test_pseudonyms_are_the_same_in_another_process() -> None:
    code = (
        "import sys, pandas as pd; from hybridtrain.datasets.anonymizer import Anonymizer; "
        "from hybridtrain.specs.job import load_spec; "
        "a = Anonymizer(load_spec('jobs/churn.yaml'), %r); "
        "print('\\n'.join(a.pseudonymize(pd.Series(%r, dtype='str')).tolist()))"
    )
    values = list(KNOWN)
    outputs = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code % (KEY, values)], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        outputs.add(done.stdout)
    assert outputs == {"\n".join(KNOWN[v] for v in values) + "\n"}


def test_pseudonym_depends_on_the_key_and_is_not_an_unkeyed_hash() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    values = pd.Series([f"user{i}@example.com" for i in range(1_000)], dtype="str")
    mine = Anonymizer(spec, KEY).pseudonymize(values)
    assert mine.tolist() == Anonymizer(spec, KEY).pseudonymize(values).tolist()
    for other in (OTHER_KEY, KEY[:-1] + b"?", bytes(32)):
        assert not (mine == Anonymizer(spec, other).pseudonymize(values)).any()
    # Not pandas' default (public) SipHash key, nor unkeyed BLAKE2b, nor the old keyed BLAKE2b form.
    messages = np.array([v.encode() for v in values], dtype=object)
    public = pd.util.hash_array(messages, categorize=False).tolist()  # pandas' built-in, published key
    assert not {p[2:18] for p in mine} & {f"{h:016x}" for h in public}
    unkeyed = {"p_" + hashlib.blake2b(m, digest_size=10).hexdigest() for m in messages}
    unkeyed |= {"p_" + hashlib.blake2b(m, key=KEY, digest_size=10, person=b"hybridtrain/psn1").hexdigest()
                for m in messages}  # fmt: skip
    assert not set(mine) & unkeyed


def test_no_pseudonym_collisions_on_a_benchmark_sized_sample() -> None:
    churn = generate_churn(200_000)
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    for column in ("account_id", "email"):
        forms = churn[column].str.strip().str.casefold()
        out = anonymizer.pseudonymize(churn[column])
        assert out.notna().all()
        assert out.str.fullmatch(r"p_[0-9a-f]{20}").all()
        pairs = pd.DataFrame({"form": forms.to_numpy(), "pseudonym": out.to_numpy()}).drop_duplicates()
        assert pairs["form"].is_unique and pairs["pseudonym"].is_unique  # one-to-one


def test_pseudonym_is_keyed_siphash_of_the_normal_form() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    df = pd.DataFrame({"email": ["  Ann.Lee@Example.COM\t", "ann.lee@example.com", "STRASSE@x.de", "straße@x.de"]})
    out = Anonymizer(spec, KEY).apply(df).frame["email"]
    assert out.iloc[0] == keyed_label("ann.lee@example.com")
    assert out.iloc[0] == out.iloc[1]  # case and surrounding whitespace do not matter
    assert out.iloc[2] == out.iloc[3] == keyed_label("strasse@x.de")  # casefold, not lower
    assert out.str.fullmatch(r"p_[0-9a-f]{20}").all()


def test_pseudonym_is_deterministic_per_key_and_differs_across_keys() -> None:
    spec = make_spec({"account_id": "string"}, {"account_id": {"treatment": "pseudonym"}})
    df = pd.DataFrame({"account_id": [f"ACC-{i:08d}" for i in range(500)]})
    first = Anonymizer(spec, KEY).apply(df).frame["account_id"]
    again = Anonymizer(spec, KEY).apply(df).frame["account_id"]
    other = Anonymizer(spec, OTHER_KEY).apply(df).frame["account_id"]
    assert first.tolist() == again.tolist()
    assert first.is_unique
    assert not (first == other).any()


def test_pseudonym_keeps_nulls_and_blanks_missing() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    df = pd.DataFrame({"email": pd.Series(["a@b.com", None, "  ", "", "a@b.com"], dtype="str")})
    result = Anonymizer(spec, KEY).apply(df)
    out = result.frame["email"]
    assert out.isna().tolist() == [False, True, True, True, False]
    assert out.iloc[0] == out.iloc[4]
    report = result.report.columns["email"]
    assert (report.transformed, report.nulls) == (2, 3)


@pytest.mark.parametrize("dtype", [object, "string", "category"])
def test_pseudonym_keeps_every_kind_of_missing_missing(dtype: Any) -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    raw = ["a@b.com", None, np.nan, pd.NA, " \t", "", "A@B.com "]
    if dtype == "category":
        raw = [None if v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v for v in raw]
    out = Anonymizer(spec, KEY).pseudonymize(pd.Series(raw, dtype=dtype))
    assert out.isna().tolist() == [False, True, True, True, True, True, False]
    assert out.iloc[0] == out.iloc[6] == keyed_label("a@b.com")
    assert isinstance(out.dtype, pd.StringDtype)


def test_pseudonym_leaves_no_raw_value() -> None:
    churn = generate_churn(3_000)
    spec = without_k(load_spec(ROOT / "jobs" / "churn.yaml"))
    out = Anonymizer(spec, KEY).apply(churn).frame
    assert len(out) == len(churn)
    for column in ("account_id", "email"):
        raw = set(churn[column].str.strip().str.casefold())
        assert not set(out[column].str.casefold()) & raw


TRICKY_TEXT = st.sampled_from([" Ann@X.com", "ann@x.com", "STRASSE", "straße", "\u3000", "\t"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=10), TRICKY_TEXT), max_size=25))
def test_text_and_factorized_paths_agree_with_the_reference(values: list[str | None]) -> None:
    # str/string columns are hashed row by row; object and category columns distinct value by value.
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    expected = [None if v is None or not v.strip() else keyed_label(v.strip().casefold()) for v in values]
    for dtype in ("str", "string", object, "category"):
        out = anonymizer.pseudonymize(pd.Series(values, dtype=dtype))
        assert [None if pd.isna(v) else v for v in out] == expected, dtype
        assert isinstance(out.dtype, pd.StringDtype)


def test_pseudonym_of_dates_agrees_for_text_and_datetime() -> None:
    spec = make_spec({"dob": "date"}, {"dob": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    as_text = anonymizer.apply(pd.DataFrame({"dob": ["1985-03-02", " 1990-12-31 ", None]})).frame["dob"]
    as_dates = anonymizer.apply(
        pd.DataFrame({"dob": pd.to_datetime(["1985-03-02", "1990-12-31", None])})
    ).frame["dob"]
    assert as_text.tolist()[:2] == as_dates.tolist()[:2] == [keyed_label("1985-03-02"), keyed_label("1990-12-31")]
    assert as_text.isna().iloc[2] and as_dates.isna().iloc[2]


def test_pseudonym_of_numbers_hashes_their_text() -> None:
    spec = make_spec({"customer_no": "int"}, {"customer_no": {"treatment": "pseudonym"}})
    out = Anonymizer(spec, KEY).apply(pd.DataFrame({"customer_no": [1234567, 42]})).frame["customer_no"]
    assert out.tolist() == [keyed_label("1234567"), keyed_label("42")]
    assert isinstance(out.dtype, pd.StringDtype)
    as_text = Anonymizer(spec, KEY).pseudonymize(pd.Series(["1234567", " 42"], dtype="str"))
    mixed = Anonymizer(spec, KEY).pseudonymize(pd.Series([1234567, "42"], dtype=object))
    assert as_text.tolist() == mixed.tolist() == out.tolist()  # int 123 and "123" agree


def test_pseudonymize_handles_empty_and_all_missing_columns() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    anonymizer = Anonymizer(spec, KEY)
    assert len(anonymizer.pseudonymize(pd.Series([], dtype="str"))) == 0
    assert anonymizer.pseudonymize(pd.Series([None, None], dtype="str")).isna().all()


# -- drop and keep -------------------------------------------------------------------------------


def test_drop_removes_the_column_and_keep_leaves_it() -> None:
    spec = make_spec(
        {"id": "string", "full_name": "string", "city": "string"},
        {
            "id": {"treatment": "pseudonym"},
            "full_name": {"treatment": "drop"},
            "city": {"treatment": "keep", "reason": "coarse enough and needed for the model"},
        },
    )
    df = pd.DataFrame(
        {"id": ["a", "b"], "full_name": ["Ann Lee", None], "city": ["Leeds", "York"], "split": ["train", "test"]}
    )
    result = Anonymizer(spec, KEY).apply(df)
    assert list(result.frame.columns) == ["id", "city", "split"]
    assert result.frame["city"].tolist() == ["Leeds", "York"]
    assert result.frame["split"].tolist() == ["train", "test"]
    assert result.report.columns["full_name"].transformed == 1
    assert result.report.columns["full_name"].nulls == 1
    assert result.report.columns["city"].transformed == 0
    assert result.report.passthrough == ["split"]


def test_input_frame_is_not_modified_and_index_is_kept() -> None:
    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    churn = generate_churn(20_000).set_index(pd.RangeIndex(1_000, 21_000))
    before = churn.copy()
    out = Anonymizer(spec, KEY).apply(churn).frame
    pd.testing.assert_frame_equal(churn, before)
    assert 0 < len(out) < len(churn)  # k-anonymity removed some rows
    assert out.index.isin(churn.index).all()
    kept = churn.loc[out.index]
    assert (out["tenure_months"] == kept["tenure_months"]).all()
    assert (out["date_of_birth"] == kept["date_of_birth"].dt.year).all()


# -- generalize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("as_datetime", [False, True])
def test_generalize_dates(as_datetime: bool) -> None:
    raw = ["1985-03-02", "1999-12-31", None, "2001-01-15"]
    values = pd.to_datetime(raw) if as_datetime else raw
    cases = {"year": [1985, 1999, None, 2001], "decade": [1980, 1990, None, 2000],
             "year_month": ["1985-03", "1999-12", None, "2001-01"]}  # fmt: skip
    for level, expected in cases.items():
        spec = make_spec({"dob": "date"}, {"dob": {"treatment": "generalize", "level": level}})
        out = Anonymizer(spec, KEY).apply(pd.DataFrame({"dob": values})).frame["dob"]
        assert [None if pd.isna(v) else v for v in out] == expected
        assert is_type(out, spec.approved_type("dob"))


@pytest.mark.parametrize("level", ["year", "year_month", "decade"])
def test_generalize_an_all_missing_date_column(level: str) -> None:
    spec = make_spec({"dob": "date"}, {"dob": {"treatment": "generalize", "level": level}})
    out = Anonymizer(spec, KEY).apply(pd.DataFrame({"dob": pd.Series([None, None], dtype=object)})).frame["dob"]
    assert out.isna().all()
    assert is_type(out, spec.approved_type("dob"))


def test_unparsable_dates_are_a_data_error_that_does_not_quote_them() -> None:
    spec = make_spec({"dob": "date"}, {"dob": {"treatment": "generalize", "level": "year"}})
    df = pd.DataFrame({"dob": ["1985-03-02", "secret-not-a-date", "02/03/1985"]})
    with pytest.raises(DataError) as exc:
        Anonymizer(spec, KEY).apply(df)
    message = str(exc.value)
    assert "dob" in message and "2 value(s) are not dates" in message and "1, 2" in message
    assert "secret-not-a-date" not in message


def test_generalize_postcodes() -> None:
    df = pd.DataFrame({"postcode": ["SW1A 1AA", " sw1a 2bb", "M1 1AE", "EH99 1SP", "B338TH", None]})
    expected = {
        "outward": ["SW1A", "SW1A", "M1", "EH99", "B33", None],
        "area": ["SW", "SW", "M", "EH", "B", None],
        "prefix:2": ["SW", "sw", "M1", "EH", "B3", None],
    }
    for level, want in expected.items():
        spec = make_spec({"postcode": "string"}, {"postcode": {"treatment": "generalize", "level": level}})
        out = Anonymizer(spec, KEY).apply(df).frame["postcode"]
        assert [None if pd.isna(v) else v for v in out] == want
        assert isinstance(out.dtype, pd.StringDtype)


def test_generalized_value_that_would_reveal_a_raw_value_is_withheld() -> None:
    # "SW1A" is someone's whole (incomplete) raw postcode: the outward code of "SW1A 1AA" would
    # reveal it, so it is withheld. "AB" has no outward code; "abc" under prefix:3 is the value.
    spec = make_spec({"postcode": "string"}, {"postcode": {"treatment": "generalize", "level": "outward"}})
    df = pd.DataFrame({"postcode": ["SW1A 1AA", "sw1a", "M1 1AE", "AB"]})
    result = Anonymizer(spec, KEY).apply(df)
    assert [None if pd.isna(v) else v for v in result.frame["postcode"]] == [None, "S", "M1", None]
    assert result.report.columns["postcode"].withheld == 2
    assert result.report.columns["postcode"].transformed == 2

    spec = make_spec({"code": "string"}, {"code": {"treatment": "generalize", "level": "prefix:3"}})
    out = Anonymizer(spec, KEY).apply(pd.DataFrame({"code": ["abcdef", "abc", "xy"]})).frame["code"]
    assert [None if pd.isna(v) else v for v in out] == [None, None, None]  # "abc" is a raw value


def test_generalize_never_equals_another_sensitive_raw_value() -> None:
    spec = make_spec(
        {"dob": "date", "note": "string"},
        {"dob": {"treatment": "generalize", "level": "year"}, "note": {"treatment": "drop"}},
    )
    df = pd.DataFrame({"dob": ["1985-03-02", "1990-01-01"], "note": ["born 1985", "1990"]})
    out = Anonymizer(spec, KEY).apply(df).frame["dob"]
    assert [None if pd.isna(v) else v for v in out] == [1985, None]  # 1990 is a raw "note"


def test_bucket_numbers() -> None:
    spec = make_spec(
        {"income": "float", "age": "int", "flag": "bool"},
        {
            "income": {"treatment": "generalize", "level": "bucket:10000"},
            "age": {"treatment": "generalize", "level": "bucket:5"},
            "flag": {"treatment": "generalize", "level": "bucket:2"},
        },
    )
    df = pd.DataFrame(
        {
            "income": [52_345.5, 9_999.99, np.nan, -1.0, np.inf],
            "age": pd.array([34, 35, 39, None, 18], dtype="Int64"),
            "flag": [True, False, True, False, True],
        }
    )
    result = Anonymizer(spec, KEY).apply(df)
    out = result.frame
    assert out["income"].tolist()[:2] == [50_000.0, 0.0]
    assert np.isnan(out["income"].iloc[2]) and out["income"].iloc[3] == -10_000.0
    assert np.isnan(out["income"].iloc[4])  # infinity has no bucket: withheld
    assert result.report.columns["income"].withheld == 1
    assert out["age"].tolist()[:3] == [30.0, 35.0, 35.0] and out["age"].iloc[4] == 15.0
    assert out["flag"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    for column in ("income", "age", "flag"):
        assert is_type(out[column], spec.approved_type(column))


def test_bucket_never_gives_negative_zero() -> None:
    spec = make_spec({"score": "float"}, {"score": {"treatment": "generalize", "level": "bucket:1"}})
    out = Anonymizer(spec, KEY).apply(pd.DataFrame({"score": [-0.0, 0.25]})).frame["score"]
    assert [str(v) for v in out] == ["0.0", "0.0"]


def test_bucket_with_a_fractional_width_is_exact() -> None:
    spec = make_spec({"score": "float"}, {"score": {"treatment": "generalize", "level": "bucket:0.1"}})
    out = Anonymizer(spec, KEY).apply(pd.DataFrame({"score": [0.3, 0.29, 1.05, 2.0]})).frame["score"]
    assert out.tolist() == [0.3, 0.2, 1.0, 2.0]


def test_zero_bucket_width_is_a_spec_error() -> None:
    spec = make_spec({"score": "float"}, {"score": {"treatment": "generalize", "level": "bucket:0"}})
    with pytest.raises(SpecError) as exc:
        Anonymizer(spec, KEY)
    assert "sensitive.columns.score.level" in str(exc.value)


# -- output types and the churn spec -------------------------------------------------------------


def test_output_types_follow_approved_type_on_the_churn_spec() -> None:
    spec = without_k(load_spec(ROOT / "jobs" / "churn.yaml"))
    churn = generate_churn(3_000)
    out = Anonymizer(spec, KEY).apply(churn).frame
    assert len(out) == len(churn)
    assert "full_name" not in out.columns and "phone" not in out.columns
    wrong = {c: str(out[c].dtype) for c in out.columns if not is_type(out[c], spec.approved_type(c))}
    assert wrong == {}
    assert out["postcode"].str.fullmatch(r"[A-Z]{1,2}\d[A-Z\d]?").all()
    assert out["date_of_birth"].between(1940, 2008).all()


def test_dates_as_strings_give_the_same_output_as_datetimes() -> None:
    spec = without_k(load_spec(ROOT / "jobs" / "churn.yaml"))
    churn = generate_churn(1_000)
    as_text = churn.assign(date_of_birth=churn["date_of_birth"].dt.strftime("%Y-%m-%d"))
    a = Anonymizer(spec, KEY).apply(churn).frame
    b = Anonymizer(spec, KEY).apply(as_text).frame
    pd.testing.assert_series_equal(a["date_of_birth"], b["date_of_birth"])
    pd.testing.assert_series_equal(a["email"], b["email"])


def test_missing_sensitive_column_is_a_data_error() -> None:
    spec = make_spec({"email": "string", "phone": "string"},
                     {"email": {"treatment": "pseudonym"}, "phone": {"treatment": "drop"}})  # fmt: skip
    with pytest.raises(DataError) as exc:
        Anonymizer(spec, KEY).apply(pd.DataFrame({"email": ["a@b.c"]}))
    assert "phone" in str(exc.value) and "missing" in str(exc.value)


# -- k-anonymity ---------------------------------------------------------------------------------


def qi_frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 400
    years = rng.choice([1950, 1960, 1970, 1980, 1990], n, p=[0.02, 0.18, 0.3, 0.3, 0.2])
    dob = pd.to_datetime({"year": years + rng.integers(0, 10, n), "month": 6, "day": 1})
    postcode = rng.choice(["SW1A 1AA", "M1 1AE", "LS1 4DY", "IV1 1AA"], n, p=[0.4, 0.3, 0.28, 0.02])
    return pd.DataFrame({"id": [f"u{i}" for i in range(n)], "dob": dob, "postcode": postcode})


def k_spec(on_k_violation: str, k: int | None = 5) -> JobSpec:
    return make_spec(
        {"id": "string", "dob": "date", "postcode": "string"},
        {
            "id": {"treatment": "pseudonym"},
            "dob": {"treatment": "generalize", "level": "year"},
            "postcode": {"treatment": "generalize", "level": "outward"},
        },
        quasi_identifiers=["dob", "postcode"],
        k=k,
        on_k_violation=on_k_violation,
    )


def test_k_anonymity_suppresses_small_groups() -> None:
    df = qi_frame()
    result = Anonymizer(k_spec("suppress"), KEY).apply(df)
    out, report = result.frame, result.report
    sizes = out.groupby(["dob", "postcode"], dropna=False).size()
    assert (sizes >= 5).all()
    assert report.rows_suppressed > 0
    assert report.rows_in == 400 and report.rows_out == len(out) == 400 - report.rows_suppressed
    assert report.k_requested == 5 and report.k_achieved == sizes.min() >= 5
    assert report.quasi_identifiers == ["dob", "postcode"]
    # Exactly the rows of groups smaller than k went (group sizes of the same treatment without k).
    treated = Anonymizer(k_spec("suppress", k=None), KEY).apply(df).frame
    all_sizes = treated.groupby(["dob", "postcode"], dropna=False).size()
    assert report.rows_suppressed == int(all_sizes[all_sizes < 5].sum())
    assert set(out["id"]) == set(treated["id"]) - set(
        treated.merge(all_sizes[all_sizes < 5].rename("n").reset_index(), on=["dob", "postcode"])["id"]
    )


def test_k_anonymity_fail_names_quasi_identifiers_k_and_the_fix() -> None:
    with pytest.raises(DataError) as exc:
        Anonymizer(k_spec("fail"), KEY).apply(qi_frame())
    message = str(exc.value)
    assert "k=5" in message
    assert "dob, postcode" in message
    assert "smallest group has" in message
    assert "coarser generalization" in message and "suppress" in message
    assert exc.value.problems[0].path == "sensitive.k_anonymity"


def test_k_anonymity_counts_missing_quasi_identifiers_as_a_value() -> None:
    spec = make_spec({"id": "string", "dob": "date"},
                     {"id": {"treatment": "pseudonym"}, "dob": {"treatment": "generalize", "level": "decade"}},
                     quasi_identifiers=["dob"], k=2)  # fmt: skip
    df = pd.DataFrame({"id": list("abcde"), "dob": ["1981-01-01", "1985-01-01", None, None, "1990-01-01"]})
    result = Anonymizer(spec, KEY).apply(df)
    assert result.frame["id"].tolist() == Anonymizer(spec, KEY).pseudonymize(pd.Series(list("abcd"))).tolist()
    assert result.report.rows_suppressed == 1 and result.report.k_achieved == 2


def test_without_quasi_identifiers_nothing_is_suppressed() -> None:
    spec = make_spec({"email": "string"}, {"email": {"treatment": "pseudonym"}})
    report = Anonymizer(spec, KEY).apply(pd.DataFrame({"email": ["a@b.c", "d@e.f"]})).report
    assert (report.rows_suppressed, report.k_requested, report.k_achieved) == (0, None, None)


def test_report_is_serializable_evidence() -> None:
    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    report = Anonymizer(spec, KEY).apply(generate_churn(2_000)).report
    again = AnonymizationReport.model_validate_json(report.model_dump_json())
    assert again == report
    assert set(report.columns) == set(spec.sensitive.columns)
    assert report.columns["email"].treatment.value == "pseudonym"
    assert report.columns["date_of_birth"].level == "year"
