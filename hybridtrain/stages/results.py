"""StageResult: what each lifecycle stage hands to the next — versioned datasets, model URIs, reports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import TransferRecord

if TYPE_CHECKING:
    pass



# -- results ---------------------------------------------------------------------------------


class PreprocessResult(BaseModel):
    raw: DatasetVersion
    curated: DatasetVersion
    report: dict[str, Any]
    site: str
    seconds: float


class AnonymizeResult(BaseModel):
    approved: DatasetVersion
    report: dict[str, Any]
    leak_scan: dict[str, Any]
    rows_sampled_out: int
    site: str
    seconds: float


class SyncResult(BaseModel):
    dataset: DatasetVersion
    transfer: TransferRecord | None = Field(None, description="None when the data was already at the site.")
    site: str
    seconds: float


class TrainOutput(BaseModel):
    site: str
    model_uri: str
    model_id: str | None
    run_key: str
    history: list[dict[str, float]]
    global_step: int
    epochs_completed: int
    resumed_from_step: int | None
    checkpoints_written: int
    last_checkpoint: str | None
    device: str
    seconds: float
    samples_per_second: float
    gpu_seconds: float = Field(0.0, description="Wall seconds x GPUs used (0 on CPU-only training).")
    checkpoint_sha256: str | None = Field(None, description="SHA-256 of the final checkpoint (lineage gate).")
    checkpoint_bytes: int = 0
    attempts: list[Any] = Field(default_factory=list, description="Earlier attempts of this run (ledger records).")
    transfers: list[TransferRecord] = Field(default_factory=list, description="Model upload to the control site.")
    instances: list[str] = Field(default_factory=list,
                                 description="Cloud instances the job started and terminated (multi-node at a cloud site).")


class EvaluateResult(BaseModel):
    metrics: dict[str, float]
    champion_version: str | None
    champion_metrics: dict[str, float] | None
    better: bool
    delta: float | None
    reason: str
    threshold_failures: list[str]
    site: str
    seconds: float


class PromoteResult(BaseModel):
    model_name: str
    version: str
    promoted: bool
    champion_version: str | None
    previous_version: str | None
    reasons: list[str]
    gates: dict[str, str] = Field(default_factory=dict, description="Each gate's verdict.")
    cost_usd: float = Field(0.0, description="The version's ledger total.")
    released_to: list[str] = Field(default_factory=list)
    bundle_sha256: str | None = None
    pictures: dict[str, str] = Field(default_factory=dict, description="Title -> PNG artifact path in the run.")
    resumed: bool = Field(False, description="It finished the promotion of a version an interrupted run of the same "
                                             "lifecycle (run key) had registered, instead of registering another.")
    seconds: float
