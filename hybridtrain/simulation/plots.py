"""SimPlots: the pictures of a comparison — cost vs load, cost–misses curves, on-prem and cloud GPUs over time — and their MLflow log.

``write_plots(reports, dir)`` writes PNGs (matplotlib, headless):

- ``cost_vs_load_<regime>.png``: total cost per policy against demand ÷ on-prem GPUs (mean over seeds);
- ``frontier_<regime>_<load>.png``: each baseline family's settings and its frontier (cost against
  deadline misses), our point, and the capacity-aware bound at our misses;
- ``timeline_<regime>_<load>.png``: on-prem GPUs busy and cloud GPUs in use over time, ours and
  bursting at the first queued job (first seed).

``log_to_mlflow(reports, paths, tracking_uri)`` logs the targets (mean and worst over seeds) as
metrics and the PNGs as artifacts of one run in experiment ``hybridtrain-simulate``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

STYLE = {"onprem_fifo": ("s", "tab:gray"), "cloud_on_demand": ("D", "tab:orange"), "greedy_spot": ("^", "tab:green"),
         "ours": ("*", "crimson")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(reports: Sequence, out: Path | str) -> list[Path]:  # reports: comparison.Report
    """Write the PNGs for ``reports`` under ``out``; returns their paths."""
    plt = _plt()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    by_regime: dict[str, list] = defaultdict(list)
    for r in reports:
        by_regime[r.deadlines].append(r)
    for regime, rs in by_regime.items():
        # cost vs load, mean over seeds
        loads = sorted({round(r.demand_ratio, 3) for r in rs})
        names = [m.name for m in rs[0].rows if m.name != "lower_bound"]
        fig, ax = plt.subplots(figsize=(8, 5))
        for name in names:
            ys = [np.mean([r.row(name).total_usd for r in rs if round(r.demand_ratio, 3) == x]) for x in loads]
            marker, color = STYLE.get(name, ("o", None))
            ax.plot(loads, ys, marker=marker, color=color, lw=2.5 if name == "ours" else 0.8,
                    alpha=1.0 if name in STYLE else 0.5, label=name)
        bound = [np.mean([r.bound.get("usd", r.row("lower_bound").total_usd) for r in rs
                          if round(r.demand_ratio, 3) == x]) for x in loads]
        ax.plot(loads, bound, "k--", label="capacity-aware bound (ours' misses)")
        ax.set_xlabel("demand ÷ on-prem GPUs")
        ax.set_ylabel("total cost, USD")
        ax.set_title(f"cost vs load ({regime} deadlines, mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        p = out / f"cost_vs_load_{regime}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
        seen = set()
        for r in rs:
            key = round(r.demand_ratio, 2)
            if key in seen:
                continue  # the first seed of each load
            seen.add(key)
            paths.append(_frontier_plot(plt, r, out / f"frontier_{regime}_{key:.2f}.png"))
            paths.append(_timeline_plot(plt, r, out / f"timeline_{regime}_{key:.2f}.png"))
    return paths


def _frontier_plot(plt, r, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"threshold_burst": "tab:blue", "spot_burst": "tab:green"}
    for fam, hull in r.frontiers.items():
        prefix = "threshold_" if fam == "threshold_burst" else "spot_burst_"
        pts = [m for m in r.rows if m.name.startswith(prefix)]
        ax.scatter([m.misses for m in pts], [m.total_usd for m in pts], s=14, color=colors.get(fam), alpha=0.6)
        ax.plot([h["misses"] for h in hull], [h["total_usd"] for h in hull], "-", color=colors.get(fam),
                label=f"{fam} frontier")
    for m in r.rows:
        if m.name in STYLE:
            marker, color = STYLE[m.name]
            ax.scatter(m.misses, m.total_usd, marker=marker, color=color, s=220 if m.name == "ours" else 50,
                       label=m.name, zorder=3)
    b = r.bound.get("usd")
    if b is not None and math.isfinite(b):
        ax.scatter(r.row("ours").misses, b, marker="_", s=400, color="k", label="bound at our misses", zorder=3)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("deadline misses (symlog)")
    ax.set_ylabel("total cost, USD")
    ax.set_title(f"{r.capacity} GPUs, demand {r.demand_ratio:.2f}×, {r.deadlines} deadlines, seed {r.seed}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _timeline_plot(plt, r, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for name, color in (("ours", "crimson"), ("threshold_0", "tab:blue")):
        tl = np.asarray(r.timeline.get(name) or [[0.0, 0.0, 0.0]])
        top.plot(tl[:, 0], tl[:, 1] / r.capacity, color=color, lw=0.8, label=name)
        bottom.plot(tl[:, 0], tl[:, 2], color=color, lw=0.8, label=name)
    top.set_ylabel("on-prem utilization")
    bottom.set_ylabel("cloud GPUs in use")
    bottom.set_xlabel("hours since the first arrival")
    top.set_title(f"{r.capacity} GPUs, demand {r.demand_ratio:.2f}×, {r.deadlines} deadlines")
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_metrics(reports: Sequence) -> dict[str, float]:
    """Mean and worst over seeds of each target ratio, per regime and load (MLflow metric names)."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in reports:
        groups[(r.deadlines, round(r.demand_ratio, 2))].append(r)
    out = {}
    for (regime, load), rs in groups.items():
        for key in ("cost_ratio", "cloud_ratio", "bound_ratio"):
            vals = [r.targets[key] for r in rs]
            out[f"{regime}_{load:.2f}x_{key}_mean"] = float(np.mean(vals))
            out[f"{regime}_{load:.2f}x_{key}_worst"] = float(np.max(vals))
        out[f"{regime}_{load:.2f}x_misses_ok_share"] = float(np.mean([r.targets["misses_ok"] for r in rs]))
    return out


def log_to_mlflow(reports: Sequence, paths: Sequence[Path], tracking_uri: str) -> str:
    """Log the summary metrics and ``paths`` to a new MLflow run; returns its run id."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("hybridtrain-simulate")
    with mlflow.start_run(run_name="simulate") as run:
        r0 = reports[0]
        mlflow.log_params({"regimes": ",".join(sorted({r.deadlines for r in reports})),
                           "loads": ",".join(sorted({f"{r.demand_ratio:.2f}" for r in reports})),
                           "seeds": ",".join(sorted({str(r.seed) for r in reports})),
                           **{f"spot_trace_{k}": Path(v).name for k, v in r0.spot_traces.items()}})
        mlflow.log_metrics(summary_metrics(reports))
        for p in paths:
            mlflow.log_artifact(str(p), artifact_path="plots" if p.suffix == ".png" else "data")
        return run.info.run_id
