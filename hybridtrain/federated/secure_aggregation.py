"""SecureAggregation: pairwise additive masking (SecAgg, Bonawitz et al. 2017) — the aggregator learns only the sum of the updates.

An example, round 3 of a job over sites ``a``, ``b``, ``c`` (participants P = {a, b, c}):

1. At prepare each site made an X25519 key pair for the job and run key; the private key stayed
   in the site's own store, the public key went to the aggregator beside the feature statistics.
2. Site ``a`` trains as usual and keeps its new weights ``w_a`` site-side. It encodes its share of
   the weighted mean, ``w_a * n_a / N_P`` (``n``: training rows, public since the statistics;
   ``N_P``: the rows of P), as fixed point (``SCALE`` = 2^32, two's complement in uint64; a value
   the encoding cannot hold for |P| summands is refused with ``UpdateOutOfRange``).
3. For each peer ``j`` it derives a key from X25519(sk_a, pk_j) with HKDF-SHA256, bound to job,
   run key, round, attempt, P and the pair, expands it with ChaCha20 into 8 bytes per weight,
   and adds that mask when ``a < j``, subtracts it when ``a > j`` (mod 2^64). ``b`` derives the
   same mask from X25519(sk_b, pk_a) and applies it with the opposite sign.
4. Only the masked vector leaves ``a``. Each one alone is uniformly random to the aggregator;
   summed over P the masks cancel and ``decode`` gives the FedAvg weights.
5. ``c`` drops before its vector arrives: the masks with ``c`` do not cancel, so the aggregator
   seals ``c``'s place (write-if-absent: ``c``'s own upload is write-if-absent too, so a late
   one either landed before — and the attempt is complete after all — or never lands), closes
   attempt 1 and asks ``a`` and ``b`` for attempt 2 with P' = {a, b}. They mask their kept ``w``
   again, weighted by ``N_P'``, with fresh masks (attempt and P are in the HKDF info) — no
   retraining. Without the seal, a late ``y_c`` would complete attempt 1's sum, and that sum
   minus attempt 2's would be ``c``'s update.

Threat model: a semi-honest aggregator (it follows the protocol and reads everything it is sent)
learns the weighted sum of P's updates and nothing else; colluding with some sites it learns the
sum of the others. Not covered: an aggregator that hands out forged public keys or lies about P
(active attacks).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridtrain.errors import HybridtrainError
from hybridtrain.federated.rounds import load_state, state_bytes
from hybridtrain.specs.schema_bounds import bound_numbers
from hybridtrain.storage.object_store import ObjectStore

SCALE_BITS = 32
SCALE = float(2 ** SCALE_BITS)
#: Version of the mask derivation: part of every HKDF info, so a change never reuses old masks.
PROTOCOL = b"hybridtrain-secagg-v1"


class UpdateOutOfRange(HybridtrainError):
    """A site's weighted update has a value the fixed-point encoding cannot sum without overflow."""

    def __init__(self, site: str, value: float, limit: float):
        super().__init__(f"site {site}: its weighted update holds {value:.6g}, outside +-{limit:.6g}, the most the "
                         f"fixed-point encoding of training.federated.secure_aggregation sums without overflow "
                         f"(scale 2^{SCALE_BITS}): the local training diverged; lower the learning rate or turn on "
                         "gradient clipping (training.federated.dp)")


class AttemptClosed(HybridtrainError):
    """The aggregator closed this attempt of the round (a participant dropped): the site must not upload to it."""

    def __init__(self, site: str, rnd: int, attempt: int):
        super().__init__(f"site {site}: attempt {attempt} of round {rnd} was closed (a participant dropped out); "
                         "its masked update was not sent: the aggregator asks the remaining sites again")


