"""Plots: the pictures of one lifecycle run — learning curves and what the model version cost — as PNG bytes.

Small on purpose (about 720×300 px, tens of kB): they are logged to the MLflow run under
``plots/`` and embedded in the Prefect summary artifact, where a reader sees them beside the
numbers. Matplotlib's object API with the Agg canvas: no global pyplot state, no display needed.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

#: Artifact paths in the lifecycle's MLflow run.
LEARNING_CURVES = "plots/learning_curves.png"
COST_BREAKDOWN = "plots/cost_breakdown.png"

#: Ledger categories → the four a reader asks about.
COST_GROUPS = {"compute": ("onprem", "on_demand", "spot"), "egress": ("transfer",), "storage": ("storage",),
               "wasted work": ("wasted",)}


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    out = io.BytesIO()
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out.getvalue()


def learning_curves(history: Sequence[Mapping[str, float]], metric: str = "val_auc", title: str = "") -> bytes:
    """Training loss and the validation ``metric`` per epoch, side by side (epochs counted from 1)."""
    fig = _figure(7.2, 3.0)
    epochs = [int(h["epoch"]) + 1 for h in history]
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.plot(epochs, [h.get("train_loss", float("nan")) for h in history], marker="o", color="#4c72b0")
    left.set_title("training loss", fontsize=10)
    right.plot(epochs, [h.get(metric, float("nan")) for h in history], marker="o", color="#dd8452")
    right.set_title(f"validation {metric.removeprefix('val_')}", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("epoch", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if epochs:
            ax.set_xticks(epochs if len(epochs) <= 12 else epochs[:: max(1, len(epochs) // 10)])
    if title:
        fig.suptitle(title, fontsize=10)
    return _png(fig)


def cost_groups(cost: Any) -> dict[str, float]:
    """A ledger ``CostBreakdown`` as compute, egress, storage and wasted work (USD)."""
    return {name: sum(float(getattr(cost, c, 0.0)) for c in cats) for name, cats in COST_GROUPS.items()}


def cost_breakdown(groups: Mapping[str, float], title: str) -> bytes:
    """Horizontal bars of what a version cost, by group, with each amount written at its bar."""
    fig = _figure(7.2, 2.4)
    ax = fig.add_subplot(1, 1, 1)
    names = list(groups)[::-1]
    values = [groups[n] for n in names]
    colors = {"compute": "#4c72b0", "egress": "#8172b3", "storage": "#937860", "wasted work": "#c44e52"}
    ax.barh(names, values, color=[colors.get(n, "#55a868") for n in names])
    top = max(values) if values and max(values) > 0 else 1.0
    for y, v in enumerate(values):
        ax.annotate(f"${v:,.4f}", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("USD", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(title, fontsize=10)
    return _png(fig)


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` — an image a markdown artifact can show without any server."""
    return "data:image/png;base64," + base64.b64encode(png).decode()
