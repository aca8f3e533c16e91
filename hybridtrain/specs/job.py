"""JobSpec: what a training job needs — data, privacy treatment, model, resources, limits and gates.

A spec is a versioned YAML file (``apiVersion: hybridtrain/v1``) validated by pydantic with
unknown fields refused. ``load_spec`` reports *every* problem with its field path and line;
the JSON Schema (``hybridtrain schema``) is generated from these models, never hand-written.
Dataset versions are pinned by content hash; there is no "latest".

Longer than most modules on purpose: one pydantic model per spec section and the rules that need only the spec itself; checks against other files live in ``hybridtrain.validation``.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridtrain.errors import Problem
from hybridtrain.specs.config_file import load_model, validate_data
from hybridtrain.specs.federation import TrainingModeSpec
from hybridtrain.specs.sites import NAME_RE, SitesCatalog
from hybridtrain.specs.federation_checks import federation_problems
from hybridtrain.specs.sweep import SweepSpec, sweep_problems
from hybridtrain.specs.schema_bounds import bound_numbers

API_VERSION = "hybridtrain/v1"
MD5_RE = r"^[0-9a-f]{32}(\.dir)?$"
# MLflow registered model names: letters, digits, and . _ - (no slashes or colons).
MODEL_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
METRICS = ("auc", "accuracy", "f1", "precision", "recall", "log_loss")
#: A duration deadline beyond this is a typo (and would overflow date arithmetic near year 9999).
MAX_DEADLINE_DAYS = 3650
HIGHER_IS_BETTER = {"auc": True, "accuracy": True, "f1": True, "precision": True, "recall": True, "log_loss": False}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, json_schema_extra=bound_numbers)


class ColumnType(StrEnum):
    string = "string"
    int = "int"
    float = "float"
    bool = "bool"
    date = "date"
    category = "category"
    email = "email"
    """An e-mail address: text, trimmed and lower-cased when curated (so pseudonyms and the leak scan
    agree whatever the case), whatever the column is called."""


NUMERIC_TYPES = {ColumnType.int, ColumnType.float, ColumnType.bool}
TEXT_TYPES = {ColumnType.string, ColumnType.category, ColumnType.email}


class SiteDataset(Strict):
    """A DVC-tracked dataset pinned to one content version, at the site that holds it."""

    path: str = Field(description="DVC-tracked path relative to the workspace root, e.g. data/raw/churn.csv.")
    md5: str = Field(pattern=MD5_RE, description="Pinned DVC content hash (the md5 in the .dvc file).")
    site: str = Field(pattern=NAME_RE, description="Site whose store holds the raw data (where it may be read).")
    format: Literal["csv", "parquet"] = "csv"

    @field_validator("md5", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        if isinstance(v, (int, float)):
            raise ValueError('YAML read the hash as a number: put it in quotes, md5: "..."')
        return v

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts:
            raise ValueError("must be a path inside the workspace, relative to its root (no '/' or '..')")
        return v


class DatasetRef(SiteDataset):
    """The job's dataset: one pinned DVC version at one site, plus the other sites' parts when it is split."""

    sites: list[SiteDataset] = Field(
        default_factory=list,
        description="More parts of the data, each a pinned DVC version at its own site (federated training: "
        "raw data never leaves its site). The top-level path/md5/site is the first part.",
    )


class DataSchema(Strict):
    """The columns the raw data must have, their types, the label and the entity key."""

    columns: dict[str, ColumnType] = Field(min_length=2, description="Column name -> type.")
    label: str = Field(description="Binary label column (0/1 or true/false).")
    entity_key: str = Field(
        description="Column identifying the entity (customer, account); used to de-duplicate, "
        "split and partition, so a split never leaks one entity into two sets."
    )


class Treatment(StrEnum):
    drop = "drop"
    pseudonym = "pseudonym"
    generalize = "generalize"
    keep = "keep"


# Generalization levels per column type. Dates: to a coarser period. Strings (postcodes):
# the outward code / area letters / a prefix. Numbers: bucketed to a width.
DATE_LEVELS = ("year", "year_month", "decade")
STRING_LEVEL_RE = re.compile(r"^(outward|area|prefix:[1-9][0-9]?)$")
NUMERIC_LEVEL_RE = re.compile(r"^bucket:[0-9]+(\.[0-9]+)?$")


class SensitiveColumn(Strict):
    """How one sensitive column is treated before data may leave its site."""

    treatment: Treatment
    level: str | None = Field(
        None,
        description="For generalize: dates year|year_month|decade; text prefix:N (any format, e.g. ZIP or "
        "postal codes), or outward|area (UK postcodes only); numbers bucket:WIDTH.",
    )
    reason: str | None = Field(None, description="Required for keep: why the raw value may leave.")


class SensitivitySpec(Strict):
    columns: dict[str, SensitiveColumn] = Field(default_factory=dict)
    quasi_identifiers: list[str] = Field(
        default_factory=list, description="Columns that together could re-identify someone."
    )
    k_anonymity: int | None = Field(None, ge=2, description="Minimum group size over the quasi-identifiers.")
    on_k_violation: Literal["fail", "suppress"] = "suppress"
    max_suppressed_fraction: float = Field(
        0.05, ge=0, le=1,
        description="Share of rows k-anonymity may suppress; above it the data does not leave its site "
        "(hybridtrain.datasets.data_gates).",
    )


class SyncSpec(Strict):
    sample_fraction: float = Field(1.0, gt=0, le=1, description="Share of approved rows that is synced.")


class SplitSpec(Strict):
    train: float = Field(0.8, gt=0, lt=1)
    val: float = Field(0.1, gt=0, lt=1)
    test: float = Field(0.1, gt=0, lt=1)
    seed: int = Field(0, ge=0, description="Salt for the entity-key hash that assigns splits.")
    min_rows: int = Field(
        10, ge=1, description="Fewest rows each split (train, val, test) must keep after anonymization and "
        "sampling, else nothing leaves the site.",
    )


PARTITION_PERIODS = ("month", "quarter", "year")


class LayoutSpec(Strict):
    """How curated and approved datasets are laid out: Parquet files by split and partition.

    By default a row's partition is a keyed hash of its entity key: even-sized files, but a
    change to 1 % of random rows touches nearly every file. ``partition_by`` groups rows by a
    column instead — a date by period (``signup_date:month``) or another column's value (hashed
    into ``partitions`` buckets) — so new or corrected records of one period rewrite, and
    re-sync, only that period's files.
    """

    partitions: int = Field(
        16, ge=1, le=4096,
        description="Partitions per split, by a keyed hash of the entity key (or of the partition_by "
        "column's value; unused for a date by period). Unchanged partitions keep byte-identical files, "
        "so a re-sync moves only partitions that changed.",
    )
    partition_by: str | None = Field(
        None, pattern=r"^[^:\s]+(:[a-z]+)?$",
        description="Partition by a column instead of the entity key: COLUMN for a category/string/int/bool "
        "(hashed into `partitions` buckets) or DATE_COLUMN:month|quarter|year (one partition per period). "
        "Must not be a sensitive column or quasi-identifier.",
    )

    @property
    def partition_column(self) -> tuple[str, str | None] | None:
        """``partition_by`` split into (column, period or None); None for the entity-key hash."""
        if self.partition_by is None:
            return None
        column, _, period = self.partition_by.partition(":")
        return column, period or None


class FeatureSpec(Strict):
    numeric: list[str] = Field(default_factory=list)
    categorical: list[str] = Field(default_factory=list)


class ModelSpec(Strict):
    kind: Literal["mlp"] = "mlp"
    features: FeatureSpec
    hidden_layers: list[int] = Field(default_factory=lambda: [64, 32], min_length=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    epochs: int = Field(3, ge=1, le=1000)
    batch_size: int = Field(512, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = Field(0, ge=0)
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: the site's cpus.")

    @field_validator("hidden_layers")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h < 1 for h in v):
            raise ValueError("every hidden layer needs at least 1 unit")
        return v


class Resources(Strict):
    """What the job needs: frozen, independent of where it runs."""

    gpus: int = Field(0, ge=0, description="GPUs on each node (0: CPU training).")
    nodes: int = Field(
        1, ge=1, description="Hosts the job trains on together (torchrun, DDP); all at one site, each with `gpus` GPUs.")
    gpu_type: str | None = None
    cpus: int = Field(2, ge=1)
    memory_gb: float = Field(4.0, gt=0)
    max_hours: float = Field(1.0, gt=0, description="Hard limit on training wall time.")

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes: what placement reserves and prices."""
        return self.gpus * self.nodes