class SecureRound(BaseModel):
    """What a site needs to mask its update for one attempt of a round: who takes part, their rows and keys."""

    model_config = ConfigDict(json_schema_extra=bound_numbers)  # a step's form: see specs.schema_bounds

    attempt: int = Field(1, ge=1, description="1, then one more each time a participant dropped before its masked "
                                              "update arrived.")
    rows: dict[str, int] = Field(description="Participant -> training rows (the weights of the mean).")
    public_keys: dict[str, str] = Field(description="Participant -> its X25519 public key (hex).")

    @model_validator(mode="after")
    def _same_sites(self) -> SecureRound:
        if set(self.rows) != set(self.public_keys) or len(self.rows) < 2:
            raise ValueError(f"a secure round needs rows and a public key for the same 2 or more sites, got "
                             f"{sorted(self.rows)} and {sorted(self.public_keys)}")
        return self

    @property
    def participants(self) -> list[str]:
        return sorted(self.rows)


class SitePrivate:
    """What a site keeps to itself under secure aggregation, in its own store: its private key, its plain updates.

    Under ``federated-site/<job>/<run_key>/<site>/``: ``x25519.key`` and per round ``round-NNNN.pt``
    (the weights) with ``round-NNNN.json`` (rows, metrics, epsilon; written last: the update is kept
    once it is there). An SSH host of the site writes its round here too; the site's step masks it and
    notes which host trained it (``round-NNNN.host.json``)."""

    def __init__(self, store: ObjectStore, job: str, run_key: str, site: str):
        self.store = store
        self.prefix = f"federated-site/{job}/{run_key}/{site}"

    def private_key(self) -> bytes:
        """The site's X25519 key for this job and run key, made on first use (prepared again: the same key)."""
        key = f"{self.prefix}/x25519.key"
        self.store.create(key, new_private_key())  # write-if-absent: two prepares in a race keep one key
        return self.store.get_bytes(key)

    def keep_update(self, rnd: int, state: Mapping[str, torch.Tensor], rows: int, metrics: dict[str, float],
                    epsilon: float | None) -> bytes:
        """Keep round ``rnd``'s plain update; returns its bytes."""
        data = state_bytes(dict(state))
        self.store.put_bytes(f"{self.prefix}/round-{rnd:04d}.pt", data)
        self.store.put_bytes(f"{self.prefix}/round-{rnd:04d}.json",
                             json.dumps({"rows": rows, "metrics": metrics, "epsilon": epsilon}).encode())
        return data

    def note_host(self, rnd: int, host: str | None, job_id: str | None) -> None:
        """Record the SSH host (and its job id) that trained round ``rnd``: a later attempt masks the kept update
        again without that host, and the round's lineage still names it."""
        self.store.put_bytes(f"{self.prefix}/round-{rnd:04d}.host.json",
                             json.dumps({"host": host, "job_id": job_id}).encode())

    def noted_host(self, rnd: int) -> tuple[str | None, str | None]:
        """The host and job id ``note_host`` recorded for round ``rnd`` ((None, None): trained in process)."""
        key = f"{self.prefix}/round-{rnd:04d}.host.json"
        if not self.store.exists(key):
            return None, None
        noted = json.loads(self.store.get_bytes(key))
        return noted.get("host"), noted.get("job_id")

    def kept_update(self, rnd: int) -> tuple[dict[str, torch.Tensor], dict] | None:
        """Round ``rnd``'s plain update and its rows, metrics and epsilon (None: not trained yet)."""
        meta = f"{self.prefix}/round-{rnd:04d}.json"
        if not self.store.exists(meta):
            return None
        return load_state(self.store.get_bytes(f"{self.prefix}/round-{rnd:04d}.pt")), json.loads(
            self.store.get_bytes(meta))


def new_private_key() -> bytes:
    """A fresh X25519 private key (32 raw bytes)."""
    return X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_key(private: bytes) -> str:
    """The hex public key of a raw private key."""
    key = X25519PrivateKey.from_private_bytes(private).public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def float_keys(like: Mapping[str, torch.Tensor]) -> list[str]:
    """The parameters that are aggregated (floating point), by name: the order both ends flatten in."""
    return sorted(k for k, v in like.items() if torch.is_floating_point(v))


