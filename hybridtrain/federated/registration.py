"""FederatedRecord: a finished federated run in MLflow — per-round metrics, the global model, its lineage, ledger and promotion.

Per round the run logs the incoming global model's metrics on the participants' val splits
(``global_val_*``, step = the round that produced that model) and every site's own
(``site.<site>.<metric>``, step = round), plus ``participants``. The registered version goes
through ``stages.promote`` like a centralized one — the same gates, bundle, ledger and release —
and additionally carries every site's dataset DVC hashes, the rounds, each round's participants,
drop-outs and the SSH host each SSH site trained it on (``site_hosts``), the DP parameters and epsilon, and
with secure aggregation its scheme and the rounds that needed more than one attempt (tags ``hybridtrain.federated.*``). The ledger
charges each site's compute (one attempt per site and round; a dropped site's round as wasted)
and every update, global-model and statistics crossing.
"""

from __future__ import annotations

import json
import time

from hybridtrain import stages
from hybridtrain.federated.coordinator import FederationOutcome, global_model
from hybridtrain.federated.rounds import RoundRecord, RoundStore
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.lineage import Lineage, code_version
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace

PREFIX = "hybridtrain.federated."


def log_round(registry: Registry, run_id: str, record: RoundRecord) -> None:
    """One round's metrics in the lifecycle's MLflow run."""
    registry.log_metrics(run_id, {k: v for k, v in record.global_metrics.items() if k != "n"}, step=record.round - 1)
    site_metrics = {f"site.{s}.{k}": v for s, m in record.site_metrics.items() for k, v in m.items()
                    if not k.startswith("global_")}
    registry.log_metrics(run_id, {**site_metrics, "participants": float(len(record.participants)),
                                  "dropped": float(len(record.dropped))}, step=record.round)


def version_tags(spec: JobSpec, outcome: FederationOutcome, aggregation_site: str) -> dict[str, str]:
    """What a federated version carries beyond a centralized one's lineage."""
    fed = spec.training.federated
    tags = {"mode": "federated", "aggregation_site": aggregation_site, "aggregator": fed.aggregator,
            "rounds": str(outcome.state.completed), "local_epochs": str(fed.local_epochs),
            "sites": ",".join(sorted(outcome.state.prepared)),
            "participants": json.dumps({r.round: r.participants for r in outcome.state.rounds}),
            "dropped": json.dumps({r.round: r.dropped for r in outcome.state.rounds if r.dropped})[:4000],
            "site_hosts": json.dumps({r.round: r.site_hosts for r in outcome.state.rounds if r.site_hosts})[:4000],
            "update_bytes": str(sum(t.bytes for t in outcome.transfers))}
    if fed.aggregator == "fedprox":
        tags["mu"] = f"{fed.mu:g}"
    if fed.secure_aggregation:  # the aggregator saw only masked updates and their sum
        tags["secure_aggregation"] = "pairwise-masking-x25519-chacha20"
        tags["secure_attempts"] = json.dumps({r.round: [a.model_dump(mode="json") for a in r.attempts]
                                              for r in outcome.state.rounds if len(r.attempts) > 1})[:4000]
    for site, prepared in outcome.prepared().items():
        for ds in (prepared.prep.raw, prepared.prep.curated, prepared.anon.approved):
            tags[f"site.{site}.dataset.{ds.tier}.md5"] = ds.md5
    if fed.dp is not None:
        eps = {s: e for r in outcome.state.rounds for s, e in r.epsilon.items()}
        tags.update({"dp.noise_multiplier": f"{fed.dp.noise_multiplier:g}", "dp.max_grad_norm": f"{fed.dp.max_grad_norm:g}",
                     "dp.delta": f"{fed.dp.delta:g}", "dp.epsilon": json.dumps(eps)})
    return {PREFIX + k: v for k, v in tags.items()}