class Sensitivity(StrEnum):
    public = "public"
    internal = "internal"
    confidential = "confidential"
    restricted = "restricted"


class DataPolicy(Strict):
    sensitivity: Sensitivity = Sensitivity.confidential
    residency: list[str] = Field(
        default_factory=list, description="Jurisdictions the data may be processed in; empty = anywhere."
    )
    tags: list[str] = Field(default_factory=list)


class CheckpointSpec(Strict):
    interval_steps: int | None = Field(200, ge=1)
    interval_minutes: float | None = Field(None, gt=0)
    keep_last: int = Field(3, ge=1)
    max_overhead: float | None = Field(
        0.01, gt=0, le=1,
        description="The most of training's time the interval_steps checkpoints may cost (as CheckFreq does): the "
        "trainer measures what one checkpoint costs training (the snapshot the step waits for plus the background "
        "writer's CPU) and skips a step checkpoint due sooner than cost / max_overhead after the previous one. "
        "Time-based checkpoints and those at a preemption or the end are never skipped; a crash (kill -9) may then lose "
        "up to that gap instead of interval_steps. null: exactly every interval_steps.",
    )
    auto_interval: bool = Field(
        False,
        description="Derive the time between checkpoints from the site's observed preemption rate and the "
        "measured checkpoint write time (Young/Daly: sqrt(2 x write seconds x mean time between preemptions), "
        "clamped to 1-60 minutes; hybridtrain.training.checkpoint_interval). Replaces interval_minutes; interval_steps "
        "still applies when set.",
    )
    preemption_grace_s: float = Field(
        30.0, gt=0, le=3600,
        description="Seconds between a preemption notice (SIGTERM/SIGUSR1) and the platform killing the process. "
        "Training stops after the step in progress and writes a checkpoint; a single step longer than this "
        "still runs to its end. Also how long torchrun waits for its workers before SIGKILL.",
    )


