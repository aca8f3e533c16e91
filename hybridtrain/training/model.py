"""TabularMLP: the feed-forward network that maps one featurized row to one binary-classification logit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hybridtrain.specs.job import ModelSpec


class TabularMLP(nn.Module):
    """Linear → ReLU → Dropout per hidden layer, then a linear head with one output.

    ``forward`` takes a float tensor of shape (N, n_inputs) and returns logits of shape (N,);
    apply ``torch.sigmoid`` for probabilities. Weights are initialized from torch's global RNG,
    so seed it first for a reproducible model.
    """

    def __init__(self, n_inputs: int, hidden_layers: Sequence[int], dropout: float = 0.0):
        super().__init__()
        if n_inputs < 1:
            raise ValueError(f"n_inputs must be at least 1, got {n_inputs}")
        if not hidden_layers or any(h < 1 for h in hidden_layers):
            raise ValueError(f"hidden_layers needs at least one layer of >= 1 unit, got {list(hidden_layers)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.n_inputs = int(n_inputs)
        self.hidden_layers = [int(h) for h in hidden_layers]
        self.dropout = float(dropout)
        layers: list[nn.Module] = []
        width = self.n_inputs
        for h in self.hidden_layers:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(self.dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    @classmethod
    def from_spec(cls, spec: ModelSpec, n_inputs: int) -> TabularMLP:
        """The network a job spec's ``model`` section describes, for ``n_inputs`` features."""
        return cls(n_inputs, spec.hidden_layers, spec.dropout)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TabularMLP:
        """Rebuild the architecture from ``config()`` (weights come from a state_dict)."""
        return cls(config["n_inputs"], config["hidden_layers"], config["dropout"])

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-serializable, to store next to the weights."""
        return {"n_inputs": self.n_inputs, "hidden_layers": list(self.hidden_layers), "dropout": self.dropout}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
