"""LeakScan: evidence that no raw value of a sensitive column survived into data about to leave its site.

The scan is built from the *source* (curated) frame and the job spec, then run over every
output partition. It checks every output column of every dtype, not only the sensitive
column's own, so a raw email copied into a ``notes`` column is caught::

    scan = LeakScan.from_source(curated, spec)          # raw values of email, postcode, ...
    report = scan.scan_many({"train/part-0.parquet": f0, "train/part-1.parquet": f1})
    report.raise_if_leaky("data/approved/churn")       # LeakDetected: sync refused

Values are compared in a normal form: ``str(v).strip().casefold()``, with dates (and datetimes,
by their date part) as ISO ``YYYY-MM-DD`` strings, so ``" John@X.com"`` matches ``john@x.com``
and a ``datetime64`` date of birth matches the same date stored as text. Blank values are
never evidence. Reports name where a value was found (``partition:column``) and how many,
never the value itself, because reports are logged.

What is looked for, per sensitive column of the spec:

- **text and dates** (types string, category, date) whose treatment is not ``keep``: every
  raw value, searched for in every output column;
- **numbers and booleans** (types int, float, bool): a number is not identifying by value and
  ``age = 34`` would "match" every ``tenure_months = 34``, so these are checked by *shape* in
  their own column instead: a dropped column must be absent, a pseudonymized one must hold only
  pseudonyms, a bucketed one only multiples of its width;
- ``keep`` columns are declared raw: listed in ``kept_raw``, not counted as leaks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, computed_field

from hybridtrain.errors import DataError, LeakDetected, Problem
from hybridtrain.specs.job import NUMERIC_TYPES, ColumnType, JobSpec, SensitiveColumn, Treatment

#: Output of ``Anonymizer`` pseudonyms: ``p_`` and 20 hex digits of two keyed SipHash-2-4 outputs (see anonymizer).
#: Output of ``Anonymizer`` pseudonyms: ``p_`` and the 20 hex digits of a keyed BLAKE2b digest.
PSEUDONYM_RE = re.compile(r"p_[0-9a-f]{20}")

# Every string ``str()`` of a number or boolean can produce (after casefold). Output columns of
# numeric dtype are only looked at when some raw value has one of these forms.
_NUMBER_LIKE = r"^([-+]?(\d+(\.\d*)?(e[-+]?\d+)?|inf|infinity|nan|snan)|true|false)$"
# Characters str.strip() removes that are ASCII (Python's isspace(), including \x1c-\x1f).
_ASCII_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "


class LeakReport(BaseModel):
    """What a scan found. Merge reports of partitions with ``merge`` (or use ``LeakScan.scan_many``)."""

    model_config = ConfigDict(extra="forbid")

    hits: dict[str, int] = Field(
        default_factory=dict,
        description="Sensitive source column -> output cells holding one of its raw values.",
    )
    examples: dict[str, str] = Field(
        default_factory=dict,
        description="Sensitive source column -> first place a raw value was found ('partition:column').",
    )
    values_checked: int = Field(0, description="Non-null output cells looked at.")
    partitions: int = Field(0, description="Frames scanned.")
    scanned_columns: list[str] = Field(
        default_factory=list, description="Sensitive columns whose raw values were searched for."
    )
    shape_checked: list[str] = Field(
        default_factory=list, description="Numeric sensitive columns checked by shape in their own column."
    )
    kept_raw: list[str] = Field(
        default_factory=list, description="Sensitive columns with treatment keep: raw by declaration."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def clean(self) -> bool:
        """True when no raw sensitive value was found."""
        return not any(self.hits.values())

    def merge(self, other: LeakReport) -> LeakReport:
        """The report of both scans together (counts added, the first example of each column kept)."""
        hits = dict(self.hits)
        for col, n in other.hits.items():
            hits[col] = hits.get(col, 0) + n
        examples = dict(self.examples)
        for col, where in other.examples.items():
            examples.setdefault(col, where)
        return LeakReport(
            hits=hits,
            examples=examples,
            values_checked=self.values_checked + other.values_checked,
            partitions=self.partitions + other.partitions,
            scanned_columns=_union(self.scanned_columns, other.scanned_columns),
            shape_checked=_union(self.shape_checked, other.shape_checked),
            kept_raw=_union(self.kept_raw, other.kept_raw),
        )

    def raise_if_leaky(self, dataset: str) -> None:
        """Raise ``LeakDetected`` (naming each column, where and how often) unless the scan is clean."""
        if not self.clean:
            hits = {col: n for col, n in self.hits.items() if n}
            raise LeakDetected(dataset, hits, {col: self.examples.get(col, "?") for col in hits})


class LeakScan:
    """Raw values of a source frame's sensitive columns, ready to be searched for in outputs."""

    def __init__(
        self,
        raw_values: Mapping[str, pa.Array | Iterable[str]],
        *,
        shape_rules: Mapping[str, SensitiveColumn] | None = None,
        kept_raw: Iterable[str] = (),
    ):
        """``raw_values``: sensitive column -> its raw values, already in normal form (see ``normalize``).

        Usually built with ``from_source``. ``shape_rules`` maps numeric sensitive columns to
        their treatment, checked in the output column of the same name.
        """
        self._raw: dict[str, pa.Array] = {}
        for column, values in raw_values.items():
            arr = values if isinstance(values, pa.Array) else pa.array(list(values), type=pa.string())
            self._raw[column] = pc.filter(arr, pc.greater(pc.binary_length(arr), 0))  # blanks prove nothing
        self._sources = tuple(self._raw)
        self._number_like = any(
            len(a) and pc.any(pc.match_substring_regex(a, _NUMBER_LIKE)).as_py() for a in self._raw.values()
        )
        self._lookup: dict[str, int] | None = None  # built on first scan: costly, only scans need it
        self._shape_rules = dict(shape_rules or {})
        self._kept_raw = list(kept_raw)

    def _table(self) -> dict[str, int]:
        """Normal form -> bitmask of the source columns holding it (one lookup per output value)."""
        if self._lookup is None:
            lookup: dict[str, int] = {}
            for bit, column in enumerate(self._sources):
                forms = self._raw[column].to_pylist()
                flag = 1 << bit
                earlier = {f: lookup[f] for f in forms if f in lookup}  # held by another column too
                lookup.update(dict.fromkeys(forms, flag))
                for f, mask in earlier.items():
                    lookup[f] = mask | flag
            self._lookup = lookup
        return self._lookup

    @classmethod
    def from_source(cls, source: pd.DataFrame, spec: JobSpec) -> LeakScan:
        """Collect the raw values of ``spec``'s sensitive columns from the frame they come from."""
        missing = [c for c in spec.sensitive.columns if c not in source.columns]
        if missing:
            raise DataError(
                spec.dataset.path,
                [
                    Problem(c, "sensitive column is missing from the source frame, so its raw values "
                               "cannot be searched for; scan the curated frame the output was made from")
                    for c in missing
                ],
            )  # fmt: skip
        raw: dict[str, pa.Array] = {}
        shape_rules: dict[str, SensitiveColumn] = {}
        kept: list[str] = []
        for column, rule in spec.sensitive.columns.items():
            declared = spec.data_schema.columns[column]
            if rule.treatment is Treatment.keep:
                kept.append(column)
            elif declared in NUMERIC_TYPES:
                shape_rules[column] = rule
            else:
                raw[column] = cls.raw_forms(source[column], as_date=declared is ColumnType.date)
        return cls(raw, shape_rules=shape_rules, kept_raw=kept)

    @property
    def sources(self) -> tuple[str, ...]:
        """Sensitive columns whose raw values are searched for."""
        return self._sources

    def __len__(self) -> int:
        """Distinct raw values searched for."""
        return len(self._table())

    def scan(self, frame: pd.DataFrame, where: str = "") -> LeakReport:
        """Search every column of ``frame`` for raw values; ``where`` names the frame in examples."""
        hits: dict[str, int] = {}
        examples: dict[str, str] = {}
        checked = 0
        for column, values in frame.items():
            place = f"{where}:{column}" if where else str(column)
            checked += int(values.notna().sum())
            for source, n in self._matches_by_source(values).items():
                hits[source] = hits.get(source, 0) + n
                examples.setdefault(source, place)
            rule = self._shape_rules.get(str(column))
            if rule is not None:
                bad = _shape_violations(values, rule)
                if bad:
                    hits[str(column)] = hits.get(str(column), 0) + bad
                    examples.setdefault(str(column), place)
        return LeakReport(
            hits=hits,
            examples=examples,
            values_checked=checked,
            partitions=1,
            scanned_columns=list(self._sources),
            shape_checked=list(self._shape_rules),
            kept_raw=self._kept_raw,
        )

    def scan_many(
        self, frames: Mapping[str, pd.DataFrame] | Iterable[tuple[str, pd.DataFrame]] | Iterable[pd.DataFrame]
    ) -> LeakReport:
        """Scan partitions one after another (``{path: frame}``, ``(path, frame)`` pairs or bare frames)."""
        items: Iterable[Any] = frames.items() if isinstance(frames, Mapping) else frames
        report = LeakReport(
            scanned_columns=list(self._sources), shape_checked=list(self._shape_rules), kept_raw=self._kept_raw
        )
        for i, item in enumerate(items):
            where, frame = item if isinstance(item, tuple) else (f"#{i}", item)
            report = report.merge(self.scan(frame, str(where)))
        return report

    def matches(self, values: pd.Series) -> np.ndarray:
        """Boolean mask: where ``values`` equal (in normal form) a raw value of any scanned column."""
        if not self._could_match(values):
            return np.zeros(len(values), dtype=bool)
        codes, forms = self.normalize(values)
        if not len(forms):
            return np.zeros(len(values), dtype=bool)
        if self._lookup is None:
            # Few distinct values (years, outward codes): look for them in the raw arrays instead
            # of building the full lookup table.
            found = [pc.filter(raw, pc.is_in(raw, value_set=forms)) for raw in self._raw.values()]
            hit = pc.is_in(forms, value_set=pa.concat_arrays(found)).to_numpy(zero_copy_only=False)
        else:
            get = self._lookup.get
            hit = np.fromiter((get(f, 0) != 0 for f in forms.to_pylist()), dtype=bool, count=len(forms))
        return (codes >= 0) & hit[np.maximum(codes, 0)]

    @staticmethod
    def normalize(values: pd.Series, *, as_date: bool = False) -> tuple[np.ndarray, pa.Array]:
        """Factorize ``values`` into codes (-1 for missing) and the normal form of each distinct value.

        Normal form: ``str(v).strip().casefold()``; dates and datetimes by their ISO date
        ``YYYY-MM-DD``; with ``as_date``, text that parses as an ISO date also becomes its ISO
        date. Blank values normalize to ``""``. Forms come back as an Arrow string array.
        """
        codes, uniques = _factorize_exactly(values)
        if len(uniques) == 0:
            return codes, pa.array([], type=pa.string())
        if isinstance(uniques, pd.DatetimeIndex):
            return codes, pa.array(_iso_dates(uniques), type=pa.string())
        if isinstance(uniques, pd.CategoricalIndex):
            uniques = pd.Index(np.asarray(uniques, dtype=object), dtype=object)
        if isinstance(uniques.dtype, pd.StringDtype):  # the common case: vectorized
            forms = _normal_text(pa.array(uniques.array))
        else:
            forms = pa.array([_text_form(v) for v in uniques.tolist()], type=pa.string())
        if as_date:
            dates = pa.array(_parse_dates(uniques), type=pa.string())
            forms = pc.if_else(pc.is_null(dates), forms, dates)
        return codes, forms

    @classmethod
    def raw_forms(cls, values: pd.Series, *, as_date: bool = False) -> pa.Array:
        """Every normal form under which a raw value could appear (dates: as text and as ISO date)."""
        forms = cls.normalize(values)[1]
        if as_date and not pd.api.types.is_datetime64_any_dtype(values.dtype):
            forms = pa.concat_arrays([forms, cls.normalize(values, as_date=True)[1]])
        return pc.filter(forms, pc.greater(pc.binary_length(forms), 0))

    def _could_match(self, values: pd.Series) -> bool:
        if not any(len(a) for a in self._raw.values()):
            return False
        # str() of an int, float or bool is digits, sign, dot, exponent, inf/nan or true/false:
        # skip those (often high-cardinality) columns unless some raw value looks like that.
        dtype = values.dtype
        numeric = pd.api.types.is_bool_dtype(dtype) or (
            pd.api.types.is_numeric_dtype(dtype) and getattr(dtype, "kind", "O") in "iuf"
        )
        return self._number_like or not numeric

    def _matches_by_source(self, values: pd.Series) -> dict[str, int]:
        if not self._could_match(values):
            return {}
        codes, forms = self.normalize(values)
        get = self._table().get
        masks = np.fromiter((get(f, 0) for f in forms.to_pylist()), dtype=np.int64, count=len(forms))
        if not masks.any():
            return {}
        per_value = np.bincount(codes[codes >= 0], minlength=len(forms))
        found: dict[str, int] = {}
        for bit, source in enumerate(self._sources):
            n = int(per_value[(masks & (1 << bit)) != 0].sum())
            if n:
                found[source] = n
        return found


