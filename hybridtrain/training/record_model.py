"""RecordModel: the MLflow pyfunc that scores records — the fitted featurizer and the network in one model.

A registered version is a pyfunc model directory::

    MLmodel                   flavor python_function, signature: one column per feature
    python_model.pkl          this class (by reference: ``hybridtrain`` must be importable)
    artifacts/network.pt      {"config": TabularMLP.config(), "state_dict": ...} (torch.save)
    artifacts/featurizer.json Featurizer.to_dict()
    artifacts/columns.json    {"columns": {name: type}, "closed": [categorical columns]}
    artifacts/edge/...        the export a small device runs without our stack (``edge_export``)
    input_example.json        two records built from the training statistics

The signature is derived from the job spec's features: ``int`` columns are ``long``, ``float``
columns ``double``, ``bool`` is ``boolean``, categorical columns are ``string``; an ``int``
column that had missing values in training is ``double``, so a missing value can be sent as
null (MLflow refuses to cast int64 to double, and NaN to long). Pseudonymized and dropped columns are never features (the spec check refuses
them), so they are never asked for. Extra columns in a request are ignored.

``predict(frame)`` returns the churn probability of each row (float64, shape ``(rows,)``).
Bad records raise ``MlflowException`` with ``INVALID_PARAMETER_VALUE`` — HTTP 400 from the
MLflow scoring server and from ``hybridtrain serve`` — naming the column and the fix:

- a missing feature column;
- a value of the wrong type (text in a numeric column);
- an unseen category in a *closed* categorical column — one whose training vocabulary was
  complete (fewer distinct values than ``featurizer.MAX_CATEGORIES``). In a column whose
  vocabulary was cut to the most frequent values, rare values go to the ``__other__`` bucket
  the network was trained with, as in training.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

NETWORK_FILE = "network.pt"
FEATURIZER_FILE = "featurizer.json"
COLUMNS_FILE = "columns.json"
EDGE_DIR = "edge"
ARTIFACTS_DIR = "artifacts"
SIGNATURE_TYPES = {"int": "long", "float": "double", "bool": "boolean", "category": "string", "string": "string"}


def feature_columns(spec: Any) -> dict[str, str]:
    """Feature column -> type after anonymization (``JobSpec.approved_type``), numeric first, as the featurizer reads them."""
    feats = spec.model.features
    out = {name: spec.approved_type(name).value for name in feats.numeric}
    out.update({name: "category" for name in feats.categorical})
    return out


def input_schema(columns: Mapping[str, str], nullable_ints: frozenset[str] = frozenset()) -> Any:
    """The MLflow column-based input schema for ``feature_columns(spec)``; ``nullable_ints`` become ``double``."""
    from mlflow.types import ColSpec, Schema

    return Schema([ColSpec("double" if name in nullable_ints else SIGNATURE_TYPES.get(t, "string"), name)
                   for name, t in columns.items()])


def input_example(featurizer: Any, columns: Mapping[str, str], rows: int = 2) -> pd.DataFrame:
    """Records made of the training medians and the first categories of each vocabulary."""
    data: dict[str, list[Any]] = {}
    for col in featurizer.numeric:
        kind = columns.get(col.name, "float")
        if kind == "bool":
            data[col.name] = [bool(col.median >= 0.5)] * rows
        else:
            value = int(round(col.median)) if kind == "int" and not col.missing_indicator else float(col.median)
            data[col.name] = [value] * rows
    for col in featurizer.categorical:
        vocab = list(col.vocabulary) or ["unknown"]
        data[col.name] = [vocab[i % len(vocab)] for i in range(rows)]
    return pd.DataFrame(data, columns=list(columns))


SMALL_REQUEST_ROWS = 64


def _plain_numeric(dtype: Any) -> bool:
    """float/int/bool numpy dtypes: values that convert to float64 without a check."""
    return isinstance(dtype, np.dtype) and dtype.kind in "fiub"


def _bad_input(message: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def load_network(path: Path | str) -> Any:
    """The TabularMLP saved in ``network.pt`` (weights only: no pickled code is run), in eval mode."""
    import torch

    from hybridtrain.training.model import TabularMLP

    saved = torch.load(Path(path), map_location="cpu", weights_only=True)
    net = TabularMLP.from_config(saved["config"])
    net.load_state_dict(saved["state_dict"])
    net.eval()
    return net


def load_parts(model_dir: Path | str) -> tuple[Any, dict[str, Any]]:
    """The network and the featurizer dict of a downloaded RecordModel directory (for evaluation)."""
    art = Path(model_dir) / ARTIFACTS_DIR
    return load_network(art / NETWORK_FILE), json.loads((art / FEATURIZER_FILE).read_text())


def is_record_model(model_dir: Path | str) -> bool:
    return (Path(model_dir) / ARTIFACTS_DIR / NETWORK_FILE).is_file()


class RecordScorer:
    """Featurizer + network + column rules, loaded from the three artifact files; ``score`` validates then scores."""

    def __init__(self, network: Any, featurizer: Any, columns: Mapping[str, str], closed: list[str]):
        self.network = network
        self.featurizer = featurizer
        self.columns = dict(columns)
        self.closed = {c.name: frozenset(c.vocabulary) for c in featurizer.categorical if c.name in set(closed)}
        self._index = {c.name: {v: k for k, v in enumerate(c.vocabulary)} for c in featurizer.categorical}

    @classmethod
    def from_artifacts(cls, network_path: Path | str, featurizer_path: Path | str,
                       columns_path: Path | str) -> RecordScorer:
        from hybridtrain.training.featurizer import Featurizer

        meta = json.loads(Path(columns_path).read_text())
        featurizer = Featurizer.from_dict(json.loads(Path(featurizer_path).read_text()))
        return cls(load_network(network_path), featurizer, meta["columns"], meta["closed"])

    def check(self, frame: pd.DataFrame) -> None:
        """Raise (INVALID_PARAMETER_VALUE) naming every missing column and the first unseen category."""
        if not isinstance(frame, pd.DataFrame):
            raise _bad_input(f"expected a table of records (a DataFrame), got {type(frame).__name__}; send "
                             "{\"dataframe_records\": [{column: value, ...}]}")
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise _bad_input(f"record(s) lack the feature column(s) {', '.join(missing)}; every record needs "
                             f"{', '.join(self.columns)}")
        for name, vocab in self.closed.items():
            values = frame[name]
            present = values.notna()
            unseen = present & ~values.astype("object").map(str).isin(vocab)
            if unseen.any():
                bad = values[unseen].iloc[0]
                raise _bad_input(f"column {name}: unseen category {bad!r} in {int(unseen.sum())} record(s); "
                                 f"known values: {', '.join(sorted(vocab))}")

    def featurize(self, frame: pd.DataFrame) -> np.ndarray:
        """The featurizer's matrix for ``frame``. Small requests of clean numeric columns (what MLflow's schema
        enforcement hands over) take a per-value path with the same arithmetic; the rest ``Featurizer.transform``."""
        from hybridtrain.errors import DataError

        if (isinstance(frame, pd.DataFrame) and len(frame) <= SMALL_REQUEST_ROWS
                and all(c in frame.columns for c in self.columns)
                and all(_plain_numeric(frame[c.name].dtype) for c in self.featurizer.numeric)):
            return self._featurize_small(frame)
        self.check(frame)
        try:
            return self.featurizer.transform(frame, dataset="request")
        except DataError as exc:
            raise _bad_input(str(exc)) from None

    def _featurize_small(self, frame: pd.DataFrame) -> np.ndarray:
        # Per-column pandas operations cost ~0.1 ms each; a single record needs none of them.
        values = {c: frame[c].to_numpy(dtype="float64", na_value=np.nan) for c in (n.name for n in self.featurizer.numeric)}
        values.update({c.name: frame[c.name].tolist() for c in self.featurizer.categorical})
        try:
            return self.featurize_columns(values, len(frame))
        except _UnseenCategory:
            self.check(frame)  # names the value and counts the records, as for larger requests
            raise

    def featurize_columns(self, values: Mapping[str, Any], rows: int) -> np.ndarray:
        """The featurizer's matrix from checked columns (column -> sequence of ``rows`` values): numbers or None in
        numeric columns, strings or None in categorical ones. The same arithmetic as ``Featurizer.transform``
        without pandas; this is the served hot path (``hybridtrain.serving.request``)."""
        out = np.zeros((rows, self.featurizer.n_features), dtype=np.float32)
        j = 0
        for col in self.featurizer.numeric:
            column = np.asarray(values[col.name], dtype="float64")  # None -> NaN
            missing = np.isnan(column)
            out[:, j] = (np.where(missing, col.median, column) - col.mean) / col.std
            j += 1
            if col.missing_indicator:
                out[:, j] = missing
                j += 1
        for col in self.featurizer.categorical:
            index = self._index[col.name]
            other = len(col.vocabulary)
            closed = self.closed.get(col.name)
            for i, v in enumerate(values[col.name]):
                name = None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else str(v)
                code = index.get(name, other) if name is not None else other
                if code == other and name is not None and closed is not None:
                    raise _UnseenCategory(col.name, name, closed, values[col.name])
                out[i, j + code] = 1.0
            j += other + 1
        return out

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Probability of the positive class per row of the featurized matrix (float64)."""
        import torch

        with torch.inference_mode():
            logits = self.network(torch.from_numpy(x))
        return torch.sigmoid(logits).double().numpy().reshape(-1)

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """Probability of the positive class per record (float64)."""
        return self.forward(self.featurize(frame))

    def score_columns(self, values: Mapping[str, Any], rows: int) -> np.ndarray:
        """``score`` for checked columns (``featurize_columns``); an unseen category raises MLflow's 400 error."""
        try:
            x = self.featurize_columns(values, rows)
        except _UnseenCategory as exc:
            raise exc.bad_input() from None
        return self.forward(x)


