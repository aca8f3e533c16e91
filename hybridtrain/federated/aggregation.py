"""Aggregation: the global weights from the sites' updates — FedAvg, the row-weighted mean of the site weights.

FedProx aggregates the same way; its difference is at the sites (a proximal term in the local
loss, ``hybridtrain.federated.local``). Every update must have the global model's parameter
names and shapes; one that does not is refused with the site named.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridtrain.errors import Problem, SpecError

AGGREGATORS = ("fedavg", "fedprox")


def fedavg(updates: Mapping[str, tuple[dict[str, torch.Tensor], int]],
           like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Site -> (state_dict, training rows) combined into one state_dict shaped like ``like``."""
    if not updates:
        raise ValueError("no updates to aggregate")
    problems = []
    for site, (state, n) in updates.items():
        if n <= 0:
            problems.append(Problem(site, f"update trained on {n} rows"))
        if set(state) != set(like) or any(state[k].shape != like[k].shape for k in like):
            problems.append(Problem(site, "update does not match the global model's parameters"))
    if problems:
        raise SpecError("federated round", problems)
    total = float(sum(n for _, n in updates.values()))
    out = {}
    for key, ref in like.items():
        if not torch.is_floating_point(ref):  # counters (none in TabularMLP) are taken from the first site
            out[key] = next(iter(updates.values()))[0][key].clone()
            continue
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for state, n in updates.values():
            acc += state[key].to(torch.float64) * (n / total)
        out[key] = acc.to(ref.dtype)
    return out