def _factorize_exactly(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """``pandas.factorize``, but never merging values whose text differs.

    Plain factorize treats ``-0.0`` and ``0.0`` as one float, and ``1``, ``1.0`` and ``True``
    in an object column as one value; the text of the merged value would then depend on which
    came first, so a scan of one partition could miss what a scan of another finds.
    """
    dtype = values.dtype
    if pd.api.types.is_float_dtype(dtype):
        x = values.to_numpy(dtype=np.float64, na_value=np.nan)
        present = ~np.isnan(x)
        codes = np.full(len(x), -1, dtype=np.intp)
        bits_codes, bits = pd.factorize(x[present].view(np.int64))
        codes[present] = bits_codes
        return codes, pd.Index(np.asarray(bits, dtype=np.int64).view(np.float64))
    if dtype == object:
        present = values.notna().to_numpy()
        objects = values.to_numpy()[present]
        # Type and repr tell 1 from 1.0 from True, and -0.0 from 0.0 (equal as Python values).
        key_codes, _ = pd.factorize(pd.Series([f"{type(v).__qualname__}:{v!r}" for v in objects], dtype=object))
        codes = np.full(len(values), -1, dtype=np.intp)
        codes[present] = key_codes
        _, first = np.unique(key_codes, return_index=True)  # first row holding each distinct value
        return codes, pd.Index(objects[first], dtype=object)
    return pd.factorize(values)


def _normal_text(text: pa.Array) -> pa.Array:
    """``str.strip().casefold()`` of every string, vectorized where that is exact (ASCII text)."""
    out = pc.ascii_lower(pc.ascii_trim(text, characters=_ASCII_WHITESPACE))
    ascii_only = pc.string_is_ascii(text)
    if not pc.all(ascii_only).as_py():
        other = pc.invert(ascii_only)
        idx = np.flatnonzero(other.to_numpy(zero_copy_only=False))
        fixed = [v.strip().casefold() for v in text.take(idx).to_pylist()]
        out = pc.replace_with_mask(out, other, pa.array(fixed, type=out.type))
    return out.cast(pa.string())


def _text_form(value: Any) -> str:
    if isinstance(value, str):
        return value.strip().casefold()
    if isinstance(value, datetime):  # pd.Timestamp too
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, np.datetime64):
        return str(value.astype("datetime64[D]"))
    return str(value).strip().casefold()


