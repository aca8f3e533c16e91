"""Gate: one check a model version must pass before the ``champion`` alias moves to it — evaluated, recorded, as code.

Each gate is a small function of ``GateInputs`` returning ``GateResult(name, passed, reason,
evidence)``, registered in ``GATES`` under the name a spec lists in ``promotion.gates``
(default: all, in this order):

- ``lineage`` — for raw, curated and approved, the dataset md5 tagged on the MLflow version
  (``hybridtrain.dataset.<tier>.md5``) equals the DVC version the run used and the bundle's
  ``datasets.json``; the bundle is for this model and version; its ``checkpoint.json`` SHA-256
  equals the final checkpoint recorded by training (and the version's
  ``hybridtrain.checkpoint.sha256`` tag, when set). A missing value on any side fails.
- ``signature`` — the bundle verifies under the trusted public key (``ModelBundle.verify``).
- ``thresholds`` — every ``evaluation.thresholds`` entry is met (``evaluation.check_thresholds``:
  log_loss a maximum, the rest minimums; a threshold on a metric not computed fails).
- ``not_worse`` — ``evaluation.compare`` semantics: the candidate must beat the champion's
  primary metric by *more than* ``min_improvement`` (a tie keeps the champion). No champion
  yet: passes. The champion's metrics must come from the same test split.
- ``cost`` — the version's ledger total (``CostLedger``) is at most ``promotion.max_cost_usd``;
  no limit set: passes; a limit but no ledger total: fails.
- ``rollback_target`` — once the alias moves, the current champion becomes ``previous``, the
  version ``hybridtrain rollback`` returns to; it must still have a signed bundle available
  (``rollback_versions``, when given). **The first champion passes**: there is nothing to roll
  back to and nothing to protect, so refusing would mean no first model could ever ship;
  rollback stays unavailable until a second version is promoted, and says so.
- ``approval`` — when ``promotion.require_approval`` is set, a person approved (``approved_by``,
  set when the paused flow run is resumed); otherwise passes.

``evaluate_gates`` runs every gate — it does not stop at the first failure — and returns a
``GateReport``; ``raise_if_failed()`` raises ``GateFailed`` naming the first failing gate and
listing all of them. The caller moves the alias only after that, so a failing gate leaves it
untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridtrain.errors import BundleRejected, GateFailed, HybridtrainError
from hybridtrain.governance.bundle import TIERS, ModelBundle
from hybridtrain.governance.signing_key import VerifyKey
from hybridtrain.plugins import PluginRegistry
from hybridtrain.specs.job import EvaluationSpec, JobSpec, PromotionSpec

COST_TOLERANCE_USD = 1e-9
CHECKPOINT_TAG = "hybridtrain.checkpoint.sha256"


def dataset_tag(tier: str) -> str:
    return f"hybridtrain.dataset.{tier}.md5"


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict, with the values it compared."""

    name: str
    passed: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "reason": self.reason, "evidence": self.evidence}


@dataclass(frozen=True)
class GateInputs:
    """Everything the gates read, gathered by the caller (pure inputs: no gate fetches anything)."""

    model: str
    version: str
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    promotion: PromotionSpec = field(default_factory=PromotionSpec)
    version_tags: Mapping[str, str] = field(default_factory=dict)
    datasets: Mapping[str, str] = field(default_factory=dict)
    """tier -> md5 of the DVC versions this run used (raw, curated, approved)."""
    checkpoint_sha256: str | None = None
    """SHA-256 of the final checkpoint as recorded by training (``CheckpointInfo.sha256``)."""
    bundle: ModelBundle | None = None
    trusted_key: VerifyKey | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    champion_version: str | None = None
    champion_metrics: Mapping[str, float] | None = None
    cost_usd: float | None = None
    """The version's ledger total (``LedgerLine.total_usd``)."""
    rollback_versions: Sequence[str] | None = None
    """Versions with a signed bundle available to re-release (None: not checked)."""
    approved_by: str | None = None

    @classmethod
    def for_spec(cls, spec: JobSpec, version: str, **values: Any) -> GateInputs:
        """Inputs with the model name, evaluation and promotion settings taken from ``spec``."""
        return cls(model=spec.registry.model_name, version=str(version), evaluation=spec.evaluation,
                   promotion=spec.promotion, **values)


Gate = Callable[[GateInputs], GateResult]
GATES: PluginRegistry[Gate] = PluginRegistry("promotion gate")