def register_and_promote(ws: Workspace, spec: JobSpec, run_id: str, run_key: str, outcome: FederationOutcome,
                         aggregation_site: str, signing_key_pem: str, actor: str, started: float,
                         flow_run_id: str | None = None, approved_by: str | None = None) -> stages.PromoteResult:
    """Log the final global model, then register and promote it through the unchanged gates."""
    from hybridtrain.governance.ledger import AttemptRecord

    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    state = outcome.state
    rs = RoundStore(stages.checkpoint_store(ws, ws.load_sites().get(aggregation_site)), spec.name, run_key)
    weights = rs.load_global(state.completed)
    model, featurizer = global_model(spec, state.featurizer, weights)
    ref = registry.log_model(run_id, model, featurizer.to_dict(), featurizer.n_features)
    final_sha = state.rounds[-1].global_sha256 if state.rounds else state.initial_sha256
    sites = ws.load_sites()
    attempts = []
    for r in state.rounds:
        for site, seconds in r.site_seconds.items():
            attempts.append(AttemptRecord(site=site, capacity_class=sites.get(site).capacity_class,
                                          gpus=spec.resources.gpus, seconds=seconds, outcome="succeeded"))
        for site in r.dropped:  # the capacity was held for the round, and nothing came of it
            attempts.append(AttemptRecord(site=site, capacity_class=sites.get(site).capacity_class,
                                          gpus=spec.resources.gpus, seconds=r.seconds, outcome="failed"))
    # One history entry per round, shaped like a centralized run's epochs (the learning curves plot ``epoch`` and
    # ``val_<metric>``): round r's entry holds the global model that went into round r, on its participants' val.
    history = [{"epoch": float(r.round - 1), "round": float(r.round), "participants": float(len(r.participants)),
                **{k: v for k, v in r.global_metrics.items() if k != "n"},
                **{f"global_{k}": v for k, v in r.global_metrics.items()}} for r in state.rounds]
    trained = stages.TrainOutput(
        site=aggregation_site, model_uri=ref.model_uri, model_id=ref.model_id, run_key=run_key, history=history,
        global_step=state.completed, epochs_completed=state.completed * spec.training.federated.local_epochs,
        resumed_from_step=outcome.resumed_after_round, checkpoints_written=state.completed + 1,
        last_checkpoint=rs.global_key(state.completed), device="federated", seconds=0.0,
        samples_per_second=0.0, checkpoint_sha256=final_sha, attempts=attempts)
    champion = [e.champion_metrics for e in outcome.evaluations.values()]
    champion_metrics = None
    if champion and all(c is not None for c in champion):
        from hybridtrain.federated.coordinator import weighted_metrics

        champion_metrics = weighted_metrics({s: e.champion_metrics for s, e in outcome.evaluations.items()},
                                            {s: int(e.metrics.get("n", 1)) for s, e in outcome.evaluations.items()})
    from hybridtrain.training import evaluation

    cmp = evaluation.compare(outcome.metrics, champion_metrics, spec.evaluation.primary_metric,
                             spec.evaluation.min_improvement)
    evaluated = stages.EvaluateResult(
        metrics=outcome.metrics, champion_version=None, champion_metrics=champion_metrics, better=cmp.better,
        delta=cmp.delta, reason=cmp.reason + " (row-weighted over the sites' test splits)",
        threshold_failures=evaluation.check_thresholds(outcome.metrics, spec.evaluation.thresholds),
        site=aggregation_site, seconds=sum(e.seconds for e in outcome.evaluations.values()))
    first = next(iter(outcome.prepared().values()))
    lineage = Lineage(job=spec.name, spec_hash=spec.spec_hash(), code_version=code_version(ws.root),
                      raw=first.prep.raw, curated=first.prep.curated, approved=first.anon.approved,
                      train_site=aggregation_site, bytes_synced=0, duration_s=time.perf_counter() - started,
                      flow_run_id=flow_run_id)
    registry.set_tags(run_id, version_tags(spec, outcome, aggregation_site))
    result = stages.promote(ws, spec, run_id, trained, sites.get(aggregation_site).capacity_class.value, lineage,
                            evaluated, outcome.transfers, signing_key_pem, actor, approved_by)
    registry.set_version_tags(spec.registry.model_name, result.version, version_tags(spec, outcome, aggregation_site))
    stages.close_run(ws, run_id, lineage, evaluated, result, outcome.transfers)
    return result
