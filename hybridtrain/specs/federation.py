"""TrainingModeSpec: how a job trains — centralized on one site, or federated across the sites holding its data.

``training.mode: auto`` (the default) lets ``plan`` choose: federated when the data is split
across sites (``dataset.sites``) or the placement policy allows no one site to train on all of
it; centralized otherwise. Federated training runs ``rounds`` rounds; in each, every data site
trains the global model on its own approved data for ``local_epochs`` epochs and sends only the
weights back, and the aggregator combines them (FedAvg, or FedProx with its proximal term ``mu``).
A round succeeds when at least ``min_sites`` sites (and ``min_fraction`` of them) reported.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hybridtrain.specs.schema_bounds import bound_numbers
from hybridtrain.specs.sites import NAME_RE

#: The most aggregation rounds a federated job may run (``training.federated.rounds``).
MAX_ROUNDS = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, json_schema_extra=bound_numbers)


class DifferentialPrivacySpec(_Strict):
    """Client-side DP-SGD (Opacus) at every site: per-sample gradients clipped, Gaussian noise added."""

    noise_multiplier: float = Field(1.0, gt=0, description="Noise standard deviation / max_grad_norm.")
    max_grad_norm: float = Field(1.0, gt=0, description="Per-sample gradient clipping norm.")
    delta: float = Field(1e-5, gt=0, lt=1, description="Target delta of the (epsilon, delta) guarantee.")


class FederatedSpec(_Strict):
    """Rounds, local work and fault tolerance of federated training."""

    rounds: int = Field(5, ge=1, le=MAX_ROUNDS, description="Aggregation rounds.")
    local_epochs: int = Field(1, ge=1, le=100, description="Epochs each site trains per round, from the global weights.")
    min_sites: int = Field(
        1, ge=1, description="A round needs updates from at least this many sites; fewer fails the round.")
    min_fraction: float = Field(
        0.5, gt=0, le=1, description="... and from at least this share of the data sites.")
    aggregator: Literal["fedavg", "fedprox"] = Field(
        "fedavg", description="fedavg: weighted mean of the site weights by training rows; fedprox: the same "
        "mean, with a proximal term mu/2*||w - w_global||^2 in every site's loss (for non-IID sites).")
    mu: float = Field(0.01, ge=0, description="FedProx proximal weight (fedprox only).")
    aggregation_site: str | None = Field(
        None, pattern=NAME_RE, description="Site that aggregates (and stores the global model); default: the "
        "control plane's site.")
    round_timeout_s: float = Field(
        3600.0, gt=0, description="A site that has not reported this long after its round started is dropped "
        "from that round (it rejoins the next).")
    site_lost_s: float = Field(
        120.0, gt=0, description="A site whose work pool has had no live worker (none with a heartbeat in its "
        "last 3 intervals, counted from the freshest heartbeat of the other sites' pools, so that heartbeats "
        "late everywhere on a busy server drop no one) this long while its step is unfinished is dropped at "
        "once, without waiting for round_timeout_s: its worker, and the step's process with it, are gone.")
    dp: DifferentialPrivacySpec | None = Field(None, description="Differential privacy at the sites (optional).")
    secure_aggregation: bool = Field(
        False, description="Pairwise-masked updates (SecAgg, Bonawitz et al.): each site adds masks agreed with "
        "every other participant (X25519 keys made at prepare) to its row-weighted update, the masks cancel in "
        "the sum, and the aggregator learns only the weighted mean, never one site's update. A site that drops "
        "before its masked update arrives makes the survivors mask their kept update again (no retraining). "
        "Needs at least 2 sites per round.")


class TrainingModeSpec(_Strict):
    """Where the training goes: to one site with the data synced to it, or to the data."""

    mode: Literal["centralized", "federated", "auto"] = Field(
        "auto", description="centralized: one site trains on the (synced) data; federated: every data site "
        "trains locally and only model updates travel; auto: plan decides (federated when the data is split "
        "across sites or no one site may hold all of it).")
    federated: FederatedSpec = Field(default_factory=FederatedSpec)
