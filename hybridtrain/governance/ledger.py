"""CostLedger: what each model version cost — compute by capacity, wasted attempts, data moved, storage — from the real run records.

Input: one ``RunRecord`` per lifecycle run (the flows write it as JSON to the run's
``ledger/run_record.json`` artifact and tag the run ``hybridtrain.ledger.model``). A run holds
its training *attempts* (each: site, capacity class, GPUs held, wall seconds, outcome), every
``TransferRecord`` it caused, and the bytes it left in storage.

Formulas (USD; ``h = seconds / 3600``):

- attempt compute = ``gpus × h × price``, where price is the one the attempt recorded as paid
  (``price_per_gpu_hour``) or else the site's catalog price for its capacity class:
  ``fixed`` → ``Site.gpu_hour_price`` (on-prem: capex and opex over the lifetime at the
  achieved utilization, plus power), ``burst`` → the on-demand ``price_per_gpu_hour``,
  ``opportunistic`` → ``spot_price_per_gpu_hour``. ``gpus`` is what the attempt *held* (billed
  whether or not the code used them); a CPU-only attempt (0 GPUs) costs 0 here.
- a succeeded attempt's compute goes to ``onprem`` (fixed), ``on_demand`` (burst) or ``spot``
  (opportunistic); a **preempted or failed** attempt's compute goes, in full, to ``wasted`` —
  what was paid for attempts that did not finish (a checkpoint may have saved part of that work
  for the next attempt; the ledger still counts what was paid, not what was redone).
- ``transfer`` = the sum of the run's ``TransferRecord.cost_usd`` (egress priced by the sending
  site: dataset syncs, model uploads, bundle copies).
- ``storage`` = ``bytes / 1e9 × price_per_GB_month × months`` per stored item (checkpoints,
  model artifacts, bundles), the price per site from ``storage_usd_per_gb_month`` (default
  $0.023, S3 Standard's list price) and ``months`` the retention the record states (default 1).
- ``total`` = onprem + on_demand + spot + wasted + transfer + storage.

A version's line sums its runs; runs that registered no version are the ``unversioned`` line.
The model's totals are summed straight from the runs (``math.fsum``, exactly rounded), so they
equal the sum of the run records. ``render_table`` prints the ledger with rich; ``write_chart``
draws the cost per version over time as a PNG (matplotlib, Agg canvas, no global state).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.sites import CapacityClass, SitesCatalog

if TYPE_CHECKING:
    from rich.table import Table

RUN_RECORD_ARTIFACT = "ledger/run_record.json"
RUN_RECORD_TAG = "hybridtrain.ledger.model"
DEFAULT_STORAGE_USD_PER_GB_MONTH = 0.023
GB = 1_000_000_000
UNVERSIONED = "unversioned"
CATEGORIES = ("onprem", "on_demand", "spot", "wasted", "transfer", "storage")
_CLASS_CATEGORY = {CapacityClass.fixed: "onprem", CapacityClass.burst: "on_demand",
                   CapacityClass.opportunistic: "spot"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttemptOutcome(StrEnum):
    succeeded = "succeeded"
    preempted = "preempted"
    failed = "failed"


class AttemptRecord(Strict):
    """One stretch of training on one site's capacity, from start to its end (finished, preempted or failed)."""

    site: str = Field(description="Site the attempt ran at (sites catalog name).")
    capacity_class: CapacityClass = Field(description="fixed (owned), burst (on-demand) or opportunistic (spot).")
    gpus: int = Field(ge=0, description="GPUs held by the attempt (billed whether or not the code used them).")
    seconds: float = Field(ge=0, allow_inf_nan=False, description="Wall seconds the capacity was held.")
    outcome: AttemptOutcome
    price_per_gpu_hour: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="Price actually paid per GPU-hour (e.g. the spot price then); default: the catalog price.",
    )
    started_at: datetime | None = None


class StorageRecord(Strict):
    """Bytes a run left in a site's storage."""

    kind: Literal["checkpoint", "artifact", "bundle", "dataset"]
    site: str
    bytes: int = Field(ge=0)
    months: float = Field(1.0, ge=0, allow_inf_nan=False, description="Retention months charged.")


class RunRecord(Strict):
    """What one lifecycle run consumed: the flows produce it, store it in MLflow, and the ledger reads it."""

    format: Literal[1] = 1
    model: str = Field(description="Registered model name.")
    version: str | None = Field(None, description="Model version the run registered; None if it registered none.")
    run_id: str = Field(description="MLflow run id of the lifecycle run.")
    job: str | None = None
    finished_at: datetime
    attempts: list[AttemptRecord] = Field(default_factory=list)
    transfers: list[TransferRecord] = Field(default_factory=list)
    storage: list[StorageRecord] = Field(default_factory=list)


