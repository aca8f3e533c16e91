"""Secure aggregation's masking: masks cancel for any participant set, the sum is FedAvg, one masked vector says nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridtrain.federated import secure_aggregation as sa
from hybridtrain.federated.aggregation import fedavg

CONTEXT = ["job", "run-key", 3, 1]
names = st.lists(st.text("abcdefghij-0123456789", min_size=1, max_size=8), min_size=2, max_size=6, unique=True)


def keys(sites):
    private = {s: sa.new_private_key() for s in sites}
    return private, {s: sa.public_key(k) for s, k in private.items()}


@settings(max_examples=25, deadline=None)
@given(sites=names, n=st.integers(1, 300))
def test_the_pairwise_masks_cancel_for_any_participant_set(sites, n):
    private, public = keys(sites)
    zero = np.zeros(n, dtype=np.uint64)
    masked = [sa.mask(s, zero, private[s], public, CONTEXT) for s in sites]
    assert all(m.any() for m in masked)  # each site's mask is not zero ...
    assert not sa.masked_sum(masked).any()  # ... but they sum to zero mod 2^64


@settings(max_examples=25, deadline=None)
@given(sites=names, rows=st.lists(st.integers(1, 100_000), min_size=6, max_size=6),
       seed=st.integers(0, 2**32 - 1), spread=st.floats(1e-3, 1e3))
def test_the_masked_sum_is_fedavg(sites, rows, seed, spread):
    rng = np.random.default_rng(seed)
    like = {"w": torch.zeros(3, 4), "b": torch.zeros(4), "steps": torch.zeros((), dtype=torch.long)}
    states = {s: {"w": torch.from_numpy(rng.normal(0, spread, (3, 4))).float(),
                  "b": torch.from_numpy(rng.normal(0, spread, 4)).float(), "steps": torch.tensor(7)} for s in sites}
    n = dict(zip(sites, rows, strict=False))
    total = sum(n.values())
    private, public = keys(sites)
    masked = [sa.mask(s, sa.encode(s, sa.flatten(states[s], like) * n[s] / total, len(sites)), private[s], public,
                      CONTEXT) for s in sites]
    out = sa.aggregate(masked, like)
    plain = fedavg({s: (states[s], n[s]) for s in sites}, like)
    for k in ("w", "b"):
        assert torch.allclose(out[k], plain[k], rtol=1e-6, atol=1e-6 * spread), k
    assert out["steps"] == like["steps"]  # non-floating entries are the global model's


@settings(max_examples=10, deadline=None)
@given(sites=names, seed=st.integers(0, 2**32 - 1))
def test_one_masked_vector_is_uncorrelated_with_its_update(sites, seed):
    update = np.random.default_rng(seed).normal(0, 1, 4096).cumsum()  # strongly structured, far from noise
    private, public = keys(sites)
    site = sites[0]
    masked = sa.mask(site, sa.encode(site, update, len(sites)), private[site], public, CONTEXT)
    as_values = sa.decode(masked)
    assert abs(np.corrcoef(as_values, update)[0, 1]) < 0.1  # 1/sqrt(4096) = 0.016: 6 standard deviations
    assert abs(np.corrcoef(as_values[:-1], as_values[1:])[0, 1]) < 0.1  # and it looks like noise on its own


def test_a_later_attempt_or_another_participant_set_gets_fresh_masks():
    sites = ["a", "b", "c"]
    private, public = keys(sites)
    zero = np.zeros(64, dtype=np.uint64)
    first = sa.mask("a", zero, private["a"], public, ["job", "rk", 2, 1])
    assert np.array_equal(first, sa.mask("a", zero, private["a"], public, ["job", "rk", 2, 1]))  # deterministic
    again = sa.mask("a", zero, private["a"], public, ["job", "rk", 2, 2])
    assert not np.any(first == again)
    # The survivors a and b, without c: fresh masks that cancel between them alone.
    pair = {s: public[s] for s in ("a", "b")}
    a2, b2 = (sa.mask(s, zero, private[s], pair, ["job", "rk", 2, 2]) for s in ("a", "b"))
    assert not sa.masked_sum([a2, b2]).any() and not np.any(a2 == again)


def test_a_value_the_encoding_cannot_sum_is_refused_with_the_site_and_the_fix():
    limit = 2.0 ** 31 / 4
    assert sa.decode(sa.encode("dc1", np.array([limit * 0.999, -limit * 0.999]), 4)) == pytest.approx(
        [limit * 0.999, -limit * 0.999])
    with pytest.raises(sa.UpdateOutOfRange) as err:
        sa.encode("dc2", np.array([0.5, limit * 1.01]), 4)
    text = str(err.value)
    assert "site dc2" in text and "training.federated.secure_aggregation" in text and "diverged" in text
    with pytest.raises(sa.UpdateOutOfRange, match="site dc3: its weighted update holds nan"):
        sa.encode("dc3", np.array([0.0, float("nan")]), 2)


def test_a_secure_round_needs_the_same_two_or_more_sites_for_rows_and_keys():
    _, public = keys(["a", "b"])
    assert sa.SecureRound(rows={"a": 1, "b": 2}, public_keys=public).participants == ["a", "b"]
    with pytest.raises(ValueError, match="2 or more sites"):
        sa.SecureRound(rows={"a": 1}, public_keys={"a": public["a"]})
    with pytest.raises(ValueError, match="same 2 or more sites"):
        sa.SecureRound(rows={"a": 1, "c": 2}, public_keys=public)
