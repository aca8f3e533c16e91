"""A site's local round on small frames: FedAvg and FedProx updates, and DP-SGD through Opacus with its epsilon."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from hybridtrain.federated.local import build_model, train_local
from hybridtrain.specs.federation import DifferentialPrivacySpec
from hybridtrain.specs.job import FeatureSpec, ModelSpec
from hybridtrain.training.featurizer import Featurizer


def frames(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    df = pd.DataFrame({"x": x, "c": rng.choice(["a", "b"], n), "y": (x + rng.normal(0, 0.5, n) > 0).astype(int)})
    return df.iloc[: n // 2 * 1], df.iloc[n // 2:]


def setup():
    spec = ModelSpec(features=FeatureSpec(numeric=["x"], categorical=["c"]), hidden_layers=[8], dropout=0.0,
                     batch_size=64, learning_rate=0.01, seed=3)
    train, val = frames()
    featurizer = Featurizer.fit(train, spec.features)
    start = build_model(spec, featurizer, seed=spec.seed).state_dict()
    return spec, featurizer, start, train, val


def distance(a: dict, b: dict) -> float:
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a))


def test_a_local_round_learns_and_fedprox_stays_closer_to_the_global_weights():
    spec, featurizer, start, train, val = setup()
    plain = train_local(spec, featurizer, start, train, val, "y", site="s1", rnd=1, epochs=3)
    prox = train_local(spec, featurizer, start, train, val, "y", site="s1", rnd=1, epochs=3, mu=5.0)
    assert plain.rows == len(train) and plain.epsilon is None
    assert plain.metrics["val_auc"] > plain.metrics["global_val_auc"]
    assert 0 < distance(prox.state, start) < distance(plain.state, start)
    again = train_local(spec, featurizer, start, train, val, "y", site="s1", rnd=1, epochs=3)
    assert all(torch.equal(again.state[k], plain.state[k]) for k in plain.state)  # a replayed round is the same


def test_dp_sgd_spends_a_finite_epsilon_and_still_learns():
    spec, featurizer, start, train, val = setup()
    dp = DifferentialPrivacySpec(noise_multiplier=0.8, max_grad_norm=1.0, delta=1e-5)
    out = train_local(spec, featurizer, start, train, val, "y", site="s1", rnd=1, epochs=2, dp=dp)
    assert out.epsilon is not None and 0 < out.epsilon < 100
    assert set(out.state) == set(start) and distance(out.state, start) > 0
    assert out.metrics["val_auc"] > 0.6