class CostBreakdown(Strict):
    """USD by category, and the GPU-hours behind compute."""

    onprem: float = 0.0
    on_demand: float = 0.0
    spot: float = 0.0
    wasted: float = 0.0
    transfer: float = 0.0
    storage: float = 0.0
    gpu_hours: float = 0.0
    wasted_gpu_hours: float = 0.0

    @property
    def total(self) -> float:
        return math.fsum(getattr(self, c) for c in CATEGORIES)

    @classmethod
    def sum(cls, parts: Iterable[CostBreakdown]) -> CostBreakdown:
        parts = list(parts)
        fields = (*CATEGORIES, "gpu_hours", "wasted_gpu_hours")
        return cls(**{f: math.fsum(getattr(p, f) for p in parts) for f in fields})


class LedgerLine(Strict):
    """One model version's cost (or the ``unversioned`` runs')."""

    version: str
    runs: int
    first_at: datetime
    last_at: datetime
    cost: CostBreakdown

    @property
    def total_usd(self) -> float:
        return self.cost.total

    def tags(self) -> dict[str, str]:
        """MLflow model-version tags (``hybridtrain.cost.*``), what the cost gate and ``ledger`` read back."""
        c = self.cost
        out = {f"hybridtrain.cost.{k}_usd": f"{getattr(c, k):.6f}" for k in CATEGORIES}
        out.update({"hybridtrain.cost.total_usd": f"{c.total:.6f}", "hybridtrain.cost.gpu_hours": f"{c.gpu_hours:.6f}",
                    "hybridtrain.cost.wasted_gpu_hours": f"{c.wasted_gpu_hours:.6f}",
                    "hybridtrain.cost.runs": str(self.runs)})
        return out


class ModelLedger(Strict):
    """Every version's line, in time order, and the model's totals."""

    model: str
    lines: list[LedgerLine]
    totals: CostBreakdown
    runs: int
    storage_usd_per_gb_month: dict[str, float] | float

    def line(self, version: str) -> LedgerLine:
        for line in self.lines:
            if line.version == str(version):
                return line
        raise KeyError(f"no runs of {self.model} v{version} in the ledger; versions: "
                       f"{', '.join(line.version for line in self.lines) or 'none'}")


class CostLedger:
    """Prices run records with a sites catalog (compute, egress) and a storage price."""

    def __init__(self, sites: SitesCatalog,
                 storage_usd_per_gb_month: float | Mapping[str, float] = DEFAULT_STORAGE_USD_PER_GB_MONTH):
        self.sites = sites
        if isinstance(storage_usd_per_gb_month, Mapping):
            self._storage: float | dict[str, float] = {k: _price(v, f"storage price of {k}")
                                                       for k, v in storage_usd_per_gb_month.items()}
        else:
            self._storage = _price(storage_usd_per_gb_month, "storage price")

    def gpu_price(self, attempt: AttemptRecord, run_id: str = "") -> float:
        """USD per GPU-hour the attempt paid (see the module docstring)."""
        if attempt.price_per_gpu_hour is not None:
            return attempt.price_per_gpu_hour
        site = self._site(attempt.site, run_id)
        if attempt.capacity_class is CapacityClass.opportunistic:
            if site.spot_price_per_gpu_hour is None:
                raise SpecError("sites catalog", [Problem(
                    f"sites.{site.name}.spot_price_per_gpu_hour",
                    f"run {run_id or '?'} used spot capacity at {site.name}, which has no spot price; add it or "
                    "record price_per_gpu_hour in the attempt")])
            return site.spot_price_per_gpu_hour
        if attempt.capacity_class is CapacityClass.burst and site.price_per_gpu_hour is not None:
            return site.price_per_gpu_hour
        return site.gpu_hour_price

    def _site(self, name: str, run_id: str):
        if name not in self.sites.names:
            raise SpecError("sites catalog", [Problem(
                "sites", f"run {run_id or '?'} ran at site {name!r}, which the catalog no longer lists, so its "
                         f"prices are unknown (known: {', '.join(self.sites.names)}); restore the site or record "
                         "price_per_gpu_hour in the run's attempts")])
        return self.sites.get(name)

    def storage_price(self, site: str) -> float:
        if isinstance(self._storage, dict):
            if site not in self._storage:
                raise SpecError("storage prices", [Problem(site, "no storage price per GB-month for this site; "
                                                                 f"known: {', '.join(sorted(self._storage))}")])
            return self._storage[site]
        return self._storage

    def cost_of(self, record: RunRecord) -> CostBreakdown:
        """One run's cost by category."""
        parts: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        gpu_hours: list[float] = []
        wasted_hours: list[float] = []
        for a in record.attempts:
            hours = a.gpus * a.seconds / 3600
            usd = hours * self.gpu_price(a, record.run_id)
            gpu_hours.append(hours)
            if a.outcome is AttemptOutcome.succeeded:
                parts[_CLASS_CATEGORY[a.capacity_class]].append(usd)
            else:
                parts["wasted"].append(usd)
                wasted_hours.append(hours)
        parts["transfer"] = [t.cost_usd for t in record.transfers]
        parts["storage"] = [s.bytes / GB * self.storage_price(s.site) * s.months for s in record.storage]
        return CostBreakdown(**{c: math.fsum(v) for c, v in parts.items()}, gpu_hours=math.fsum(gpu_hours),
                             wasted_gpu_hours=math.fsum(wasted_hours))

    def for_model(self, records: Iterable[RunRecord], model: str | None = None) -> ModelLedger:
        """Per-version lines (time order) and totals for one model's run records.

        ``model``: keep only its records; without it, every record must be of the same model.
        """
        records = list(records)
        names = sorted({r.model for r in records})
        if model is None:
            if len(names) > 1:
                raise ValueError(f"run records of several models ({', '.join(names)}); say which model")
            model = names[0] if names else ""
        records = [r for r in records if r.model == model]
        costed = [(r, self.cost_of(r)) for r in records]
        by_version: dict[str, list[tuple[RunRecord, CostBreakdown]]] = {}
        for r, c in costed:
            by_version.setdefault(r.version if r.version is not None else UNVERSIONED, []).append((r, c))
        lines = [
            LedgerLine(version=v, runs=len(items), first_at=min(r.finished_at for r, _ in items),
                       last_at=max(r.finished_at for r, _ in items), cost=CostBreakdown.sum(c for _, c in items))
            for v, items in by_version.items()
        ]
        lines.sort(key=lambda line: (line.last_at, line.version == UNVERSIONED, line.version))
        return ModelLedger(model=model, lines=lines, totals=CostBreakdown.sum(c for _, c in costed), runs=len(records),
                           storage_usd_per_gb_month=self._storage)