@dataclass(frozen=True)
class GateReport:
    """Every evaluated gate's result for one model version, in evaluation order."""

    model: str
    version: str
    results: tuple[GateResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]

    def result(self, name: str) -> GateResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"gate {name!r} was not evaluated; evaluated: {', '.join(r.name for r in self.results)}")

    def raise_if_failed(self) -> None:
        """``GateFailed`` naming the first failing gate, its reason, and every failing gate."""
        failures = self.failures
        if not failures:
            return
        first = failures[0]
        listing = "; ".join(f"{r.name}: {r.reason}" for r in failures)
        exc = GateFailed(first.name, f"{first.reason} — model {self.model} v{self.version} stays unpromoted; "
                                     f"{len(failures)} of {len(self.results)} gates failed ({listing})")
        exc.report = self  # type: ignore[attr-defined]  # the evidence travels with the error
        raise exc

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "passed": self.passed,
                "gates": [r.as_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateReport:
        """The report ``as_dict`` wrote (an audit ``gate`` record's inputs): what an interrupted promotion decided."""
        return cls(model=str(data["model"]), version=str(data["version"]), results=tuple(
            GateResult(str(g["name"]), bool(g["passed"]), str(g["reason"]), dict(g.get("evidence") or {}))
            for g in data["gates"]))

    def tags(self) -> dict[str, str]:
        """MLflow version tags: ``hybridtrain.gate.<name>`` = ``passed: …`` / ``failed: …``."""
        return {f"hybridtrain.gate.{r.name}": f"{'passed' if r.passed else 'failed'}: {r.reason}"[:5000]
                for r in self.results}

    def lines(self) -> list[str]:
        return [f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.reason}" for r in self.results]


def evaluate_gates(inputs: GateInputs, names: Sequence[str] | None = None) -> GateReport:
    """Run every gate in ``names`` (default: the spec's ``promotion.gates``, else all) and report each.

    A gate that raises a ``HybridtrainError`` or ``ValueError`` (say, a champion without the
    primary metric) counts as failed with that message; evaluation goes on with the next gate.
    """
    chosen = list(names if names is not None else (inputs.promotion.gates or GATES.names))
    gates = [(name, GATES.get(name)) for name in chosen]  # unknown names: SpecError before anything runs
    results = []
    for name, gate in gates:
        try:
            result = gate(inputs)
        except (HybridtrainError, ValueError) as exc:
            result = GateResult(name, False, f"could not be evaluated: {exc}")
        results.append(result)
    return GateReport(model=inputs.model, version=str(inputs.version), results=tuple(results))


# -- the gates ---------------------------------------------------------------------------------


@GATES.register("lineage")
def lineage(g: GateInputs) -> GateResult:
    problems: list[str] = []
    in_bundle: dict[str, str] = {}
    bundle_checkpoint: str | None = None
    readable = g.bundle is not None
    if g.bundle is None:
        problems.append("no bundle to compare with")
    else:
        try:
            in_bundle = {tier: d.md5 for tier, d in g.bundle.datasets().items()}
            bundle_checkpoint = g.bundle.checkpoint_sha256
            if (g.bundle.model, g.bundle.version) != (g.model, str(g.version)):
                problems.append(f"the bundle is for {g.bundle.model} v{g.bundle.version}, not {g.model} v{g.version}")
        except BundleRejected as exc:
            readable = False
            problems.append(f"the bundle cannot be read: {'; '.join(str(p) for p in exc.problems)}")
    tagged = {tier: g.version_tags.get(dataset_tag(tier)) for tier in TIERS}
    for tier in TIERS:
        dvc, tag, bun = g.datasets.get(tier), tagged[tier], in_bundle.get(tier)
        if dvc is None:
            problems.append(f"{tier}: no DVC version given")
            continue
        if tag is None:
            problems.append(f"{tier}: the MLflow version has no {dataset_tag(tier)} tag")
        elif tag != dvc:
            problems.append(f"{tier}: MLflow records {tag}, but the DVC version is {dvc}")
        if readable and bun is None:
            problems.append(f"{tier}: not in the bundle's datasets.json")
        elif bun is not None and bun != dvc:
            problems.append(f"{tier}: the bundle's datasets.json says {bun}, but the DVC version is {dvc}")
    recorded, tag_ckpt = g.checkpoint_sha256, g.version_tags.get(CHECKPOINT_TAG)
    if recorded is None:
        problems.append("checkpoint: training recorded no final checkpoint hash, so the weights cannot be tied to it")
    elif readable and bundle_checkpoint != recorded:
        problems.append(f"checkpoint: the bundle says {bundle_checkpoint}, training recorded {recorded}")
    if recorded is not None and tag_ckpt is not None and tag_ckpt != recorded:
        problems.append(f"checkpoint: the MLflow version tag says {tag_ckpt}, training recorded {recorded}")
    evidence = {"dvc": dict(g.datasets), "mlflow": tagged, "bundle": in_bundle,
                "checkpoint": {"recorded": recorded, "bundle": bundle_checkpoint, "mlflow": tag_ckpt}}
    if problems:
        return GateResult("lineage", False, "; ".join(problems), evidence)
    return GateResult("lineage", True, "dataset hashes agree in MLflow, DVC and the bundle for raw, curated and "
                                       f"approved; checkpoint {recorded[:12]}… matches", evidence)


@GATES.register("signature")
def signature(g: GateInputs) -> GateResult:
    if g.bundle is None:
        return GateResult("signature", False, "no bundle was built, so there is nothing signed to release")
    if g.trusted_key is None:
        return GateResult("signature", False, "no trusted public key was given to verify the bundle with")
    problems = g.bundle.problems(g.trusted_key)
    evidence = {"bundle": str(g.bundle.root), "trusted_key": g.trusted_key.key_id,
                "problems": [str(p) for p in problems]}
    if problems:
        return GateResult("signature", False, "the bundle does not verify: " + "; ".join(str(p) for p in problems),
                          evidence)
    evidence["manifest_sha256"] = g.bundle.manifest_sha256
    return GateResult("signature", True, f"bundle verifies under {g.trusted_key.key_id}", evidence)


@GATES.register("thresholds")
def thresholds(g: GateInputs) -> GateResult:
    from hybridtrain.training.evaluation import check_thresholds  # imports torch; spec validation imports this module

    limits = dict(g.evaluation.thresholds)
    evidence = {"thresholds": limits, "metrics": {k: g.metrics.get(k) for k in limits}}
    if not limits:
        return GateResult("thresholds", True, "no evaluation.thresholds set", evidence)
    failures = check_thresholds(g.metrics, limits)
    if failures:
        return GateResult("thresholds", False, "; ".join(failures), evidence)
    return GateResult("thresholds", True, "all met: " + ", ".join(
        f"{k} {g.metrics[k]:.4f} ({'≤' if k == 'log_loss' else '≥'} {v:g})" for k, v in limits.items()), evidence)


@GATES.register("not_worse")
def not_worse(g: GateInputs) -> GateResult:
    from hybridtrain.training.evaluation import compare  # lazy: heavy (torch, pandas)

    primary = g.evaluation.primary_metric
    evidence = {"primary_metric": primary, "min_improvement": g.evaluation.min_improvement,
                "candidate": g.metrics.get(primary), "champion_version": g.champion_version,
                "champion": (g.champion_metrics or {}).get(primary)}
    if g.champion_version is not None and str(g.champion_version) == str(g.version):
        return GateResult("not_worse", True, f"v{g.version} is already the champion", evidence)
    if g.champion_version is not None and g.champion_metrics is None:
        return GateResult("not_worse", False, f"champion v{g.champion_version} has no metrics on this test split; "
                                              "evaluate it on the same rows before comparing", evidence)
    result = compare(g.metrics, g.champion_metrics, primary, g.evaluation.min_improvement)
    evidence["delta"] = result.delta
    return GateResult("not_worse", result.better, result.reason, evidence)


@GATES.register("cost")
def cost(g: GateInputs) -> GateResult:
    limit = g.promotion.max_cost_usd
    evidence = {"cost_usd": g.cost_usd, "max_cost_usd": limit}
    if limit is None:
        shown = "unknown" if g.cost_usd is None else f"${g.cost_usd:,.4f}"
        return GateResult("cost", True, f"no promotion.max_cost_usd set (ledger total {shown})", evidence)
    if g.cost_usd is None or math.isnan(g.cost_usd):
        return GateResult("cost", False, f"no ledger total for v{g.version}: compute its cost ledger from the run "
                                         "records before promoting", evidence)
    if g.cost_usd <= limit + COST_TOLERANCE_USD:
        return GateResult("cost", True, f"ledger total ${g.cost_usd:,.4f} is within ${limit:,.2f}", evidence)
    return GateResult("cost", False, f"ledger total ${g.cost_usd:,.4f} exceeds promotion.max_cost_usd "
                                     f"${limit:,.2f}", evidence)


@GATES.register("rollback_target")
def rollback_target(g: GateInputs) -> GateResult:
    champion = None if g.champion_version is None else str(g.champion_version)
    held = None if g.rollback_versions is None else [str(v) for v in g.rollback_versions]
    evidence = {"champion_version": champion, "rollback_versions": held}
    if champion is None:
        return GateResult("rollback_target", True, "first champion: there is no earlier version to roll back to; "
                                                   "rollback becomes available once a second version is promoted",
                          evidence)
    if champion == str(g.version):
        return GateResult("rollback_target", True, f"v{g.version} is already the champion; the rollback target "
                                                   "stays as it is", evidence)
    if held is not None and champion not in held:
        return GateResult("rollback_target", False, f"the current champion v{champion} would become the rollback "
                                                    "target, but no signed bundle of it is available to re-release "
                                                    f"(available: {', '.join(held) or 'none'}); archive its bundle "
                                                    "first", evidence)
    return GateResult("rollback_target", True, f"rollback target: v{champion} (the current champion becomes "
                                               "`previous`)", evidence)


@GATES.register("approval")
def approval(g: GateInputs) -> GateResult:
    evidence = {"required": g.promotion.require_approval, "approved_by": g.approved_by}
    if not g.promotion.require_approval:
        return GateResult("approval", True, "not required by promotion.require_approval", evidence)
    if g.approved_by:
        return GateResult("approval", True, f"approved by {g.approved_by}", evidence)
    return GateResult("approval", False, "promotion.require_approval is set and nobody has approved; resume the "
                                         "paused flow run to approve", evidence)
