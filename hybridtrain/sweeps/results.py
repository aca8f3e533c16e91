"""SweepResults: the trials of one sweep as they end — the table users read, the cost in the ledger, the plots.

Each finished trial is a ``TrialRow`` (trial, values, objective, state, site, capacity class,
cost). The cost of a trial is its attempts priced by the ledger (``CostLedger``): GPUs held ×
hours × the site's price for the capacity class; a preempted or failed attempt is wasted money, a
pruned trial's epochs are paid like any other. ``ledger_attempts`` hands every trial's attempts to
the promoted version's run record, so the version's ledger line (and the ``cost`` gate) carries
the whole search that produced it, not only the winning trial.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from hybridtrain.governance.ledger import AttemptOutcome, AttemptRecord, CostLedger, RunRecord
from hybridtrain.specs.sites import SitesCatalog


class TrialRow(BaseModel):
    """One line of the sweep's table."""

    trial: int
    params: dict[str, Any]
    value: float | None
    state: str = Field(description="complete, pruned or failed.")
    site: str
    capacity_class: str
    cost_usd: float
    epochs: int = 0
    seconds: float = Field(0.0, description="Wall seconds of its attempts, as the sweep saw them (dispatch included).")
    train_seconds: float = Field(0.0, description="Seconds its last attempt trained (model upload included).")
    attempts: list[AttemptRecord] = Field(default_factory=list)
    message: str = ""

    def as_row(self) -> dict[str, str]:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
        return {"trial": str(self.trial), "params": params,
                "metric": "" if self.value is None else f"{self.value:.4f}", "state": self.state,
                "epochs": str(self.epochs), "site": self.site, "capacity class": self.capacity_class,
                "cost (USD)": f"{self.cost_usd:.4f}", "seconds": f"{self.seconds:.1f}"}


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def attempt_cost(sites: SitesCatalog, attempts: list[AttemptRecord], job: str) -> float:
    from datetime import UTC, datetime

    if not attempts:
        return 0.0
    record = RunRecord(model=job, run_id=job, job=job, finished_at=datetime.now(UTC), attempts=attempts)
    return CostLedger(sites).cost_of(record).total


class SweepResults(BaseModel):
    """Every finished trial of a sweep, in the order they ended."""

    study: str
    metric: str
    direction: str
    rows: list[TrialRow] = Field(default_factory=list)

    def add(self, row: TrialRow) -> None:
        self.rows.append(row)

    def table(self) -> list[dict[str, str]]:
        return [r.as_row() for r in sorted(self.rows, key=lambda r: r.trial)]

    def best(self) -> TrialRow | None:
        done = [r for r in self.rows if r.state == "complete" and r.value is not None and math.isfinite(r.value)]
        if not done:
            return None
        sign = 1.0 if self.direction == "maximize" else -1.0
        return max(done, key=lambda r: (sign * r.value, -r.trial))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    @property
    def cost_usd(self) -> float:
        return math.fsum(r.cost_usd for r in self.rows)

    @property
    def epochs(self) -> int:
        return sum(r.epochs for r in self.rows)

    def ledger_attempts(self, winner: int | None = None) -> list[AttemptRecord]:
        """Every trial's attempts except the winner's last (succeeded) one, which the run record adds itself."""
        out: list[AttemptRecord] = []
        for r in self.rows:
            attempts = list(r.attempts)
            if r.trial == winner and attempts and attempts[-1].outcome is AttemptOutcome.succeeded:
                attempts = attempts[:-1]
            out += attempts
        return out

    def run_record(self, model: str, run_id: str, job: str) -> RunRecord:
        """The sweep's ledger record when no version was registered: every trial's attempts, ``unversioned``."""
        from datetime import UTC, datetime

        return RunRecord(model=model, version=None, run_id=run_id, job=job, finished_at=datetime.now(UTC),
                         attempts=self.ledger_attempts(None))

    def to_markdown(self, links: dict[str, str] | None = None) -> str:
        best = self.best()
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts().items()))
        lines = [f"# Sweep {self.study}", "",
                 f"{len(self.rows)} trials ended ({counts}); {self.epochs} trial-epochs; cost ${self.cost_usd:.4f}.",
                 f"Objective: {self.direction} {self.metric}."]
        if best is not None:
            lines.append(f"Best: trial {best.trial}, {self.metric} {best.value:.4f} "
                         f"({', '.join(f'{k}={_fmt(v)}' for k, v in best.params.items())}).")
        for name, url in (links or {}).items():
            lines.append(f"- [{name}]({url})")
        return "\n".join(lines)


def write_plots(study: Any, directory: Path) -> list[Path]:
    """Optuna's optimization history and parameter importances as PNGs (matplotlib, Agg, no global state).

    The importances need two complete trials with different values; before that only the history is drawn.
    """
    import warnings

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    plots = [("optimization_history.png", ovm.plot_optimization_history)]
    if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        plots.append(("param_importances.png", ovm.plot_param_importances))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib backend experimental
        for name, plot in plots:
            ax = plot(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(8, 5)
            fig.tight_layout()
            path = directory / name
            fig.savefig(path, dpi=100)
            plt.close(fig)
            out.append(path)
    return out