def _price(value: float, what: str) -> float:
    """A price the ledger may multiply by: finite and not negative (a NaN or negative price would be written into
    the cost tags the cost gate reads)."""
    price = float(value)
    if not math.isfinite(price) or price < 0:
        raise SpecError("storage prices", [Problem(what, f"{price:g} USD per GB-month: give a finite price of 0 or "
                                                         "more (e.g. 0.023)")])
    return price


def render_table(ledger: ModelLedger) -> Table:
    """The ledger as a rich table: one row per version, then the totals."""

    table = Table(title=f"Cost ledger of {ledger.model} (USD)", title_justify="left")
    for col in ("version", "runs", "last run (UTC)", "GPU-h", "on-prem", "on-demand", "spot", "wasted", "transfer",
                "storage", "total"):
        table.add_column(col, justify="left" if col in ("version", "last run (UTC)") else "right")

    def row(label: str, runs: int, when: str, c: CostBreakdown, **style: str) -> None:
        table.add_row(label, str(runs), when, f"{c.gpu_hours:,.2f}", *(f"{getattr(c, k):,.4f}" for k in CATEGORIES),
                      f"{c.total:,.4f}", **style)

    for line in ledger.lines:
        row(line.version, line.runs, f"{line.last_at:%Y-%m-%d %H:%M}", line.cost)
    table.add_section()
    row("total", ledger.runs, "", ledger.totals, style="bold")
    return table


def write_chart(ledger: ModelLedger, path: Path | str) -> Path:
    """A PNG of the cost of each version, stacked by category, versions in time order; written to a temporary file
    beside ``path`` and renamed into place, so a failure leaves no half-written chart."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: heavy (matplotlib)
    from matplotlib.figure import Figure  # lazy: heavy (matplotlib)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(max(6.0, 0.9 * len(ledger.lines) + 3), 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(ledger.lines)))
    bottoms = [0.0] * len(xs)
    colors = {"onprem": "#4c72b0", "on_demand": "#dd8452", "spot": "#55a868", "wasted": "#c44e52",
              "transfer": "#8172b3", "storage": "#937860"}
    for cat in CATEGORIES:
        values = [getattr(line.cost, cat) for line in ledger.lines]
        if any(values):
            ax.bar(xs, values, bottom=bottoms, label=cat.replace("_", "-"), color=colors[cat], width=0.6)
            bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, line in zip(xs, ledger.lines):
        ax.annotate(f"${line.total_usd:,.2f}", (x, bottoms[x]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, [f"v{line.version}\n{line.last_at:%Y-%m-%d}" if line.version != UNVERSIONED
                       else f"{UNVERSIONED}\n{line.last_at:%Y-%m-%d}" for line in ledger.lines], fontsize=8)
    ax.set_ylabel("USD")
    ax.set_title(f"Cost per version of {ledger.model} (total ${ledger.totals.total:,.2f})")
    if ledger.lines:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)  # a chart to share (mkstemp makes it 0600)
            fig.savefig(fh, format="png")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
