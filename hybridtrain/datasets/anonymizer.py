"""Anonymizer: turns a curated frame into one fit to leave its site — each sensitive column treated, then k-anonymity.

Treatments come from ``sensitive.columns`` of the job spec; other columns pass through::

    email:         {treatment: pseudonym}               " Ann@X.com" -> "p_3f1c0a9e5b7d2e4f6a81"
    full_name:     {treatment: drop}                     column removed
    date_of_birth: {treatment: generalize, level: year}  1985-03-02 -> 1985 (Int64)
    postcode:      {treatment: generalize, level: outward}  "SW1A 1AA" -> "SW1A"

- **pseudonym**: ``"p_"`` + 20 lowercase hex digits (80 bits) of a keyed PRF of the normal form
  ``str(v).strip().casefold()`` (dates: ISO ``YYYY-MM-DD``), taken as UTF-8 bytes. The same key
  gives the same pseudonym in every run, process and dataset, so joins still work; without the
  key the raw value cannot be recovered or confirmed. Missing and blank values stay missing.

  *PRF*: SipHash-2-4 (Aumasson & Bernstein, 2012: a PRF/MAC with a 128-bit key and 64-bit
  output), run in C over the whole column by ``pandas.util.hash_array`` — which follows SipHash
  with a fixed, public, invertible 64-bit mixer (the splitmix64 finalizer; a public permutation
  of a PRF's output is still a PRF). Two independent instances give ``h0`` and ``h1``; the
  pseudonym is ``h0`` as 16 hex digits then the top 16 bits of ``h1`` as 4, i.e. the first 10
  bytes of big-endian ``h0 || h1``.

  *Keys*: the two 16-byte SipHash keys are derived from the secret with keyed BLAKE2b (RFC 7693,
  16-byte digest of the empty message, personalizations ``hybridtrain/psk0`` and
  ``hybridtrain/psk1``); a secret longer than 64 bytes (BLAKE2b's key limit) is first hashed to
  64 bytes with unkeyed BLAKE2b-512. pandas takes the SipHash key as a 16-character ``str``
  encoded with its ``encoding`` argument: passing ``latin-1`` (one character per byte) and the
  messages as ``bytes`` (hashed as they are, never re-encoded) keeps all 128 key bits.

  *Strength*: about 128 bits of key (each SipHash key can be searched for on its own, so two
  do not make 256), against known raw/pseudonym pairs; 80 output bits, so among n distinct
  values a collision has probability about n²/2⁸¹ (2·10⁻¹⁴ for 200,000, 4·10⁻⁷ for 10⁹).
  SipHash has less security margin than BLAKE2b or HMAC-SHA256, but no attack on SipHash-2-4
  with a secret key is known.

  *Why it changed*: throughput. Keyed BLAKE2b needed one Python-level hash call per distinct
  value, about 1M values/s per core (0.53M churn rows/s for its two pseudonym columns, against
  a 1M rows/s target); pandas runs SipHash over the whole column in C with no per-value Python
  (``benchmarks/anonymize_throughput.py``: 1.5-2.2M rows/s per core on a busy 2-core machine).
  Pseudonyms from before and after each switch (first 20 hex digits of HMAC-SHA256 -> keyed
  BLAKE2b ``hybridtrain/psn1`` -> this SipHash form) differ, so do not join approved data
  across a switch.
- **generalize**: dates to ``year`` (int), ``year_month`` (``"YYYY-MM"``) or ``decade`` (int,
  e.g. 1980); strings to the UK ``outward`` code (before the space, else all but the last 3
  characters), the postcode ``area`` (leading letters) or ``prefix:N`` (first N characters,
  only for longer values); numbers to ``bucket:W`` (``floor(x / W) * W``, float).
  A generalized value is never allowed to equal a raw sensitive value: one that would (a
  three-letter value under ``prefix:3``, an outward code that is also someone's whole raw
  postcode) is *withheld* — emptied and counted — so the leak scan cannot find it.
- **drop** removes the column; **keep** leaves it as it is (the spec says why).

Output types follow ``JobSpec.approved_type``: string -> pandas ``str``, int -> ``Int64``,
float -> ``float64``. Then, with ``k_anonymity`` set, rows are grouped by the (treated)
quasi-identifiers and groups smaller than k are removed (``on_k_violation: suppress``, counted
in the report) or the run fails with ``DataError`` (``fail``).

The key comes from a Prefect Secret at run time; it is never read from the spec or the code.
An ``Anonymizer`` does not keep the key as an attribute: it keeps only the two derived SipHash
keys, inside an opaque holder whose ``repr`` hides them and which refuses to be pickled (plain
pickle, cloudpickle) or deep-copied, so the key material cannot leak through ``repr``, ``vars``,
logs or a persisted task result.

Longer than most modules on purpose: every column treatment and the k-anonymity pass operate on one frame and share its bookkeeping.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from hybridtrain.datasets.leak_scan import LeakScan, _normal_text
from hybridtrain.errors import DataError, Problem, SpecError
from hybridtrain.specs.job import NUMERIC_TYPES, ColumnType, JobSpec, SensitiveColumn, Treatment, check_semantics

MIN_KEY_BYTES = 16
PSEUDONYM_PREFIX = "p_"
PSEUDONYM_HEX_DIGITS = 20
#: BLAKE2b personalizations deriving the two SipHash-2-4 keys from the secret; they separate
#: these keys from any other use of the same secret (and from the older ``hybridtrain/psn1``).
PSEUDONYM_SUBKEY_PERSONS = (b"hybridtrain/psk0", b"hybridtrain/psk1")
_BLAKE2B_MAX_KEY = 64
_SIPHASH_KEY_BYTES = 16

_ISO_DATE = re.compile(r"(-?\d{4,})-(\d{2})-(\d{2})")
_LETTERS = re.compile(r"[^\W\d_]+")
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
#: The 4 lowercase hex digits of every 16-bit number, as one little-endian uint32 each (256 KiB).
_HEX4 = np.ascontiguousarray(
    _HEX[(np.arange(1 << 16, dtype=np.uint32)[:, None] >> np.array([12, 8, 4, 0], dtype=np.uint32)) & 0xF]
).view("<u4").ravel()


class ColumnReport(BaseModel):
    """What happened to one sensitive column (counts over the input rows)."""

    model_config = ConfigDict(extra="forbid")

    treatment: Treatment
    level: str | None = None
    transformed: int = Field(description="Non-missing values replaced (drop: removed; keep: 0).")
    nulls: int = Field(description="Missing or blank values in the input; they stay missing.")
    withheld: int = Field(
        0, description="Values emptied because their generalization would equal a raw sensitive value "
        "or cannot be computed (e.g. an outward code of a 2-character string).",
    )  # fmt: skip


class AnonymizationReport(BaseModel):
    """Evidence of one ``Anonymizer.apply``: treatments per column and the k-anonymity outcome."""

    model_config = ConfigDict(extra="forbid")

    columns: dict[str, ColumnReport]
    passthrough: list[str] = Field(description="Columns not listed in sensitive.columns, left unchanged.")
    rows_in: int
    rows_out: int
    rows_suppressed: int = Field(description="Rows removed because their quasi-identifier group was smaller than k.")
    quasi_identifiers: list[str]
    k_requested: int | None
    k_achieved: int | None = Field(
        description="Smallest quasi-identifier group in the output; None without quasi-identifiers or rows."
    )


@dataclass(frozen=True)
class AnonymizedData:
    """The anonymized frame (input index kept, suppressed rows removed) and its report."""

    frame: pd.DataFrame
    report: AnonymizationReport


class Anonymizer:
    """Applies a job spec's sensitive-column treatments and k-anonymity with a secret pseudonym key."""

    def __init__(self, spec: JobSpec, key: bytes):
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise ValueError(
                f"the pseudonym key must be bytes, got {type(key).__name__}; read it from the Prefect "
                "Secret block and encode it (e.g. bytes.fromhex(secret) or secret.encode())"
            )
        key = bytes(key)
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(
                f"the pseudonym key is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes "
                "(e.g. secrets.token_hex(32)) stored in a Prefect Secret block, never in the spec or the code"
            )
        problems = [p for p in check_semantics(spec) if p.path.startswith("sensitive.")]
        problems += _bucket_width_problems(spec)
        if problems:
            raise SpecError(f"job spec {spec.name!r}", problems)
        self._spec = spec
        self._keys = _PseudonymKeys(key)

    def __repr__(self) -> str:
        return f"Anonymizer(spec={self._spec.name!r}, key=<hidden>)"

    @property
    def spec(self) -> JobSpec:
        return self._spec

    def apply(self, frame: pd.DataFrame) -> AnonymizedData:
        """Treat every sensitive column of ``frame``, then enforce k-anonymity; ``frame`` is not modified."""
        spec = self._spec
        self._check_columns(frame)
        rules = spec.sensitive.columns
        needs_guard = any(r.treatment is Treatment.generalize for r in rules.values())
        guard = LeakScan.from_source(frame, spec) if needs_guard else None

        treated: dict[str, pd.Series] = {}
        reports: dict[str, ColumnReport] = {}
        for column, rule in rules.items():
            new, report = self._treat(frame[column], column, rule, guard)
            reports[column] = report
            if new is not None:
                treated[column] = new

        dropped = [c for c, r in rules.items() if r.treatment is Treatment.drop]
        out = frame.drop(columns=dropped)
        for column, values in treated.items():
            out[column] = values.array

        qis = list(spec.sensitive.quasi_identifiers)
        rows_in = len(out)
        k = spec.sensitive.k_anonymity
        sizes = _group_sizes(out, qis) if qis else None
        if k is not None and sizes is not None and len(sizes) and sizes.min() < k:
            small = sizes < k
            if spec.sensitive.on_k_violation == "fail":
                raise DataError(spec.dataset.path, [_k_problem(spec, qis, k, sizes, small)])
            out = out[~small]
            sizes = sizes[~small]
        report = AnonymizationReport(
            columns=reports,
            passthrough=[str(c) for c in frame.columns if c not in rules],
            rows_in=rows_in,
            rows_out=len(out),
            rows_suppressed=rows_in - len(out),
            quasi_identifiers=qis,
            k_requested=k,
            k_achieved=int(sizes.min()) if sizes is not None and len(sizes) else None,
        )
        return AnonymizedData(frame=out, report=report)

    def pseudonymize(self, values: pd.Series, *, as_date: bool = False) -> pd.Series:
        """Pseudonyms of ``values`` (``str`` dtype, same index); missing and blank values stay missing.

        Text columns (pandas ``str``/``string``) are normalized and hashed row by row, all in C:
        pseudonym columns hold mostly distinct identifiers, and hashing every row costs less than
        factorizing first. Other dtypes (objects, numbers, dates, categories) and ``as_date`` go
        through ``LeakScan.normalize``, which factorizes, so each distinct value is hashed once.
        Either way the message is the leak scan's normal form. ``as_date``: hash dates by their
        ISO form, so a date and the same date as text agree.
        """
        if isinstance(values.dtype, pd.StringDtype) and not as_date:
            codes, forms = None, _normal_text(pc.fill_null(pa.array(values.array), ""))
        else:
            codes, forms = LeakScan.normalize(values, as_date=as_date)
        forms = pc.fill_null(forms, "")
        present = pc.not_equal(pc.binary_length(forms), 0).to_numpy(zero_copy_only=False)
        h0, h1 = self._keys.hash(forms.cast(pa.large_binary()).to_numpy(zero_copy_only=False))
        if codes is None:
            labels = _labels(h0, h1, present)
        else:
            keep = codes >= 0
            keep[keep] = present[codes[keep]]
            labels = _labels(h0, h1).take(pa.array(codes, mask=~keep))
        return pd.Series(pd.array(labels, dtype="str"), index=values.index, name=values.name)

    # -- treatments -------------------------------------------------------------------------

    def _treat(
        self, values: pd.Series, column: str, rule: SensitiveColumn, guard: LeakScan | None
    ) -> tuple[pd.Series | None, ColumnReport]:
        declared = self._spec.data_schema.columns[column]
        if rule.treatment is Treatment.pseudonym:
            new = self.pseudonymize(values, as_date=declared is ColumnType.date)
            done = int(new.notna().sum())  # blank and missing inputs are the missing outputs
            return new, ColumnReport(treatment=rule.treatment, transformed=done, nulls=len(new) - done)
        nulls = _blank_or_missing(values)
        present = int((~nulls).sum())
        if rule.treatment is Treatment.keep:
            return values, ColumnReport(treatment=rule.treatment, transformed=0, nulls=int(nulls.sum()))
        if rule.treatment is Treatment.drop:
            return None, ColumnReport(treatment=rule.treatment, transformed=present, nulls=int(nulls.sum()))

        level = rule.level or ""
        dataset = self._spec.dataset.path
        if declared is ColumnType.date:
            new = _generalize_date(values, level, column, dataset)
        elif declared in NUMERIC_TYPES:
            new = _bucket(values, level, column, dataset)
        else:
            new = _generalize_text(values, level)
        if guard is not None:
            # A generalization that equals a raw sensitive value (of any column) would reveal it.
            collide = guard.matches(new)
            if collide.any():
                new = new.mask(collide)
        withheld = int((new.isna().to_numpy() & ~nulls).sum())
        report = ColumnReport(
            treatment=rule.treatment,
            level=rule.level,
            transformed=present - withheld,
            nulls=int(nulls.sum()),
            withheld=withheld,
        )
        return new, report

    def _check_columns(self, frame: pd.DataFrame) -> None:
        problems = []
        dupes = frame.columns[frame.columns.duplicated()].unique()
        for c in dupes:
            problems.append(Problem(str(c), "column name appears more than once; give each column one name"))
        for c in self._spec.sensitive.columns:
            if c not in frame.columns:
                problems.append(
                    Problem(c, "sensitive column is missing from the data; check the curated dataset "
                               "against schema.columns (the anonymizer will not guess where it went)")
                )  # fmt: skip
        for c in self._spec.sensitive.quasi_identifiers:
            if c not in frame.columns and c not in self._spec.sensitive.columns:
                problems.append(Problem(c, "quasi-identifier is missing from the data"))
        if problems:
            raise DataError(self._spec.dataset.path, problems)


