"""DataGates: the checks anonymized data must pass before anything of it leaves its site.

The anonymization stage runs them on the approved frame — after treatments, k-anonymity and
sampling, before a file is written, versioned or synced — so unusable data fails at its own
site with a line naming the column or the limit, instead of being synced, trained on and
registered:

- **label**: the label must have two classes overall and in the train and test splits (a
  single-class label cannot train a classifier nor be scored by AUC);
- **features**: every feature the model uses must have values (not empty, not all missing) and
  more than one distinct value (a constant column carries nothing);
- **suppression**: k-anonymity may remove at most ``sensitive.max_suppressed_fraction`` of the
  rows (default 5 %); above that the data left is not the data the job was asked about;
- **generalization fit**: a level that withholds most of a column (``area`` on US ZIP codes) does
  not fit the data's format: use ``prefix:N``;
- **rows per split**: each of train, val and test needs at least ``split.min_rows`` rows.

Example: a spec whose quasi-identifiers are too fine for a 3,000-row sample suppresses 99 % of
the rows: ``sensitive.max_suppressed_fraction: k-anonymity (k=5) suppressed 2,978 of 3,000 rows
(99.3 %); the limit is 5.0 % — coarsen sensitive.columns.postcode.level ...``.
"""

from __future__ import annotations

import pandas as pd

from hybridtrain.datasets.anonymizer import AnonymizationReport, coarser_level
from hybridtrain.datasets.partitioned import SPLIT_COL
from hybridtrain.errors import DataError, Problem
from hybridtrain.specs.job import JobSpec

SPLITS = ("train", "val", "test")
#: A generalization that withholds more than this share of a column's values does not fit the data's format.
MAX_WITHHELD_FRACTION = 0.5


def problems(spec: JobSpec, frame: pd.DataFrame, report: AnonymizationReport) -> list[Problem]:
    """Every reason ``frame`` (the approved rows, with the split column) must not leave its site."""
    found: list[Problem] = []
    limit = spec.sensitive.max_suppressed_fraction
    rows_in, rows_suppressed = report.rows_in, report.rows_suppressed
    if rows_in and rows_suppressed / rows_in > limit:
        hints = "; ".join(coarser_level(spec, q) for q in spec.sensitive.quasi_identifiers)
        found.append(Problem(
            "sensitive.max_suppressed_fraction",
            f"k-anonymity (k={spec.sensitive.k_anonymity}) suppressed {rows_suppressed:,} of {rows_in:,} rows "
            f"({rows_suppressed / rows_in:.1%}); the limit is {limit:.1%} — coarsen the quasi-identifiers "
            f"({hints}), use more data, or raise the limit if that much loss is acceptable"))
    for column, col in report.columns.items():
        present = col.transformed + col.withheld
        if col.level and present and col.withheld / present > MAX_WITHHELD_FRACTION:
            found.append(Problem(
                f"sensitive.columns.{column}.level",
                f"generalizing to {col.level} withheld {col.withheld:,} of {present:,} values "
                f"({col.withheld / present:.0%}): the level does not fit this data"
                + (" (outward and area read UK postcodes; use prefix:N for any other format)"
                   if col.level in ("outward", "area") else "")))

    split = frame[SPLIT_COL] if SPLIT_COL in frame.columns else pd.Series("train", index=frame.index)
    counts = split.value_counts()
    minimum = spec.split.min_rows
    for name in SPLITS:
        n = int(counts.get(name, 0))
        if n < minimum:
            found.append(Problem(f"split.{name}", f"{n:,} row(s) left in the {name} split after anonymization and "
                                                  f"sampling; at least {minimum:,} are needed (split.min_rows) — "
                                                  "use more data, a larger split fraction or sync.sample_fraction"))
    if not len(frame):
        return found

    label = spec.data_schema.label
    if label in frame.columns:
        values = frame[label]
        classes = values.dropna().unique()
        if len(classes) < 2:
            only = f"only {_plain(classes[0])!r}" if len(classes) else "no values"
            found.append(Problem(f"column {label}", f"the label has {only}: a classifier needs both classes — "
                                                    "check the export or the label column"))
        else:
            for name in ("train", "test"):
                part = values[split == name].dropna().unique()
                if int(counts.get(name, 0)) and len(part) < 2:
                    found.append(Problem(f"column {label}", f"the {name} split has a single label class "
                                                            f"({_plain(part[0])!r}); use more data"))

    feats = spec.model.features
    for column in [*feats.numeric, *feats.categorical]:
        if column not in frame.columns:
            continue  # absent columns are the spec checks' and the preprocessor's to report
        values = frame[column]
        present = values.dropna()
        if not len(present):
            found.append(Problem(f"column {column}", "the feature has no values (empty or all missing): remove it "
                                                     "from model.features or fix the export"))
        elif present.nunique() < 2:
            only = _plain(present.iloc[0])
            found.append(Problem(f"column {column}", f"the feature is constant ({only!r} in every row that has a "
                                                     "value): it carries nothing — remove it from model.features"))
    return found


def _plain(value: object) -> object:
    """A numpy scalar as the Python value it holds (so messages say 0, not np.int64(0))."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def check(spec: JobSpec, frame: pd.DataFrame, report: AnonymizationReport) -> None:
    """Raise ``DataError`` listing every problem of ``problems``; nothing has left the site when it does."""
    found = problems(spec, frame, report)
    if found:
        raise DataError(f"{spec.dataset.path} (approved data of job {spec.name}, nothing was synced)", found)
