"""FederationState: where a federated run stands — the global featurizer, every finished round — and its checkpoints.

The aggregator keeps one series per run under ``federated/<job>/<run_key>/`` in the aggregation
site's store: ``global/round-NNNN.pt`` (the global weights after round N; round 0 is the
initialization) and ``state.json``. A round is committed by writing its weights, then the state
that names it, so a crash between the two leaves the previous round current: ``resume`` picks
up the last committed round and the run goes on from the next. Sites write their updates to
``updates/round-NNNN/<site>.pt`` beside them (through ``ModelMover``). With secure aggregation
they write ``keys/<site>.x25519.pub`` at prepare and, per attempt of a round, only their masked
vectors ``updates/round-NNNN/attempt-AA/<site>.masked``. When a participant drops out, the
aggregator writes ``CLOSED`` in the empty places (``seal``: write-if-absent, so a late upload
cannot land after it) and ``closed.json`` beside them.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import torch
from pydantic import BaseModel, Field

from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.storage.object_store import ObjectStore

#: What the aggregator writes in the place of a masked update that did not arrive before it closed the attempt.
CLOSED = b"closed: this site's masked update did not arrive before the attempt was closed\n"


class SecureAttempt(BaseModel):
    """One attempt of a securely aggregated round: whom it asked, and who dropped before their masked update arrived."""

    attempt: int
    participants: list[str]
    dropped: dict[str, str] = Field(default_factory=dict)


class RoundRecord(BaseModel):
    """One finished round: who took part, who dropped out and why, and what was measured."""

    round: int
    participants: list[str]
    dropped: dict[str, str] = Field(default_factory=dict, description="Site -> why it is not in this round.")
    rows: dict[str, int] = Field(default_factory=dict)
    site_metrics: dict[str, dict[str, float]] = Field(default_factory=dict)
    global_metrics: dict[str, float] = Field(
        default_factory=dict, description="The incoming global model on the participants' val splits (row-weighted).")
    epsilon: dict[str, float] = Field(default_factory=dict, description="DP epsilon spent per site so far.")
    site_seconds: dict[str, float] = Field(default_factory=dict, description="Wall seconds of each site's round.")
    site_hosts: dict[str, str] = Field(
        default_factory=dict, description="Site -> the SSH host that trained its round (sites that train on one).")
    transfers: list[TransferRecord] = Field(default_factory=list, description="Every crossing of the round.")
    seconds: float = 0.0
    global_sha256: str = ""
    secure_aggregation: bool = Field(False, description="The aggregator saw only the masked updates' sum.")
    attempts: list[SecureAttempt] = Field(
        default_factory=list, description="Secure aggregation: each attempt of the round (more than one when a "
        "participant dropped before its masked update arrived; the survivors masked their kept update again).")


class FederationState(BaseModel):
    """The committed state of a federated run."""

    job: str
    run_key: str
    featurizer: dict[str, Any]
    feature_rows: dict[str, int] = Field(default_factory=dict)
    prepared: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Site -> its SitePrepared (approved version, reports, crossings).")
    rounds: list[RoundRecord] = Field(default_factory=list)
    initial_sha256: str = ""

    @property
    def completed(self) -> int:
        return len(self.rounds)


def state_bytes(state: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, buf)
    return buf.getvalue()


def load_state(data: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(data), weights_only=True)


class RoundStore:
    """The run's series in the aggregation site's store: global weights per round, updates, state."""

    def __init__(self, store: ObjectStore, job: str, run_key: str):
        self.store = store
        self.prefix = f"federated/{job}/{run_key}"

    def global_key(self, rnd: int) -> str:
        return f"{self.prefix}/global/round-{rnd:04d}.pt"

    def update_key(self, rnd: int, site: str) -> str:
        return f"{self.prefix}/updates/round-{rnd:04d}/{site}.pt"

    def global_what(self, rnd: int) -> str:
        """How a transfer record names the global model of round ``rnd``."""
        return f"global model round {rnd} ({self.prefix})"

    def update_what(self, rnd: int, site: str) -> str:
        """How a transfer record names ``site``'s update of round ``rnd``."""
        return f"model update round {rnd} of {site} ({self.prefix})"

    def attempt_prefix(self, rnd: int, attempt: int) -> str:
        return f"{self.prefix}/updates/round-{rnd:04d}/attempt-{attempt:02d}"

    def masked_key(self, rnd: int, attempt: int, site: str) -> str:
        """Where ``site``'s masked update of attempt ``attempt`` of round ``rnd`` goes (secure aggregation)."""
        return f"{self.attempt_prefix(rnd, attempt)}/{site}.masked"

    def masked_what(self, rnd: int, attempt: int, site: str) -> str:
        return f"model update round {rnd} of {site}, masked (attempt {attempt}, {self.prefix})"

    def public_key_key(self, site: str) -> str:
        return f"{self.prefix}/keys/{site}.x25519.pub"

    def begin_attempt(self, rnd: int, attempt: int, participants: list[str]) -> list[str]:
        """The participants of an attempt: ``participants`` if it is new, else the ones written when it began."""
        key = f"{self.attempt_prefix(rnd, attempt)}/asked.json"
        if not self.store.create(key, json.dumps(sorted(participants)).encode()):
            return list(json.loads(self.store.get_bytes(key)))
        return sorted(participants)

    def seal(self, rnd: int, attempt: int, sites: list[str]) -> list[str]:
        """Fill the places of ``sites``' masked updates of an attempt with ``CLOSED`` where still empty (atomically:
        a site's upload and this seal race for the same key, one wins); returns the sites now sealed out. A site
        whose update landed first is not: then the attempt may still be complete."""
        sealed = []
        for site in sites:
            key = self.masked_key(rnd, attempt, site)
            if self.store.create(key, CLOSED) or self.store.get_bytes(key) == CLOSED:
                sealed.append(site)
        return sealed

    def close_attempt(self, rnd: int, attempt: int, participants: list[str], dropped: dict[str, str]) -> None:
        """Mark an attempt closed (after ``seal``): a participant dropped; the survivors are asked again."""
        marker = SecureAttempt(attempt=attempt, participants=participants, dropped=dropped)
        self.store.put_bytes(f"{self.attempt_prefix(rnd, attempt)}/closed.json", marker.model_dump_json().encode())

    def attempt_closed(self, rnd: int, attempt: int) -> bool:
        return self.store.exists(f"{self.attempt_prefix(rnd, attempt)}/closed.json")

    def closed_attempts(self, rnd: int) -> list[SecureAttempt]:
        """The closed attempts of round ``rnd``, in order (an aggregator that resumes goes on after the last one)."""
        closed = []
        while self.attempt_closed(rnd, len(closed) + 1):
            closed.append(SecureAttempt.model_validate_json(
                self.store.get_bytes(f"{self.attempt_prefix(rnd, len(closed) + 1)}/closed.json")))
        return closed

    def stats_key(self, site: str) -> str:
        return f"{self.prefix}/features/{site}.json"

    def save_global(self, rnd: int, state: dict[str, torch.Tensor]) -> str:
        data = state_bytes(state)
        self.store.put_bytes(self.global_key(rnd), data)
        return hashlib.sha256(data).hexdigest()

    def load_global(self, rnd: int) -> dict[str, torch.Tensor]:
        return load_state(self.store.get_bytes(self.global_key(rnd)))

    def load_global_update(self, rnd: int, site: str) -> dict[str, torch.Tensor]:
        """``site``'s update of round ``rnd``, as it arrived in this store."""
        return load_state(self.store.get_bytes(self.update_key(rnd, site)))

    def commit(self, state: FederationState) -> None:
        self.store.put_bytes(f"{self.prefix}/state.json", state.model_dump_json(indent=1).encode())

    def resume(self) -> FederationState | None:
        """The last committed state, or None for a new run."""
        key = f"{self.prefix}/state.json"
        if not self.store.exists(key):
            return None
        return FederationState.model_validate(json.loads(self.store.get_bytes(key)))