class _UnseenCategory(Exception):
    """A value outside a closed vocabulary; ``bad_input()`` is the client's 400 naming it."""

    def __init__(self, column: str, value: str, vocab: frozenset[str], values: Any):
        super().__init__(column, value)
        self.column, self.value, self.vocab = column, value, vocab
        self.count = sum(1 for v in values if v is not None and str(v) not in vocab)

    def bad_input(self) -> Exception:
        return _bad_input(f"column {self.column}: unseen category {self.value!r} in {self.count} record(s); "
                          f"known values: {', '.join(sorted(self.vocab))}")


class RecordModel(mlflow.pyfunc.PythonModel):
    """The pyfunc wrapper: ``load_context`` reads the artifacts, ``predict`` scores a frame of records."""

    def load_context(self, context: Any) -> None:
        art = context.artifacts
        self.scorer = RecordScorer.from_artifacts(art["network"], art["featurizer"], art["columns"])

    # A DataFrame hint is one MLflow infers no schema from: the explicit column signature stays in charge.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        return self.scorer.score(model_input)


def save_artifacts(dest: Path, network: Any, featurizer: Any, columns: Mapping[str, str]) -> dict[str, str]:
    """Write the artifact files (and the edge export) under ``dest``; returns pyfunc's ``artifacts`` mapping."""
    import torch

    from hybridtrain.training import edge_export
    from hybridtrain.training.featurizer import MAX_CATEGORIES

    dest.mkdir(parents=True, exist_ok=True)
    paths = {"network": dest / NETWORK_FILE, "featurizer": dest / FEATURIZER_FILE, "columns": dest / COLUMNS_FILE,
             "edge": dest / EDGE_DIR}
    torch.save({"config": network.config(), "state_dict": network.state_dict()}, paths["network"])
    paths["featurizer"].write_text(json.dumps(featurizer.to_dict(), sort_keys=True))
    closed = [c.name for c in featurizer.categorical if len(c.vocabulary) < MAX_CATEGORIES]
    paths["columns"].write_text(json.dumps({"columns": dict(columns), "closed": closed}, sort_keys=True))
    edge_export.export(network, featurizer, dict(columns), paths["edge"])
    return {k: str(v) for k, v in paths.items()}


def log_record_model(network: Any, featurizer: Any, columns: Mapping[str, str]) -> Any:
    """Log a RecordModel named ``model`` into the active MLflow run; returns MLflow's ``ModelInfo``."""
    import torch
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    with tempfile.TemporaryDirectory(prefix="hybridtrain-model-") as tmp:
        artifacts = save_artifacts(Path(tmp), network, featurizer, columns)
        example = input_example(featurizer, columns)
        nullable_ints = frozenset(c.name for c in featurizer.numeric if c.missing_indicator)
        # Output: one float64 probability per record.
        signature = ModelSignature(inputs=input_schema(columns, nullable_ints),
                                   outputs=Schema([TensorSpec(np.dtype("float64"), (-1,))]))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Pickle or CloudPickle.*")
            logging.getLogger("mlflow.pyfunc").setLevel(logging.ERROR)
            return mlflow.pyfunc.log_model(
                name="model",
                python_model=RecordModel(),
                artifacts=artifacts,
                signature=signature,
                input_example=example,
                # Explicit requirements: inference would import-scan the model in a subprocess.
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}",
                                  "hybridtrain"],
            )
