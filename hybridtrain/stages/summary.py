"""RunSummary: what one lifecycle execution did — stages and sites, dataset hashes, metrics, model, bytes moved."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from hybridtrain.stages.placing import PlacementOutcome
from hybridtrain.stages.results import (
    AnonymizeResult,
    EvaluateResult,
    PreprocessResult,
    PromoteResult,
    SyncResult,
    TrainOutput,
)


class StageRow(BaseModel):
    stage: str
    site: str
    seconds: float
    detail: str


class RunSummary(BaseModel):
    job: str
    flow_run_id: str | None
    mlflow_run_id: str
    stages: list[StageRow]
    datasets: dict[str, str]
    metrics: dict[str, float]
    champion_metrics: dict[str, float] | None
    model_name: str
    model_version: str
    promoted: bool
    champion_version: str | None
    previous_version: str | None
    reasons: list[str]
    gates: dict[str, str]
    cost_usd: float
    released_to: list[str]
    bytes_synced: int
    sync_route: str | None
    egress_usd: float
    transfers: list[dict[str, Any]]
    placement: dict[str, Any]
    training: dict[str, Any]
    pictures: dict[str, str] = {}
    history: list[dict[str, float]] = []

    @classmethod
    def build(
        cls,
        *,
        job: str,
        flow_run_id: str | None,
        mlflow_run_id: str,
        prep: PreprocessResult,
        anon: AnonymizeResult,
        placement: PlacementOutcome,
        synced: SyncResult,
        trained: TrainOutput,
        evaluated: EvaluateResult,
        promoted: PromoteResult,
    ) -> RunSummary:
        t = synced.transfer
        moves = ([t] if t else []) + list(trained.transfers)
        rep = prep.report
        stages = [
            StageRow(stage="preprocess", site=prep.site, seconds=prep.seconds,
                     detail=f"{rep.get('rows_in')} rows in, {rep.get('rows_out')} curated "
                            f"({rep.get('duplicates_removed')} duplicates, {rep.get('null_label_removed')} "
                            "without label removed)"),
            StageRow(stage="anonymize", site=anon.site, seconds=anon.seconds,
                     detail=f"{anon.report.get('rows_out')} rows approved, k={anon.report.get('k_achieved')}, "
                            f"{anon.report.get('rows_suppressed')} suppressed, leak scan clean"),
            StageRow(stage="place", site=placement.site, seconds=0.0,
                     detail=f"{placement.capacity_class} via {placement.strategy}, est. ${placement.cost_usd:.2f}, "
                            + ("meets the deadline" if placement.meets_deadline else "misses the deadline")
                            + (f"; {len(placement.rejected)} candidate(s) rejected" if placement.rejected else "")),
            StageRow(stage="sync", site=f"{t.source} -> {t.destination}" if t else synced.site,
                     seconds=synced.seconds,
                     detail=f"{t.bytes:,} bytes in {t.files} files" if t else "data already at the site"),
            StageRow(stage="train", site=trained.site, seconds=trained.seconds,
                     detail=f"{trained.epochs_completed} epochs, {trained.global_step} steps, "
                            f"{trained.checkpoints_written} checkpoints"
                            + (f", resumed from step {trained.resumed_from_step}"
                               if trained.resumed_from_step is not None else "")
                            + _earlier_attempts(trained.attempts)),
            StageRow(stage="evaluate", site=evaluated.site, seconds=evaluated.seconds, detail=evaluated.reason),
            StageRow(stage="promote", site=prep.site, seconds=promoted.seconds,
                     detail=("champion -> v" + promoted.version) if promoted.promoted
                     else f"v{promoted.version} registered, champion stays "
                          f"{'v' + promoted.champion_version if promoted.champion_version else 'unset'}"),
        ]
        return cls(
            job=job,
            flow_run_id=flow_run_id,
            mlflow_run_id=mlflow_run_id,
            stages=stages,
            datasets={"raw": prep.raw.md5, "curated": prep.curated.md5, "approved": anon.approved.md5},
            metrics=evaluated.metrics,
            champion_metrics=evaluated.champion_metrics,
            model_name=promoted.model_name,
            model_version=promoted.version,
            promoted=promoted.promoted,
            champion_version=promoted.champion_version,
            previous_version=promoted.previous_version,
            reasons=promoted.reasons,
            gates=promoted.gates,
            cost_usd=promoted.cost_usd,
            released_to=promoted.released_to,
            bytes_synced=t.bytes if t else 0,
            sync_route=f"{t.source}->{t.destination}" if t else None,
            egress_usd=sum(m.cost_usd for m in moves),
            transfers=[m.as_row() for m in moves],
            placement={"site": placement.site, "capacity_class": placement.capacity_class,
                       "strategy": placement.strategy, "est_cost_usd": round(placement.cost_usd, 4),
                       "meets_deadline": placement.meets_deadline, "reasons": placement.reasons},
            training={"steps": trained.global_step, "epochs": trained.epochs_completed,
                      "resumed_from_step": trained.resumed_from_step, "device": trained.device,
                      "samples_per_second": round(trained.samples_per_second, 1),
                      "gpu_seconds": round(trained.gpu_seconds, 1),
                      "model_uri": trained.model_uri},
            pictures=promoted.pictures,
            history=trained.history,
        )

    def render(self, registry: Any) -> str:
        """``to_markdown`` with the run's pictures read back from MLflow and embedded (data URIs, so
        they show in any UI without a route to the artifact store), plus the MLflow run link."""
        from hybridtrain.reporting.plots import data_uri

        images = {path: data_uri(registry.read_bytes(self.mlflow_run_id, path)) for path in self.pictures.values()}
        return self.to_markdown(images, registry.artifact_page(self.mlflow_run_id))

    def to_markdown(self, images: dict[str, str] | None = None, mlflow_page: str | None = None) -> str:
        """The summary as markdown; ``images`` (artifact path -> image URL or data URI) adds the
        run's pictures under the tables, ``mlflow_page`` a link to the run in MLflow."""
        lines = [f"# Lifecycle of `{self.job}`", ""]
        if self.history:
            last = self.history[-1]
            lines += ["Training: " + f"{len(self.history)} epochs; last epoch loss {last.get('train_loss', float('nan')):.4f}"
                      + "".join(f", {k} {v:.4f}" for k, v in last.items() if k in ("val_auc", "val_accuracy")), ""]
        lines += ["| stage | site | seconds | detail |", "|---|---|---|---|"]
        lines += [f"| {s.stage} | {s.site} | {s.seconds:.1f} | {s.detail} |" for s in self.stages]
        lines += ["", "## Datasets (DVC md5)", ""]
        lines += [f"- **{tier}**: `{md5}`" for tier, md5 in self.datasets.items()]
        lines += ["", "## Test metrics", "", "| metric | candidate | champion |", "|---|---|---|"]
        for k, v in self.metrics.items():
            c = (self.champion_metrics or {}).get(k)
            lines.append(f"| {k} | {v:.4f} | {'' if c is None else f'{c:.4f}'} |")
        lines += ["", "## Model", "",
                  f"- registered **{self.model_name} v{self.model_version}**",
                  f"- champion: **{'v' + self.champion_version if self.champion_version else 'none'}**"
                  + (" (moved by this run)" if self.promoted else " (unchanged)"),
                  *[f"- {r}" for r in self.reasons],
                  f"- cost of this version (ledger): ${self.cost_usd:.4f}",
                  f"- released to: {', '.join(self.released_to) or 'nothing (not promoted)'}",
                  "", "## Promotion gates", "", "| gate | verdict |", "|---|---|",
                  *[f"| {g} | {v} |" for g, v in self.gates.items()],
                  "", f"Bytes synced: {self.bytes_synced:,} ({self.sync_route or 'no sync'}); "
                      f"egress of all crossings ${self.egress_usd:.4f}. MLflow run `{self.mlflow_run_id}`."]
        if self.transfers:
            lines += ["", "## Site crossings", "", "| from | to | what | bytes | seconds | cost USD |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {t['source']} | {t['destination']} | {t['what']} | {t['bytes']:,} | {t['seconds']} | "
                      f"{t['cost_usd']} |" for t in self.transfers]
        shown = [(title, images[path]) for title, path in self.pictures.items() if images and path in images]
        if shown:
            lines += ["", "## Pictures", ""]
            for title, src in shown:
                lines += [f"**{title}**", "", f"![{title}]({src})", ""]
        if mlflow_page:
            lines += ["", f"[Open the MLflow run (metrics, plots, lineage)]({mlflow_page})"]
        return "\n".join(lines)


def _earlier_attempts(attempts: list) -> str:
    """", after 1 preempted and 1 failed attempt(s)" for the earlier attempts of a run ('' when none)."""
    outcomes = [a.get("outcome") if isinstance(a, dict) else getattr(a, "outcome", None) for a in attempts]
    counts = {str(o): outcomes.count(o) for o in dict.fromkeys(outcomes)}
    return (", after " + " and ".join(f"{n} {o}" for o, n in counts.items()) + " attempt(s)") if counts else ""