class RecoverySpec(Strict):
    """How a training run recovers (``hybridtrain.training.recovery``): preemptions, real failures, lost sites."""

    max_preemptions: int = Field(
        20, ge=0, description="Preemptions survived per run (each resumes from the newest checkpoint); one more fails it.")
    max_failures: int = Field(
        2, ge=0, description="Retries after real failures (crash, lost process, non-zero exit) per run; counted "
        "apart from preemptions. User mistakes (spec, data) are never retried.")
    wait_for_site_s: float = Field(
        3600.0, ge=0, description="How long a run whose every allowed site is unhealthy waits for one to be healthy "
        "again before it fails (it never goes to a site the policy forbids).")
    health_poll_s: float = Field(30.0, gt=0, description="Seconds between health checks while waiting for a site.")
    heartbeat_timeout_s: float = Field(
        300.0, gt=0, description="The recovery flow treats a running training whose pool has had no live worker "
        "for this long as lost, and resubmits it.")


class EvaluationSpec(Strict):
    primary_metric: Literal["auc", "accuracy", "f1", "precision", "recall", "log_loss"] = "auc"
    thresholds: dict[str, float] = Field(
        default_factory=dict, description="Metric -> minimum (maximum for log_loss) to be promotable."
    )
    min_improvement: float = Field(
        0.0, ge=0, description="Candidate must beat the champion's primary metric by more than this."
    )


class RegistrySpec(Strict):
    model_name: str = Field(pattern=MODEL_NAME_RE, description="MLflow registered model name.")