def flatten(state: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> np.ndarray:
    """The floating parameters of ``state`` as one float64 vector, in ``like``'s order."""
    keys = float_keys(like)
    if not keys:
        return np.zeros(0)
    return np.concatenate([state[k].detach().cpu().to(torch.float64).reshape(-1).numpy() for k in keys])


def unflatten(vec: np.ndarray, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``vec`` back into a state dict shaped like ``like`` (non-floating entries are ``like``'s own)."""
    size = sum(like[k].numel() for k in float_keys(like))
    if size != len(vec):
        raise ValueError(f"vector of {len(vec)} values for a model of {size}")
    out = {k: v.clone() for k, v in like.items() if not torch.is_floating_point(v)}
    at = 0
    for key in float_keys(like):
        ref = like[key]
        out[key] = torch.from_numpy(vec[at:at + ref.numel()].copy()).reshape(ref.shape).to(ref.dtype)
        at += ref.numel()
    return {k: out[k] for k in like}


def encode(site: str, values: np.ndarray, summands: int) -> np.ndarray:
    """``values`` as fixed point in uint64 (two's complement); refused when ``summands`` of them could overflow."""
    limit = 2.0 ** (63 - SCALE_BITS) / max(1, summands)
    worst = float(np.max(np.abs(values))) if values.size else 0.0
    if not np.isfinite(worst) or worst >= limit:
        bad = values[~np.isfinite(values)] if not np.isfinite(worst) else values[np.abs(values) >= limit]
        raise UpdateOutOfRange(site, float(bad.flat[0]), limit)
    return np.rint(values * SCALE).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray) -> np.ndarray:
    """A sum of encoded vectors (mod 2^64) back to float64."""
    return total.view(np.int64).astype(np.float64) / SCALE


def _info(context: Sequence[str | int], participants: Iterable[str], a: str, b: str) -> bytes:
    lo, hi = sorted((a, b))
    fields = [PROTOCOL.decode(), *map(str, context), ",".join(sorted(participants)), lo, hi]
    return "|".join(f"{len(f)}:{f}" for f in fields).encode()  # length-prefixed: no two contexts share an info


def pair_mask(private: bytes, peer_public: str, info: bytes, n: int) -> np.ndarray:
    """The mask ``n`` uint64 long that this key and the peer's key both derive for ``info`` (ChaCha20 keystream)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(bytes.fromhex(peer_public)))
    okm = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=info).derive(shared)
    stream = Cipher(algorithms.ChaCha20(okm[:32], okm[32:]), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(8 * n)), dtype="<u8").astype(np.uint64)


def mask(site: str, encoded: np.ndarray, private: bytes, public_keys: Mapping[str, str],
         context: Sequence[str | int]) -> np.ndarray:
    """``encoded`` plus, for every other participant ``j`` (the keys of ``public_keys``), the pair's mask: added
    when ``site < j``, subtracted when ``site > j`` (mod 2^64). ``context`` (job, run key, round, attempt) and the
    participant set go into every mask's HKDF info."""
    out = encoded.astype(np.uint64, copy=True)
    for peer in sorted(public_keys):
        if peer == site:
            continue
        m = pair_mask(private, public_keys[peer], _info(context, public_keys, site, peer), len(out))
        if site < peer:
            out += m
        else:
            out -= m
    return out


def masked_sum(vectors: Iterable[np.ndarray]) -> np.ndarray:
    """The sum of masked vectors mod 2^64 (uint64 arithmetic wraps)."""
    total: np.ndarray | None = None
    for v in vectors:
        total = v.astype(np.uint64, copy=True) if total is None else total + v
    if total is None:
        raise ValueError("no masked updates to sum")
    return total


def to_bytes(vec: np.ndarray) -> bytes:
    return vec.astype("<u8").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


def aggregate(masked: Iterable[np.ndarray], like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weighted mean the participants' masked vectors sum to, as a state dict shaped like ``like``."""
    return unflatten(decode(masked_sum(masked)), like)
