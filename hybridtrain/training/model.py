"""TabularMLP: the feed-forward network that maps one featurized row to one binary-classification logit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hybridtrain.specs.job import ModelSpec


class TabularMLP(nn.Module):
    """Linear → ReLU → Dropout per hidden layer, then a linear head with one output.

    ``forward`` takes a float tensor of shape (N, n_inputs) and returns logits of shape (N,);
    apply ``torch.sigmoid`` for probabilities.

    Its randomness is its own when given a ``generator``: the weights are initialized from it (the
    draws ``nn.Linear`` makes from torch's global RNG, in the same order), and while training its
    dropout masks are drawn from ``self.generator``. Several models then train at once in one
    process (a sweep's trials in threads) each exactly as it would alone; torch's global RNG is
    shared by every thread. Without one, both come from the global RNG, as in plain torch.
    """

    def __init__(self, n_inputs: int, hidden_layers: Sequence[int], dropout: float = 0.0,
                 generator: torch.Generator | None = None):
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
        # Where training's dropout masks come from (None: torch's global RNG); on the model's device. Not annotated
        # in the class: TorchScript (edge export) reads class annotations and has no type for an optional Generator.
        self.generator = generator
        if generator is not None:
            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    _reset_linear(layer, generator)

    @classmethod
    def from_spec(cls, spec: ModelSpec, n_inputs: int, generator: torch.Generator | None = None) -> TabularMLP:
        """The network a job spec's ``model`` section describes, for ``n_inputs`` features."""
        return cls(n_inputs, spec.hidden_layers, spec.dropout, generator)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TabularMLP:
        """Rebuild the architecture from ``config()`` (weights come from a state_dict)."""
        return cls(config["n_inputs"], config["hidden_layers"], config["dropout"])

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-serializable, to store next to the weights."""
        return {"n_inputs": self.n_inputs, "hidden_layers": list(self.hidden_layers), "dropout": self.dropout}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.generator is not None and self.dropout > 0:
            return self._forward_own_dropout(x)
        return self.net(x).squeeze(-1)

    # Training only: a scripted (exported) model runs the plain path. Unannotated: TorchScript still reads an
    # unused method's signature, and cannot resolve this module's postponed (string) annotations there.
    @torch.jit.unused
    def _forward_own_dropout(self, x):
        keep = 1.0 - self.dropout
        for layer in self.net:
            if isinstance(layer, nn.Dropout):
                x = x * torch.empty_like(x).bernoulli_(keep, generator=self.generator).div_(keep)
            else:
                x = layer(x)
        return x.squeeze(-1)


def _reset_linear(layer: nn.Linear, generator: torch.Generator) -> None:
    """``nn.Linear.reset_parameters``, drawing from ``generator`` instead of the global RNG."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    if layer.bias is not None:
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(layer.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