class PlacementSpec(Strict):
    site: str | None = Field(None, pattern=NAME_RE, description="Pin training to this site.")
    strategy: str | None = Field(None, description="Placement strategy name; default from policy.")
    job_class: str | None = Field(
        None, pattern=NAME_RE,
        description="Job class named in the placement policy's job_classes (which capacity classes, "
        "e.g. spot, the job may use); default from policy.",
    )


class ReleaseTargetSpec(Strict):
    """One place a promoted version's signed bundle is published: a serving directory or a site's object store."""

    name: str = Field(pattern=NAME_RE, description="Target name, unique within the spec, e.g. onprem-serving, edge-1.")
    kind: str = Field(
        "directory",
        description="Target kind (hybridtrain.governance.release.TARGET_KINDS): directory (default; an on-prem serving "
        "directory), object_store (a site's store from the sites catalog: S3 or its local stand-in) or edge (a small "
        "device's directory: only the signed edge export).",
    )
    path: str | None = Field(
        None, description="directory: the serving directory; a relative path is relative to the workspace root."
    )
    site: str | None = Field(
        None, pattern=NAME_RE, description="object_store: the site whose store holds the releases (its credentials "
        "stay in the sites catalog / site block, never in the spec).",
    )
    prefix: str = Field(
        "releases", pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$",
        description="object_store: key prefix under the site's store.",
    )

    @field_validator("path")
    @classmethod
    def _confined_path(cls, v: str | None) -> str | None:
        if v is not None and ".." in Path(v).parts:
            raise ValueError("must not contain '..': give the serving directory itself (absolute, or relative to "
                             "the workspace root)")
        return v

    @field_validator("prefix")
    @classmethod
    def _confined_prefix(cls, v: str) -> str:
        if any(part in (".", "..") for part in v.split("/")):
            raise ValueError("must not contain '.' or '..' segments: it is a key prefix inside the site's store")
        return v


class PromotionSpec(Strict):
    """What must hold before ``champion`` moves to a new version, and where that version is then released."""

    gates: list[str] | None = Field(
        None,
        description="Promotion gates to evaluate (hybridtrain.governance.gates.GATES), all of them unless listed: lineage, "
        "signature, thresholds, not_worse, cost, rollback_target, approval.",
    )
    max_cost_usd: float | None = Field(
        None, gt=0,
        description="Cost gate: the version's ledger total in USD (compute, wasted attempts, transfers, storage) "
        "must not exceed this.",
    )
    require_approval: bool = Field(
        False, description="Wait for a person to approve before the alias moves (Prefect pause/resume); the approval "
        "gate records who approved.",
    )
    release_targets: list[ReleaseTargetSpec] = Field(
        default_factory=list, description="Where the signed bundle is published when the version becomes champion."
    )
    approval_timeout_s: float = Field(
        86400, gt=0, description="How long a promotion waits for approval before the flow run fails (seconds)."
    )


class Metadata(Strict):
    name: str = Field(pattern=NAME_RE, description="Job name: lowercase letters, digits and dashes.")
    team: str = Field("default", pattern=NAME_RE)
    description: str = ""


