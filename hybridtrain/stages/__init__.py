"""Stages: the training lifecycle as plain functions, one module per stage, from versioned inputs to
versioned outputs.

preprocess → anonymize → sync → train → evaluate → promote. Each takes and returns DVC dataset
versions or registry entries (never hidden globals), so a stage can run at any site that can
reach the stores, and a Prefect task wraps exactly one of these calls. The same functions,
called in sequence, are the plain-Python baseline of the orchestration benchmark. This module
is the public face of the package: callers use ``stages.train(...)``; the stage modules import
each other directly.
"""

from hybridtrain.stages.anonymization import anonymize
from hybridtrain.stages.data_sync import check_destination, sync
from hybridtrain.stages.evaluation import evaluate
from hybridtrain.stages.placing import (
    PlacementOutcome,
    estimate_run_hours,
    past_run_hours,
    place,
    record_placement,
    site_health,
)
from hybridtrain.stages.preprocessing import preprocess, resolve_raw
from hybridtrain.stages.promotion import promote, publish_public_key, releaser_for, run_record
from hybridtrain.stages.results import (
    AnonymizeResult,
    EvaluateResult,
    PreprocessResult,
    PromoteResult,
    SyncResult,
    TrainOutput,
)
from hybridtrain.stages.site_access import (
    audit,
    checkpoint_store,
    control_site,
    dataset_at,
    remote_secrets_for,
    remotes_for,
    site_repo,
    workspace_repo,
)
from hybridtrain.stages.tracking import (
    build_lineage,
    check_run,
    close_run,
    find_result,
    load_result,
    open_run,
    record_data,
    save_result,
)
from hybridtrain.stages.training import (
    check_run_key,
    checkpoint_sites,
    list_instances,
    move_checkpoint,
    observed_preemption_rate,
    sweep_instances,
    train,
)

__all__ = [
    "PreprocessResult",
    "AnonymizeResult",
    "SyncResult",
    "TrainOutput",
    "EvaluateResult",
    "PromoteResult",
    "audit",
    "control_site",
    "remotes_for",
    "remote_secrets_for",
    "workspace_repo",
    "site_repo",
    "checkpoint_store",
    "dataset_at",
    "resolve_raw",
    "preprocess",
    "anonymize",
    "check_destination",
    "sync",
    "train",
    "check_run_key",
    "move_checkpoint",
    "observed_preemption_rate",
    "sweep_instances",
    "list_instances",
    "checkpoint_sites",
    "evaluate",
    "releaser_for",
    "publish_public_key",
    "run_record",
    "promote",
    "build_lineage",
    "open_run",
    "check_run",
    "record_data",
    "close_run",
    "save_result",
    "find_result",
    "load_result",
    "PlacementOutcome",
    "estimate_run_hours",
    "past_run_hours",
    "place",
    "site_health",
    "record_placement",
]
