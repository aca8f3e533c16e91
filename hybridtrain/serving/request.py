"""RecordReader: a scoring request's JSON records checked against the model's input schema, as feature columns.

This is the served hot path. MLflow's own route (JSON -> ``pandas.DataFrame`` -> schema
enforcement -> ``predict``) costs ~10 ms of CPU for one record, almost all of it pandas; the
network itself takes 0.1 ms. A ``RecordReader`` is compiled once per loaded version from that
version's MLflow input schema (the artifact of record) into a pydantic validator (``TypeAdapter``
over a ``TypedDict`` of the feature columns), which checks a request's records in
microseconds and yields plain Python values for ``RecordScorer.featurize_columns``.

The rules are MLflow's column types, strictly: ``long`` takes integers; ``double`` takes
numbers or ``null`` (a missing value, imputed as in training); ``boolean`` takes ``true`` /
``false``; ``string`` takes text or ``null`` (the "other" category). Every record needs every
feature column; extra keys are ignored. A request that breaks a rule is ``BadRecords`` with one
message naming the record, the column and what it needs — the server answers 400 with it.

Only ``{"dataframe_records": [...]}`` bodies (the protocol's records form, what the README's
``curl`` sends) take this path; ``read`` returns ``None`` for any other form (``dataframe_split``,
``inputs``, ``params``), which the server hands to MLflow's parser instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter, ValidationError
from typing_extensions import TypedDict

# MLflow column type -> (the Python values it takes, how a message says so)
COLUMN_TYPES: dict[str, tuple[Any, str]] = {
    "long": (StrictInt, "an integer"),
    "integer": (StrictInt, "an integer"),
    "double": (StrictInt | StrictFloat | None, "a number or null"),
    "float": (StrictInt | StrictFloat | None, "a number or null"),
    "boolean": (StrictBool, "true or false"),
    "string": (StrictStr | None, "text or null"),
}
RECORDS_KEY = "dataframe_records"
USAGE = 'send {"dataframe_records": [{column: value, ...}, ...]}'


class BadRecords(ValueError):
    """The request's records break the input schema; the message names record, column and fix."""


@dataclass(frozen=True)
class Columns:
    """Checked records as feature columns: column -> list of ``rows`` values."""

    values: dict[str, list[Any]]
    rows: int


class RecordReader:
    """Reads ``dataframe_records`` bodies for one model version's column-based input schema."""

    def __init__(self, schema: Any):
        """``schema``: the version's ``mlflow.types.Schema`` (``PyFuncModel.metadata.get_input_schema()``)."""
        self.columns: dict[str, str] = {}
        for col in schema.inputs:
            kind = col.type.name if hasattr(col.type, "name") else str(col.type)
            if col.name is None or kind not in COLUMN_TYPES:
                raise ValueError(f"input column {col.name!r} of type {kind} has no record check; "
                                 f"supported: {', '.join(COLUMN_TYPES)}")
            self.columns[col.name] = kind
        record = TypedDict("Record", {name: COLUMN_TYPES[kind][0] for name, kind in self.columns.items()})  # type: ignore[misc]
        self._records = TypeAdapter(list[record])

    def read(self, body: bytes | str) -> Columns | None:
        """The checked columns of a ``dataframe_records`` body; ``None`` for any other request form.

        Raises ``BadRecords`` for a body that is not JSON, records that are not objects, a missing
        feature column or a value of the wrong type.
        """
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRecords(f"the body is not JSON ({exc}); {USAGE}") from None
        if not isinstance(data, dict) or set(data) != {RECORDS_KEY}:
            return None
        raw = data[RECORDS_KEY]
        try:
            records = self._records.validate_python(raw)
        except ValidationError as exc:
            raise BadRecords(self._explain(exc, raw)) from None
        if not records:
            raise BadRecords(f"no records to score; {USAGE}")
        return Columns({name: [r[name] for r in records] for name in self.columns}, len(records))

    def _explain(self, exc: ValidationError, raw: Any) -> str:
        errors = exc.errors(include_url=False)
        first = errors[0]
        loc = first["loc"]
        others = len({tuple(e["loc"][:2]) for e in errors}) - 1  # a union reports each of its members
        more = f" (and {others} more problem(s))" if others else ""
        if len(loc) == 0:
            return f"dataframe_records must be a list of records; {USAGE}"
        if len(loc) == 1:
            return f"record {loc[0]} is not an object of column: value pairs; {USAGE}"
        index, column = loc[0], str(loc[1])
        if first["type"] == "missing":
            return (f"record {index} lacks the feature column {column}{more}; every record needs "
                    f"{', '.join(self.columns)}")
        value = raw[index].get(column) if isinstance(raw[index], dict) else None
        return (f"column {column}: record {index} has {json.dumps(value)}, but the column takes "
                f"{COLUMN_TYPES[self.columns[column]][1]}{more}")