class JobSpec(Strict):
    """A training job (``kind: TrainingJob``)."""

    apiVersion: Literal["hybridtrain/v1"] = Field(description="Spec format version.")
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: Metadata
    dataset: DatasetRef
    data_schema: DataSchema = Field(alias="schema")
    sensitive: SensitivitySpec = Field(default_factory=SensitivitySpec)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    split: SplitSpec = Field(default_factory=SplitSpec)
    layout: LayoutSpec = Field(default_factory=LayoutSpec)
    model: ModelSpec
    resources: Resources = Field(default_factory=Resources)
    data_policy: DataPolicy = Field(default_factory=DataPolicy)
    deadline: timedelta | datetime | None = Field(
        None, description="Finish within a duration (6h, 90m, 2d) or by an ISO time with timezone."
    )
    budget_usd: float | None = Field(None, gt=0)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    registry: RegistrySpec
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    promotion: PromotionSpec = Field(default_factory=PromotionSpec)
    sweep: SweepSpec | None = Field(
        None, description="Hyperparameter sweep over model (run with `hybridtrain sweep`); ignored by `hybridtrain run`.")
    training: TrainingModeSpec = Field(
        default_factory=TrainingModeSpec, description="Centralized or federated training (hybridtrain.federated).")

    @field_validator("deadline", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, str):
            m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*", v)
            if m:
                unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
                try:
                    return timedelta(**{unit: float(m.group(1))})
                except OverflowError:
                    raise ValueError(f"{v.strip()} is too long; a deadline is at most "
                                     f"{MAX_DEADLINE_DAYS} days") from None
        return v

    @field_validator("deadline")
    @classmethod
    def _aware(cls, v: timedelta | datetime | None) -> timedelta | datetime | None:
        if isinstance(v, datetime) and v.tzinfo is None:
            raise ValueError("give a timezone, e.g. 2026-12-01T18:00:00Z")
        if isinstance(v, timedelta) and v <= timedelta(0):
            raise ValueError("must be a positive duration")
        if isinstance(v, timedelta) and v > timedelta(days=MAX_DEADLINE_DAYS):
            raise ValueError(f"is too long; a deadline is at most {MAX_DEADLINE_DAYS} days (use a date for later)")
        return v

    @property
    def name(self) -> str:
        return self.metadata.name

    def deadline_at(self, submitted: datetime) -> datetime | None:
        """Absolute deadline for a job submitted at ``submitted``."""
        if self.deadline is None:
            return None
        if isinstance(self.deadline, timedelta):
            return submitted + self.deadline
        return self.deadline

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form with the YAML field names (round-trips through ``parse_spec``).

        ``sweep``, ``training`` and ``dataset.sites`` appear only when set, so a job without them keeps
        the spec hash it had before sweeps and federated training existed."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=False)
        if data.get("sweep") is None:
            data.pop("sweep", None)
        if not self.dataset.sites:
            data["dataset"].pop("sites")
        if self.training == TrainingModeSpec():
            data.pop("training")
        return data

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON form: the identity of *what* was asked for."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def site_datasets(self) -> list[SiteDataset]:
        """Every part of the data, one per site, the top-level one first."""
        d = self.dataset
        return [SiteDataset(path=d.path, md5=d.md5, site=d.site, format=d.format), *d.sites]

    def for_site(self, site: str) -> JobSpec:
        """This job as seen by one data site in federated training: its own part as the only dataset,
        named ``<job>-<site>`` so its curated and approved versions have paths of their own."""
        part = next((d for d in self.site_datasets() if d.site == site), None)
        if part is None:
            raise KeyError(f"site {site!r} holds no part of job {self.name}'s data")
        dataset = DatasetRef(path=part.path, md5=part.md5, site=part.site, format=part.format)
        metadata = self.metadata.model_copy(update={"name": f"{self.name}-{site}"[:63].rstrip("-")})
        return self.model_copy(update={"dataset": dataset, "metadata": metadata})

    def treatment_of(self, column: str) -> Treatment | None:
        c = self.sensitive.columns.get(column)
        return c.treatment if c else None

    def approved_type(self, column: str) -> ColumnType:
        """The column's type after its treatment (e.g. a date generalized to year becomes int)."""
        declared = self.data_schema.columns[column]
        sc = self.sensitive.columns.get(column)
        if sc is None or sc.treatment is Treatment.keep:
            return declared
        if sc.treatment is Treatment.pseudonym:
            return ColumnType.string
        if sc.treatment is Treatment.generalize:
            if declared is ColumnType.date:
                return ColumnType.string if sc.level == "year_month" else ColumnType.int
            if declared in NUMERIC_TYPES:
                return ColumnType.float
            return ColumnType.string
        return declared