def _iso_dates(index: pd.DatetimeIndex) -> list[str]:
    if index.tz is not None:
        index = index.tz_localize(None)  # the wall-clock date where it was recorded
    return np.datetime_as_string(index.to_numpy().astype("datetime64[D]")).tolist()


def _parse_dates(uniques: pd.Index) -> list[str | None]:
    """ISO date of each distinct value that reads as an ISO date or is one (None where not)."""
    text = pd.Index([v.strip() if isinstance(v, str) else v for v in uniques.tolist()], dtype=object)
    try:
        parsed = pd.to_datetime(text, format="ISO8601", errors="coerce")
    except (ValueError, TypeError):  # e.g. mixed UTC offsets: parse one by one
        parsed = pd.Index([_parse_one(v) for v in text], dtype=object)
    if isinstance(parsed, pd.DatetimeIndex):
        iso = _iso_dates(parsed)
        return [None if missing else d for missing, d in zip(parsed.isna(), iso, strict=True)]
    return [None if p is None else _text_form(p) for p in parsed]


def _parse_one(value: Any) -> pd.Timestamp | None:
    try:
        ts = pd.to_datetime(value, format="ISO8601")
    except (ValueError, TypeError, OverflowError):
        return None
    return None if pd.isna(ts) else ts


def _shape_violations(values: pd.Series, rule: SensitiveColumn) -> int:
    """Cells of a numeric sensitive column that are not in their treated form."""
    present = values.notna()
    if rule.treatment is Treatment.drop:
        return int(present.sum())
    if rule.treatment is Treatment.pseudonym:
        text = values[present].astype(str)
        return int((~text.str.fullmatch(PSEUDONYM_RE.pattern)).sum())
    if rule.treatment is Treatment.generalize and rule.level and rule.level.startswith("bucket:"):
        width = float(rule.level.split(":", 1)[1])
        numbers = pd.to_numeric(values[present], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = numbers / width
            on_grid = np.isfinite(q) & (np.abs(q - np.round(q)) <= 1e-6 * np.maximum(1.0, np.abs(q)))
        return int((~on_grid).sum())
    return 0


def _union(a: list[str], b: list[str]) -> list[str]:
    return a + [x for x in b if x not in a]
