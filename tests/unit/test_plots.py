"""Plots: the run's learning curves and cost breakdown are small PNGs the summary can embed."""

from __future__ import annotations

import base64
import io

import pytest

from hybridtrain.reporting import plots


def _size(png: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        return img.size


def test_learning_curves_are_a_small_png():
    history = [{"epoch": e, "train_loss": 0.7 - 0.05 * e, "val_auc": 0.6 + 0.04 * e} for e in range(5)]
    png = plots.learning_curves(history, "val_auc", "churn v2")
    assert png.startswith(b"\x89PNG")
    assert _size(png) == (720, 300)
    assert len(png) < 120_000


def test_cost_breakdown_groups_the_ledger_categories():
    from hybridtrain.governance.ledger import CostBreakdown

    cost = CostBreakdown(onprem=0.1, on_demand=0.2, spot=0.05, wasted=0.03, transfer=0.01, storage=0.002)
    groups = plots.cost_groups(cost)
    assert groups == pytest.approx({"compute": 0.35, "egress": 0.01, "storage": 0.002, "wasted work": 0.03})
    png = plots.cost_breakdown(groups, "what churn v2 cost")
    assert _size(png) == (720, 240)


def test_a_data_uri_holds_the_png_itself():
    png = plots.cost_breakdown({"compute": 1.0}, "x")
    uri = plots.data_uri(png)
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.split(",", 1)[1]) == png