def check_semantics(spec: JobSpec, sites: SitesCatalog | None = None) -> list[Problem]:
    """Cross-field rules pydantic field types cannot express. Returns every problem found."""
    p: list[Problem] = []
    cols = spec.data_schema.columns
    schema = spec.data_schema

    if schema.label not in cols:
        p.append(Problem("schema.label", f"column {schema.label!r} is not in schema.columns"))
    elif cols[schema.label] not in (ColumnType.int, ColumnType.bool, ColumnType.category):
        p.append(Problem("schema.label", "a binary label must have type int, bool or category"))
    if schema.entity_key not in cols:
        p.append(Problem("schema.entity_key", f"column {schema.entity_key!r} is not in schema.columns"))
    if schema.entity_key == schema.label:
        p.append(Problem("schema.entity_key", "the entity key cannot be the label"))

    for name, sc in spec.sensitive.columns.items():
        path = f"sensitive.columns.{name}"
        if name not in cols:
            p.append(Problem(path, f"column {name!r} is not in schema.columns"))
            continue
        if name == schema.label:
            p.append(Problem(path, "the label cannot be a sensitive column"))
        ctype = cols[name]
        if sc.treatment is Treatment.generalize:
            if sc.level is None:
                p.append(Problem(f"{path}.level", "generalize needs a level"))
            elif ctype is ColumnType.date and sc.level not in DATE_LEVELS:
                p.append(Problem(f"{path}.level", f"for a date use one of {', '.join(DATE_LEVELS)}"))
            elif ctype in NUMERIC_TYPES and not NUMERIC_LEVEL_RE.match(sc.level):
                p.append(Problem(f"{path}.level", "for a number use bucket:WIDTH, e.g. bucket:10"))
            elif ctype in TEXT_TYPES and not STRING_LEVEL_RE.match(sc.level):
                p.append(Problem(f"{path}.level", "for text use prefix:N (the first N characters; any format), or "
                                                  "outward or area (UK postcodes only)"))
        elif sc.level is not None:
            p.append(Problem(f"{path}.level", f"level applies to generalize only, not {sc.treatment.value}"))
        if sc.treatment is Treatment.keep and not (sc.reason and sc.reason.strip()):
            p.append(Problem(f"{path}.reason", "keep sends the raw value off-site: say why in reason"))

    for i, q in enumerate(spec.sensitive.quasi_identifiers):
        if q not in cols:
            p.append(Problem(f"sensitive.quasi_identifiers[{i}]", f"column {q!r} is not in schema.columns"))
        elif spec.treatment_of(q) is Treatment.drop:
            p.append(Problem(f"sensitive.quasi_identifiers[{i}]", f"column {q!r} is dropped, so it cannot re-identify"))
    if spec.sensitive.k_anonymity is not None and not spec.sensitive.quasi_identifiers:
        p.append(Problem("sensitive.k_anonymity", "needs sensitive.quasi_identifiers"))

    p += _layout_problems(spec)

    total = spec.split.train + spec.split.val + spec.split.test
    if abs(total - 1.0) > 1e-9:
        p.append(Problem("split", f"train + val + test must be 1.0, got {total:g}"))

    feats = spec.model.features
    if not feats.numeric and not feats.categorical:
        p.append(Problem("model.features", "list at least one numeric or categorical feature"))
    seen: set[str] = set()
    for group in ("numeric", "categorical"):
        for i, f in enumerate(getattr(feats, group)):
            path = f"model.features.{group}[{i}]"
            if f in seen:
                p.append(Problem(path, f"feature {f!r} is listed twice"))
            seen.add(f)
            if f not in cols:
                p.append(Problem(path, f"column {f!r} is not in schema.columns"))
                continue
            if f == schema.label:
                p.append(Problem(path, "the label cannot be a feature"))
            t = spec.treatment_of(f)
            if t is Treatment.drop:
                p.append(Problem(path, f"column {f!r} is dropped by sensitive.columns.{f}.treatment"))
            elif t is Treatment.pseudonym:
                p.append(Problem(path, f"column {f!r} is pseudonymized: an identifier, not a feature"))
            elif group == "numeric" and spec.approved_type(f) not in NUMERIC_TYPES:
                p.append(
                    Problem(path, f"column {f!r} has type {spec.approved_type(f).value} after treatment; "
                                  "list it under categorical")
                )

    for metric, value in spec.evaluation.thresholds.items():
        path = f"evaluation.thresholds.{metric}"
        if metric not in METRICS:
            p.append(Problem(path, f"unknown metric; use one of {', '.join(METRICS)}"))
        elif metric != "log_loss" and not 0 <= value <= 1:
            p.append(Problem(path, "must be between 0 and 1"))

    if spec.checkpoint.auto_interval and spec.checkpoint.interval_minutes is not None:
        p.append(Problem("checkpoint.interval_minutes", "auto_interval derives the time interval; remove "
                                                        "interval_minutes or set auto_interval: false"))

    if spec.resources.gpu_type is not None and spec.resources.gpus == 0:
        p.append(Problem("resources.gpu_type", "set resources.gpus >= 1 when asking for a GPU type"))

    if spec.sweep is not None:
        p += sweep_problems(spec.sweep, spec.model)
    p += federation_problems(spec, sites)

    if sites is not None:
        if spec.dataset.site not in sites.names:
            p.append(Problem("dataset.site", f"unknown site {spec.dataset.site!r}; known: {', '.join(sites.names)}"))
        if spec.placement.site is not None and spec.placement.site not in sites.names:
            p.append(
                Problem("placement.site", f"unknown site {spec.placement.site!r}; known: {', '.join(sites.names)}")
            )
    return p


