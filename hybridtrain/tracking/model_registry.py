"""Registry: the MLflow tracking store and model registry — runs, lineage, model versions and aliases.

One lifecycle execution is one MLflow run; each stage logs into it by run id (no hidden
active-run state between stages). Datasets are logged as run inputs whose source is the DVC
object of the exact version and whose digest is its DVC md5. Models are logged as
``RecordModel`` pyfuncs (``hybridtrain.training.record_model``): featurizer and network together,
a column-based signature, so ``mlflow.pyfunc.load_model(...).predict(records)`` and ``mlflow models
serve`` score rows; ``load``/``load_uri`` give the network and featurizer back for evaluation
(and still read versions logged with the older pytorch flavor). Promotion is an
alias move (``champion``), the previous champion stays reachable as ``previous``.

Logging into a run never changes its status: a run is RUNNING from ``start_run`` until ``end_run``
(or the stale-run reaper) ends it. A ``sqlite:///`` store is created whole or not at all, and an
empty one that an interrupted creation left half-made is made again (``sqlite_store``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hybridtrain.tracking.sqlite_store import ensure_sqlite_store

#: The Prefect flow run an MLflow run belongs to (a lifecycle's, a sweep trial's attempt): the stale-run reaper
#: (``orchestration.stale_runs``) ends the RUNNING runs of a flow run whose process died KILLED.
FLOW_RUN_TAG = "hybridtrain.prefect_flow_run_id"
CHAMPION = "champion"
PREVIOUS = "previous"
FEATURIZER_FILE = "featurizer.json"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRef:
    model_uri: str
    model_id: str | None


@dataclass(frozen=True)
class VersionInfo:
    name: str
    version: str
    run_id: str | None
    tags: dict[str, str]
    aliases: list[str]
    source: str


def _quiet() -> None:
    # MLflow prints alembic migration chatter and "emoji run links" to the console on first use.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)


class Registry:
    """MLflow tracking + registry at one URI (SQLite file on the embedded default, a server otherwise)."""

    def __init__(self, tracking_uri: str, artifact_root: Path | str | None = None):
        _quiet()
        from mlflow import MlflowClient  # lazy: heavy (mlflow)

        self.tracking_uri = tracking_uri
        # A tracking server keeps artifacts where it was told to (e.g. S3); only a local store takes a root.
        served = tracking_uri.startswith(("http://", "https://"))
        self.artifact_root = Path(artifact_root) if artifact_root and not served else None
        if tracking_uri.startswith("sqlite:///"):
            # Created whole or not at all: an interrupted first creation must not leave a half-migrated store.
            ensure_sqlite_store(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    # -- runs --------------------------------------------------------------------------------

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = None
        if self.artifact_root is not None:
            location = (self.artifact_root / name).resolve().as_uri()
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            return self.client.create_experiment(name, artifact_location=location)
        except MlflowException:  # another process created it first; read it back
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(self, experiment: str, run_name: str, tags: dict[str, str]) -> str:
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def run_status(self, run_id: str) -> str | None:
        """The run's status (RUNNING, SCHEDULED, FINISHED, FAILED, KILLED); None when this store has no such run."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            return str(self.client.get_run(run_id).info.status)
        except MlflowException:
            return None

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param  # lazy: heavy (mlflow)

        if params:
            self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None = None) -> None:

        from mlflow.entities import Metric  # lazy: heavy (mlflow)

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        if rows:
            self.client.log_batch(run_id, metrics=rows)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag  # lazy: heavy (mlflow)

        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_bytes(self, run_id: str, data: bytes, artifact_file: str) -> None:
        """Store ``data`` (a PNG, say) as ``artifact_file`` of the run."""
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / Path(artifact_file).name
            local.write_bytes(data)
            folder = str(Path(artifact_file).parent)
            self.client.log_artifact(run_id, str(local), None if folder == "." else folder)

    def read_text(self, run_id: str, artifact_file: str) -> str:
        return self.read_bytes(run_id, artifact_file).decode()

    def read_bytes(self, run_id: str, artifact_file: str) -> bytes:
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)
        with tempfile.TemporaryDirectory() as tmp:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_file, dst_path=tmp,
                                                        tracking_uri=self.tracking_uri)
            return Path(local).read_bytes()

    def artifact_page(self, run_id: str) -> str | None:
        """The run's page in the MLflow UI when the tracking URI is a server, else None."""
        if not self.tracking_uri.startswith(("http://", "https://")):
            return None
        exp = self.client.get_run(run_id).info.experiment_id
        return f"{self.tracking_uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}/artifacts"

    def model_bytes_uri(self, model_uri: str) -> int:
        """Like ``model_bytes`` for a ``models:/m-<id>`` URI (a LoggedModel) or any artifact URI."""
        if model_uri.startswith("models:/m-"):
            return self.model_bytes(ModelRef(model_uri, model_uri.removeprefix("models:/")))
        return self.artifact_bytes(model_uri)

    def model_bytes(self, model: ModelRef) -> int:
        """Size of a logged model's files (what travelled to the artifact store)."""
        if model.model_id is None:
            return self.artifact_bytes(model.model_uri)
        return self.artifact_bytes(self.client.get_logged_model(model.model_id).artifact_location)

    def artifact_bytes(self, artifact_uri: str) -> int:
        """Total size of the files under an artifact URI."""
        import mlflow  # lazy: heavy (mlflow)

        mlflow.set_tracking_uri(self.tracking_uri)

        def walk(uri: str) -> int:
            total = 0
            for f in mlflow.artifacts.list_artifacts(artifact_uri=uri, tracking_uri=self.tracking_uri):
                name = f.path.rsplit("/", 1)[-1]
                total += walk(f"{uri}/{name}") if f.is_dir else int(f.file_size or 0)
            return total

        return walk(artifact_uri.rstrip("/"))

    def log_dict(self, run_id: str, data: Any, artifact_file: str) -> None:
        self.client.log_text(run_id, json.dumps(data, indent=2, sort_keys=True, default=str), artifact_file)

    @contextmanager
    def _active(self, run_id: str) -> Iterator[None]:
        """Make ``run_id`` MLflow's active run in this thread while the body logs to it (``mlflow.pyfunc.log_model``
        logs only into the active run), without changing the run: its status and end time stay as they were.

        ``mlflow.start_run(run_id=...)`` would set the run RUNNING, and leaving its ``with`` block ends it FINISHED
        — a lifecycle run that is still going would read FINISHED from its record-data stage on, and stay so if
        its process then died, where the stale-run reaper (which ends RUNNING runs KILLED) would not see it.
        So the run is pushed on MLflow's active-run stack as ``start_run`` does, and popped, not ended, after.
        """
        import mlflow  # lazy: heavy (mlflow)
        from mlflow.tracking import fluent  # lazy: heavy (mlflow)

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        current = mlflow.active_run()
        if current is not None and current.info.run_id == run_id:
            yield
            return
        stack = fluent._active_run_stack.get()
        attached = fluent.ActiveRun(self.client.get_run(run_id))
        stack.append(attached)
        try:
            yield
        finally:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is attached:
                    del stack[i]
                    break

    def log_dataset(self, run_id: str, *, name: str, digest: str, source: str, context: str,
                    tags: dict[str, str]) -> None:
        """Record a dataset version as a run input (mlflow.data) whose source is its DVC object."""
        import mlflow  # lazy: heavy (mlflow)
        from mlflow.data.dataset_source_registry import resolve_dataset_source  # lazy: heavy (mlflow)
        from mlflow.data.meta_dataset import MetaDataset  # lazy: heavy (mlflow)

        with warnings.catch_warnings():
            # A local path matches two equivalent local-source classes; MLflow warns and picks one.
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            resolved = resolve_dataset_source(source)
        ds = MetaDataset(resolved, name=name, digest=digest[:36])
        with self._active(run_id):
            mlflow.log_input(ds, context=context, tags=tags)

    # -- models ------------------------------------------------------------------------------

    def log_model(self, run_id: str, model: Any, featurizer: dict[str, Any], n_features: int,
                  columns: dict[str, str] | None = None) -> ModelRef:
        """Log a model that takes records: a ``RecordModel`` pyfunc holding the featurizer and the network.

        ``columns`` (feature column -> type, ``record_model.feature_columns(spec)``) makes the signature;
        without it numeric columns are ``float`` and the others ``category``.
        """
        from hybridtrain.training.featurizer import Featurizer
        from hybridtrain.training.record_model import log_record_model

        feat = Featurizer.from_dict(featurizer)
        if feat.n_features != n_features:
            raise ValueError(f"the featurizer makes {feat.n_features} features, the network takes {n_features}")
        if columns is None:
            columns = {**{c.name: "float" for c in feat.numeric}, **{c.name: "category" for c in feat.categorical}}
        with self._active(run_id):
            info = log_record_model(model, feat, columns)
        return ModelRef(model_uri=info.model_uri, model_id=getattr(info, "model_id", None))

    def register(self, model_uri: str, name: str, run_id: str, tags: dict[str, Any],
                 creation_tags: dict[str, Any] | None = None) -> VersionInfo:
        """The version of ``name`` registered from ``model_uri`` by ``run_id`` (made now, or the one made before),
        tagged ``tags``; ``creation_tags`` only when made now, in the same call (a promotion mark: the version never
        exists without it, and a version registered before never gets one again)."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description="Registered by hybridtrain.")
        # Idempotent: a retried promotion (or MLflow's own retry of a create that did land) reuses the
        # version this run already registered from this source instead of adding a duplicate.
        for mv in self.client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
            if mv.source == model_uri:
                if tags:
                    self.set_version_tags(name, str(mv.version), tags)
                return self.version(name, mv.version)
        # A LoggedModel source (models:/m-<id>) must name its model id: an MLflow server rejects it otherwise.
        model_id = model_uri.removeprefix("models:/") if model_uri.startswith("models:/m-") else None
        mv = self.client.create_model_version(
            name, source=model_uri, run_id=run_id,
            tags={k: str(v) for k, v in {**tags, **(creation_tags or {})}.items()}, model_id=model_id
        )
        return self.version(name, mv.version)

    @staticmethod
    def _info(mv: Any) -> VersionInfo:
        # MLflow 3 returns versions as int from some calls and str from others; we use str.
        return VersionInfo(mv.name, str(mv.version), mv.run_id, dict(mv.tags), list(mv.aliases), mv.source)

    def version(self, name: str, version: str) -> VersionInfo:
        return self._info(self.client.get_model_version(name, str(version)))

    def by_alias(self, name: str, alias: str) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            mv = self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None
        return self._info(mv)

    def set_version_tags(self, name: str, version: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_model_version_tag(name, version, k, str(v))

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        """Remove tag ``key`` from a version; no error when it has no such tag."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        try:
            self.client.delete_model_version_tag(name, str(version), key)
        except MlflowException:
            if key in self.version(name, version).tags:
                raise

    def move_champion(self, name: str, version: str) -> str | None:
        """Point ``champion`` at ``version``; the version it replaces becomes ``previous``."""
        current = self.by_alias(name, CHAMPION)
        if current is not None and current.version != version:
            self.client.set_registered_model_alias(name, PREVIOUS, current.version)
        self.client.set_registered_model_alias(name, CHAMPION, version)
        return current.version if current else None

    def set_alias(self, name: str, alias: str, version: str) -> None:
        """Point ``alias`` at ``version`` and nothing else (a rollback moves ``champion`` back this way)."""
        self.client.set_registered_model_alias(name, alias, str(version))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove ``alias`` from the model; no error when it is not set."""
        from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

        if self.by_alias(name, alias) is None:
            return
        try:
            self.client.delete_registered_model_alias(name, alias)
        except MlflowException:  # removed by another process between the two calls
            if self.by_alias(name, alias) is not None:
                raise

    def versions(self, name: str) -> list[VersionInfo]:
        out = [self._info(mv) for mv in self.client.search_model_versions(f"name = '{name}'")]
        return sorted(out, key=lambda v: int(v.version))

    def load(self, name: str, version: str) -> tuple[Any, dict[str, Any]]:
        """Load a registered version's torch model and its featurizer."""
        return self.load_uri(f"models:/{name}/{version}")

    def load_uri(self, model_uri: str) -> tuple[Any, dict[str, Any]]:
        """Load a logged model (``models:/...`` or ``runs:/...``) and the featurizer stored with it."""
        import mlflow  # lazy: heavy (mlflow)
        import mlflow.pytorch  # lazy: heavy (mlflow)

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        from hybridtrain.training.record_model import is_record_model, load_parts

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
            if is_record_model(local):
                return load_parts(local)
            # Versions registered before models took records: the pytorch flavor plus an extra file.
            model = mlflow.pytorch.load_model(str(local), map_location="cpu")
            featurizer = json.loads((local / "extra_files" / FEATURIZER_FILE).read_text())
        model.eval()
        return model, featurizer

    def job_runs(self, experiment: str, job: str, limit: int = 50) -> list[Any]:
        """Finished lifecycle runs of one job, newest first."""
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return list(self.client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`hybridtrain.job` = '{job}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"], max_results=limit))

    def recent_runs(self, experiment: str, limit: int = 10) -> list[Any]:
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return list(self.client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"],
                                            max_results=limit))

    def tagged_run_ids(self, experiment: str, tag: str, value: str) -> list[str]:
        """Ids of every run of ``experiment`` whose tag ``tag`` equals ``value``, oldest first."""
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        quoted = value.replace("'", "\\'")
        ids: list[str] = []
        token = None
        while True:
            page = self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{tag}` = '{quoted}'",
                                           order_by=["attributes.start_time ASC"], max_results=1000, page_token=token)
            ids += [r.info.run_id for r in page]
            token = page.token
            if not token:
                return ids
