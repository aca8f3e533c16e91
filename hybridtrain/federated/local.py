"""LocalRound: one site's work in one round — evaluate the incoming global model, train it locally, return the weights.

The site starts from the global weights, trains ``local_epochs`` epochs of Adam on its own
approved training split (a fresh optimizer each round, as in FedAvg), and returns the new
weights with its row count. With FedProx the loss gets ``mu/2 * ||w - w_global||^2``, which
keeps a site with very different data from pulling the model far from the others. With
``dp`` the step is DP-SGD through Opacus (per-sample clipping and Gaussian noise) and the
spent epsilon for the configured delta is returned. Shuffles and dropout draw from generators
seeded by (model seed, round, site), so a replayed round gives the same update. It trains on
the GPU when one is visible (on an SSH host, the one the round holds), as the centralized trainer
does; the weights it returns are on the CPU either way.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

from hybridtrain.datasets.label import binary_labels
from hybridtrain.errors import DataError, Problem
from hybridtrain.specs.federation import DifferentialPrivacySpec
from hybridtrain.specs.job import ModelSpec
from hybridtrain.training.evaluation import binary_metrics, model_probabilities
from hybridtrain.training.featurizer import Featurizer
from hybridtrain.training.model import TabularMLP
from hybridtrain.training.trainer import default_device, epoch_permutation


@dataclass
class LocalResult:
    """What a site's round produced: its new weights, the rows they were trained on, and metrics."""

    state: dict[str, torch.Tensor]
    rows: int
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    epsilon: float | None = None


def round_seed(seed: int, rnd: int, site: str) -> int:
    digest = hashlib.sha256(f"{seed}:{rnd}:{site}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _xy(featurizer: Featurizer, df: pd.DataFrame, label: str, dataset: str) -> tuple[torch.Tensor, np.ndarray]:
    if len(df) == 0:
        raise DataError(dataset, [Problem("", f"the {dataset} split has no rows at this site; give the site more data "
                                              "or change the split fractions")])
    return torch.from_numpy(featurizer.transform(df, dataset=dataset)), binary_labels(df, label, dataset=dataset)


def build_model(model_spec: ModelSpec, featurizer: Featurizer, state: dict[str, torch.Tensor] | None = None,
                seed: int | None = None) -> TabularMLP:
    """The job's network for the global featurizer; weights from ``state`` or initialized from ``seed``."""
    if seed is not None:
        torch.manual_seed(seed)
    model = TabularMLP.from_spec(model_spec, featurizer.n_features)
    if state is not None:
        model.load_state_dict(state)
    return model


def evaluate_state(model_spec: ModelSpec, featurizer: Featurizer, state: dict[str, torch.Tensor], df: pd.DataFrame,
                   label: str, dataset: str) -> dict[str, float]:
    """Metrics of the weights ``state`` on ``df`` (``n`` included: the rows they were measured on)."""
    x, y = _xy(featurizer, df, label, dataset)
    model = build_model(model_spec, featurizer, state).eval()
    return binary_metrics(y, model_probabilities(model, x), dataset=dataset, label=label)


def train_local(model_spec: ModelSpec, featurizer: Featurizer, global_state: dict[str, torch.Tensor],
                train: pd.DataFrame, val: pd.DataFrame, label: str, *, site: str, rnd: int, epochs: int,
                mu: float = 0.0, dp: DifferentialPrivacySpec | None = None, threads: int | None = None,
                device: torch.device | None = None) -> LocalResult:
    """``epochs`` local epochs from ``global_state`` on ``device`` (default: the GPU when one is visible,
    else the CPU); metrics: the global model's on the local val split (``global_val_*``), then the
    local model's (``val_*``), and the mean train loss."""
    started = time.perf_counter()
    device = device if device is not None else default_device()
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        x, y_np = _xy(featurizer, train, label, "train")
        metrics = {f"global_val_{k}": v for k, v in
                   evaluate_state(model_spec, featurizer, global_state, val, label, "val").items()}
        seed = round_seed(model_spec.seed, rnd, site)
        torch.manual_seed(seed)
        model = build_model(model_spec, featurizer, global_state).to(device)
        anchor = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.Adam(model.parameters(), lr=model_spec.learning_rate,
                                     weight_decay=model_spec.weight_decay)
        y = torch.from_numpy(y_np)
        loss_fn = nn.BCEWithLogitsLoss()
        engine = None
        if dp is not None:
            model, optimizer, batches, engine = _private(model, optimizer, x, y, model_spec, dp, seed)
        losses = []
        for epoch in range(epochs):
            model.train()
            if engine is None:
                order = epoch_permutation(len(x), seed, epoch)
                batches = [order[i:i + model_spec.batch_size] for i in range(0, len(x), model_spec.batch_size)]
                epoch_batches = ((x[idx], y[idx]) for idx in batches)
            else:
                epoch_batches = iter(batches)
            for xb, yb in epoch_batches:
                if len(xb) == 0:
                    continue
                xb, yb = xb.to(device), yb.to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)
                if mu > 0:
                    loss = loss + mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor,
                                                                                     strict=True))
                loss.backward()
                optimizer.step()
                losses.append(float(loss.item()))
        trained = model._module if engine is not None else model  # Opacus wraps the module
        state = {k: v.detach().cpu().clone() for k, v in trained.state_dict().items()}
        metrics["train_loss"] = float(np.mean(losses)) if losses else float("nan")
        metrics.update({f"val_{k}": v for k, v in
                        evaluate_state(model_spec, featurizer, state, val, label, "val").items()})
        epsilon = engine.get_epsilon(dp.delta) if engine is not None else None
        return LocalResult(state=state, rows=len(x), metrics=metrics, seconds=time.perf_counter() - started,
                           epsilon=epsilon)
    finally:
        torch.set_num_threads(previous_threads)


def _private(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
             model_spec: ModelSpec, dp: DifferentialPrivacySpec, seed: int):
    """Opacus' PrivacyEngine around the model, optimizer and a Poisson-sampled loader of (x, y)."""
    try:
        from opacus import PrivacyEngine
    except ImportError:
        raise DataError("training.federated.dp", [Problem(
            "dp", "differential privacy needs Opacus, which is not installed in this site's environment: "
                  "pip install -r requirements/lock.txt, or remove training.federated.dp")]) from None
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x, y), batch_size=model_spec.batch_size,
                        generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                                   noise_multiplier=dp.noise_multiplier,
                                                   max_grad_norm=dp.max_grad_norm, poisson_sampling=True)
    return model, optimizer, loader, engine