def _layout_problems(spec: JobSpec) -> list[Problem]:
    by = spec.layout.partition_column
    if by is None:
        return []
    column, period = by
    path = "layout.partition_by"
    cols = spec.data_schema.columns
    if column not in cols:
        return [Problem(path, f"column {column!r} is not in schema.columns")]
    p: list[Problem] = []
    ctype = cols[column]
    if ctype is ColumnType.date:
        if period is None:
            p.append(Problem(path, f"{column} is a date: give a period, e.g. {column}:month, {column}:quarter "
                                   f"or {column}:year"))
        elif period not in PARTITION_PERIODS:
            p.append(Problem(path, f"unknown period {period!r}; use one of {', '.join(PARTITION_PERIODS)}"))
    elif period is not None:
        p.append(Problem(path, f"a period (:{period}) applies to date columns only; {column} is {ctype.value}"))
    elif ctype is ColumnType.float:
        p.append(Problem(path, f"{column} is a float: too many distinct values to group rows by; choose a date, "
                               "category, string, int or bool column"))
    treatment = spec.treatment_of(column)
    if (treatment is not None and treatment is not Treatment.keep) or column in spec.sensitive.quasi_identifiers:
        p.append(Problem(path, f"{column} is a sensitive column or quasi-identifier: partition numbers and file "
                               "names derived from its raw values would leave the site untreated; choose another "
                               "column"))
    return p


def load_spec(path: Path | str, sites: SitesCatalog | None = None) -> JobSpec:
    """Load a job spec file and check what it says on its own (and its site names against ``sites``).

    Gate names, release target kinds, the strategy and the job class are checked against their
    registries and the policy by ``hybridtrain.validation.load_job``, which callers that are about
    to act on a spec use.
    """
    return load_model(JobSpec, path, semantic=lambda s: check_semantics(s, sites))


def parse_spec(data: dict[str, Any], source: str = "job spec", sites: SitesCatalog | None = None) -> JobSpec:
    """``load_spec`` for a spec given as a mapping (e.g. a spec already checked, inside a job bundle)."""
    return validate_data(JobSpec, data, source=source, semantic=lambda s: check_semantics(s, sites))


def json_schema() -> dict[str, Any]:
    """JSON Schema of the spec format, generated from the models."""
    schema = JobSpec.model_json_schema(by_alias=True)
    schema["$id"] = "https://hybridtrain.dev/schemas/jobspec-v1.json"
    schema["title"] = "hybridtrain TrainingJob (hybridtrain/v1)"
    return schema


def now_utc() -> datetime:
    return datetime.now(UTC)