# -- pseudonyms ----------------------------------------------------------------------------------


class _PseudonymKeys:
    """The two SipHash-2-4 keys derived from the secret, as pandas takes them (16 latin-1 characters).

    Opaque on purpose: ``repr`` hides them, there is no ``__dict__`` for ``vars`` to show, and
    pickling (plain or cloudpickle) and deep copies are refused.
    """

    __slots__ = ("_k0", "_k1")

    def __init__(self, secret: bytes):
        if len(secret) > _BLAKE2B_MAX_KEY:
            secret = hashlib.blake2b(secret).digest()
        k0, k1 = (
            hashlib.blake2b(key=secret, digest_size=_SIPHASH_KEY_BYTES, person=person).digest().decode("latin-1")
            for person in PSEUDONYM_SUBKEY_PERSONS
        )
        self._k0, self._k1 = k0, k1

    def hash(self, messages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(h0, h1)``: the two keyed 64-bit hashes of each message (an object array of ``bytes``)."""
        # latin-1 only encodes the key (one byte per character); bytes messages are hashed as they are.
        h0 = pd.util.hash_array(messages, encoding="latin-1", hash_key=self._k0, categorize=False)
        h1 = pd.util.hash_array(messages, encoding="latin-1", hash_key=self._k1, categorize=False)
        return h0, h1

    def __repr__(self) -> str:
        return "<pseudonym keys: hidden>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "an Anonymizer's pseudonym keys cannot be pickled or copied; pass the Secret block name "
            "and build the Anonymizer where it runs"
        )


def _labels(h0: np.ndarray, h1: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """``p_`` + hex of ``h0`` (16 digits) + hex of the top 16 bits of ``h1`` (4 digits), as Arrow strings.

    Rows where ``valid`` is false are null. No per-value Python: the text is built in one
    buffer, four hex digits per 16 bits through a lookup table.
    """
    n = len(h0)
    quads = np.empty((n, 5), dtype=np.uint16)  # the five 16-bit groups, most significant first
    quads[:, :4] = h0.astype(">u8").view(">u2").reshape(n, 4)
    quads[:, 4] = h1 >> np.uint64(48)
    width = len(PSEUDONYM_PREFIX) + PSEUDONYM_HEX_DIGITS
    text = np.empty((n, width), dtype=np.uint8)
    text[:, : len(PSEUDONYM_PREFIX)] = np.frombuffer(PSEUDONYM_PREFIX.encode(), dtype=np.uint8)
    text[:, len(PSEUDONYM_PREFIX) :] = _HEX4[quads].view(np.uint8).reshape(n, PSEUDONYM_HEX_DIGITS)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    nulls = 0 if valid is None else n - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text), bitmap, nulls)


# -- generalization ------------------------------------------------------------------------------


def _generalize_date(values: pd.Series, level: str, column: str, dataset: str) -> pd.Series:
    """Dates (datetime64, date objects or ISO text) to year (Int64), year_month ("YYYY-MM") or decade (Int64)."""
    codes, arrow_forms = LeakScan.normalize(values, as_date=True)
    forms = arrow_forms.to_pylist()
    years = np.zeros(len(forms), dtype=np.int64)
    months = np.zeros(len(forms), dtype=np.int64)
    bad: list[int] = []
    valid = np.ones(len(forms), dtype=bool)
    for i, form in enumerate(forms):
        m = _ISO_DATE.fullmatch(form)
        if m:
            years[i], months[i] = int(m.group(1)), int(m.group(2))
        else:
            valid[i] = False
            if form:  # blank is missing, anything else is not a date
                bad.append(i)
    if bad:
        rows = np.flatnonzero(np.isin(codes, bad))
        raise DataError(
            dataset,
            [
                Problem(
                    column,
                    f"{len(rows)} value(s) are not dates (expected YYYY-MM-DD), at row position(s) "
                    f"{', '.join(map(str, rows[:5]))}{' ...' if len(rows) > 5 else ''}; fix them in the "
                    "curated data or change the column's type in schema.columns",
                )
            ],
        )  # values themselves are not quoted: error messages end up in logs
    if not forms:  # nothing but missing values
        codes = np.full(len(codes), -1)
        years, months, valid = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, bool)
    take = np.maximum(codes, 0)
    missing = (codes < 0) | ~valid[take]
    if level == "year_month":
        labels = np.array([f"{y:04d}-{m:02d}" for y, m in zip(years, months, strict=True)], dtype=object)
        out = np.where(missing, None, labels[take])
        return pd.Series(pd.array(out, dtype="str"), index=values.index, name=values.name)
    unit = years if level == "year" else (years // 10) * 10
    return pd.Series(pd.arrays.IntegerArray(unit[take], missing), index=values.index, name=values.name)


def _generalize_text(values: pd.Series, level: str) -> pd.Series:
    """Strings (postcodes and the like) to their outward code, area letters or a prefix."""
    codes, uniques = pd.factorize(values)
    if level == "outward":
        fn = _outward
    elif level == "area":
        fn = _area
    else:
        fn = _prefix(int(level.split(":", 1)[1]))
    labels = pa.array([fn(v if isinstance(v, str) else str(v)) for v in uniques.tolist()], type=pa.string())
    taken = labels.take(pa.array(codes, mask=codes < 0))
    return pd.Series(pd.array(taken, dtype="str"), index=values.index, name=values.name)


def _outward(value: str) -> str | None:
    text = value.strip().upper()
    parts = text.split(None, 1)
    if len(parts) == 2:
        return parts[0]
    return text[:-3] if len(text) > 3 else None  # no outward code can be told from <= 3 characters


def _area(value: str) -> str | None:
    m = _LETTERS.match(value.strip().upper())
    return m.group(0) if m else None


def _prefix(n: int) -> Any:
    def prefix(value: str) -> str | None:
        text = value.strip()
        return text[:n] if len(text) > n else None  # a prefix as long as the value *is* the value

    return prefix


def _bucket(values: pd.Series, level: str, column: str, dataset: str) -> pd.Series:
    """Numbers to ``floor(x / W) * W`` (float64); non-finite values are withheld."""
    width_text = level.split(":", 1)[1]
    width = float(width_text)
    decimals = len(width_text.partition(".")[2])
    if pd.api.types.is_bool_dtype(values.dtype) or pd.api.types.is_numeric_dtype(values.dtype):
        x = values.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        x = pd.to_numeric(values, errors="coerce").astype("float64").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.isnan(x) & ~_blank_or_missing(values)
        if bad.any():
            rows = np.flatnonzero(bad)
            raise DataError(
                dataset,
                [Problem(column, f"{len(rows)} value(s) are not numbers, at row position(s) "
                                 f"{', '.join(map(str, rows[:5]))}; fix them in the curated data")],
            )  # fmt: skip
    scale = 10.0**decimals
    with np.errstate(invalid="ignore", over="ignore"):
        # In units of 10**-decimals first, so 0.3 with width 0.1 lands in 0.3, not 0.2.
        q = np.floor(np.round(x * scale, 6) / round(width * scale))
        out = np.round(q * width, decimals)
    out[~np.isfinite(out)] = np.nan
    out[out == 0] = 0.0  # no "-0.0" bucket
    return pd.Series(out, index=values.index, name=values.name, dtype="float64")


# -- k-anonymity ---------------------------------------------------------------------------------


def _group_sizes(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Size of each row's group over ``columns`` (missing is a value of its own)."""
    key = np.zeros(len(frame), dtype=np.int64)
    for c in columns:
        codes, uniques = pd.factorize(frame[c], use_na_sentinel=False)
        key = key * (len(uniques) + 1) + codes
        key, _ = pd.factorize(key)  # keep the combined key small
    return np.bincount(key)[key] if len(key) else np.zeros(0, dtype=np.int64)


def coarser_level(spec: JobSpec, column: str) -> str:
    """A hint naming a generalization of ``column`` coarser than its current one, that exists for its type."""
    declared = spec.data_schema.columns.get(column)
    rule = spec.sensitive.columns.get(column)
    path = f"sensitive.columns.{column}"
    current = rule.level if rule is not None and rule.treatment is Treatment.generalize else None
    if declared is ColumnType.date:
        order = ["year_month", "year", "decade"]
        nxt = order[order.index(current) + 1] if current in order[:-1] else None
        if current is None:
            return f"{path}: {{treatment: generalize, level: year}}"
        return f"{path}.level: {nxt}" if nxt else f"drop {column} from quasi_identifiers (decade is the coarsest)"
    if declared in NUMERIC_TYPES:
        if current is None:
            return f"{path}: {{treatment: generalize, level: bucket:10}}"
        width = float(current.split(":", 1)[1]) * 2
        return f"{path}.level: bucket:{width:g}"
    if current is None:
        return f"{path}: {{treatment: generalize, level: prefix:3}}"
    if current.startswith("prefix:"):
        n = int(current.split(":", 1)[1])
        return f"{path}.level: prefix:{n - 1}" if n > 1 else f"drop {column} from quasi_identifiers"
    if current == "outward":
        return f"{path}.level: area (UK postcodes) or prefix:2"
    return f"{path}.level: prefix:1"


def _k_problem(spec: JobSpec, qis: list[str], k: int, sizes: np.ndarray, small: np.ndarray) -> Problem:
    names = ", ".join(qis)
    hints = "; ".join(coarser_level(spec, q) for q in qis)
    return Problem(
        "sensitive.k_anonymity",
        f"k-anonymity k={k} over quasi-identifiers ({names}) is not met after treatment: "
        f"{int(small.sum())} row(s) are in groups smaller than {k} (the smallest group has "
        f"{int(sizes.min())} row(s)); use coarser generalization levels ({hints}) or set "
        "sensitive.on_k_violation: suppress to drop those rows",
    )


# -- helpers -------------------------------------------------------------------------------------


def _blank_or_missing(values: pd.Series) -> np.ndarray:
    """Missing values, and text that is empty or only whitespace (both stay missing)."""
    if values.dtype == object or isinstance(values.dtype, pd.StringDtype):
        codes, forms = LeakScan.normalize(values)
        blank = pc.equal(pc.binary_length(forms), 0).to_numpy(zero_copy_only=False)
        return (codes < 0) | blank[np.maximum(codes, 0)] if len(forms) else np.ones(len(values), dtype=bool)
    return values.isna().to_numpy()


def _bucket_width_problems(spec: JobSpec) -> list[Problem]:
    problems = []
    for name, rule in spec.sensitive.columns.items():
        if rule.treatment is Treatment.generalize and rule.level and rule.level.startswith("bucket:"):
            if float(rule.level.split(":", 1)[1]) <= 0:
                problems.append(Problem(f"sensitive.columns.{name}.level", "bucket width must be greater than 0"))
    return problems
