"""Federated flows: each round's site steps as flow runs in the data sites' work pools, the aggregation at the control plane.

A federated lifecycle (``flows.lifecycle`` hands over when ``plan`` picks federated) prepares
every data site's part where it lies (``federated-prepare``: preprocess, anonymize, leak scan,
feature statistics), then runs ``training.federated.rounds`` rounds: one ``federated-round``
flow run per data site in that site's pool (local epochs from the global weights, the update
sent through ``ModelMover``), aggregated by ``hybridtrain.federated.coordinator`` here; last,
``federated-evaluate`` measures the global model on each site's test split, and the version is
registered and promoted through the usual gates. A site's step that fails, has not finished
``round_timeout_s`` after it was submitted, or whose pool has had no live worker for
``site_lost_s`` (the site went down, its worker and the step's process with it) drops that site
from the step — its flow run is cancelled, so a worker that comes back does not run a stale
round — and the site is asked again next round. An aggregator that is run again with the same run key (after
it crashed) resumes after the last committed round and adopts the site steps its predecessor had submitted
that are still scheduled, running or done, instead of training them again. Why not Flower: see README
("Federated training").
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from prefect import Flow, flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.states import Cancelled
from pydantic import BaseModel, Field

import flows  # noqa: F401  - a worker loads this file by its path, not as a module of flows: its fixes first
from blocks.register import release_key_pem
from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import HybridtrainError
from hybridtrain.federated import site as steps
from hybridtrain.federated.coordinator import FederationOutcome, run_federation
from hybridtrain.federated.planning import ModeDecision
from hybridtrain.federated.registration import log_round, register_and_promote
from hybridtrain.federated.secure_aggregation import SecureRound
from hybridtrain.specs.federation import MAX_ROUNDS
from hybridtrain.specs.job import JobSpec
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace
from orchestration.context import run_workspace
from orchestration.dispatch import (
    Mode,
    deployment_name,
    has_deployment,
    heartbeat_lags,
    retry_transient,
    transient_api_error,
)
from tasks.federated import evaluate_site, prepare_site, train_round

R = TypeVar("R", bound=BaseModel)
POLL_S = 1.0
POLL_MAX_S = 5.0
#: How often the sites' pools' worker heartbeats are read (once for all sites' waits).
LIVENESS_REFRESH_S = 5.0
CANCEL_TRIES_S = 60.0
#: Under ``hybridtrain`` so that its lines reach the run's log in Prefect (``PREFECT_LOGGING_EXTRA_LOGGERS``).
log = logging.getLogger("hybridtrain.federated.pools")
#: A round number, as the steps' forms take it (``training.federated.rounds`` is at most ``MAX_ROUNDS``); the bound
#: is in the parameter schema, so a run outside it is never created (see ``flows``).
Round = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]


def _checked_workspace(workspace: str | None, run_id: str, run_key: str) -> Workspace:
    """The step's workspace, once its ``run_key`` and ``run_id`` are checked: a step's result goes back through the
    lifecycle's MLflow run, so with a wrong id it would prepare or train and fail only then."""
    stages.check_run_key(run_key)
    ws = run_workspace(workspace)
    stages.check_run(ws, run_id)
    return ws


@flow(name="federated-prepare", flow_run_name="fed-prepare-{site}", log_prints=True)
def federated_prepare(spec: JobSpec, site: str, run_id: str, run_key: str, aggregation_site: str, tag: str,
                      workspace: str | None = None) -> steps.SitePrepared:
    """Raw → approved at ``site`` (its own part; raw never leaves), then its feature statistics out."""
    ws = _checked_workspace(workspace, run_id, run_key)
    out = prepare_site(ws, spec, site, run_key, aggregation_site)
    stages.save_result(ws, run_id, tag, out)
    return out


def _round_run_name() -> str:
    """``fed-round-<rnd>-<site>``; a secure round's later attempt ``fed-round-<rnd>-a<attempt>-<site>``, so the UI
    tells the re-masking steps of the survivors from the round's first steps."""
    from prefect.runtime import flow_run  # lazy: only inside a flow run

    params = flow_run.parameters
    secure = params.get("secure")
    attempt = (secure.get("attempt", 1) if isinstance(secure, dict) else getattr(secure, "attempt", 1)) or 1
    return f"fed-round-{params['rnd']}-{f'a{attempt}-' if attempt > 1 else ''}{params['site']}"


@flow(name="federated-round", flow_run_name=_round_run_name, log_prints=True)
def federated_round(spec: JobSpec, site: str, run_id: str, run_key: str, rnd: Round, approved: DatasetVersion,
                    featurizer: dict, aggregation_site: str, tag: str, workspace: str | None = None,
                    secure: SecureRound | None = None) -> steps.SiteUpdate:
    """Round ``rnd`` at ``site``: global weights in, local epochs, the update out (with ``secure``: kept at the
    site, only masked for that attempt's participants)."""
    ws = _checked_workspace(workspace, run_id, run_key)
    out = train_round(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site, secure)
    stages.save_result(ws, run_id, tag, out)
    return out


@flow(name="federated-evaluate", flow_run_name="fed-evaluate-{site}", log_prints=True)
def federated_evaluate(spec: JobSpec, site: str, run_id: str, run_key: str, rnd: Round, approved: DatasetVersion,
                       featurizer: dict, aggregation_site: str, tag: str,
                       workspace: str | None = None) -> steps.SiteEvaluation:
    """The final global model on ``site``'s test split; only the metrics leave."""
    ws = _checked_workspace(workspace, run_id, run_key)
    out = evaluate_site(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site)
    stages.save_result(ws, run_id, tag, out)
    return out


class PoolWatch:
    """Whether a site's pool has lost its workers, for all the sites' waits together (read at most every ``refresh_s``).

    A pool is down when its freshest worker heartbeat is more than ``MISSED_HEARTBEATS`` intervals
    older than the freshest heartbeat of the other pools watched: on a busy machine or API server
    heartbeats arrive late for everyone (45-75 s were seen on a loaded 2-core VM, with SQLite
    locked), which says nothing about one site; one pool falling behind the others does. With no
    other pool that has a worker to compare with, its heartbeats are judged against the clock.
    """

    def __init__(self, pools: list[str], refresh_s: float = LIVENESS_REFRESH_S):
        self.pools, self.refresh_s = sorted(set(pools)), refresh_s
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._down: set[str] = set()

    def down(self, pool: str) -> bool:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_s:
                try:
                    self._down = self._judge(heartbeat_lags(self.pools))
                except Exception as exc:  # the API is busy: no news is not bad news about a site
                    if not transient_api_error(exc):
                        raise
                self._read_at = time.monotonic()
            return pool in self._down

    @staticmethod
    def _judge(lags: dict[str, tuple[float, float] | None]) -> set[str]:
        down = set()
        for pool, lag in lags.items():
            others = [other[0] for p, other in lags.items() if p != pool and other is not None]
            if lag is None or lag[0] - min(others, default=0.0) >= lag[1]:
                down.add(pool)
        return down


class PoolSites:
    """The coordinator's dispatcher: each site's step in its own pool, all sites at once, each within the timeout.

    ``inline`` runs the steps here, one after another; ``auto`` uses a site's pool when the step's
    deployment for it exists (``make deploy``), else runs that site's step here. Prefect API calls
    that fail for a while (a busy server answers 503; the client has retried already) are tried
    again until the step's ``round_timeout_s``: a long federated run does not die of one.
    """

    def __init__(self, ws: Workspace, spec: JobSpec, run_id: str, run_key: str, aggregation_site: str, mode: Mode,
                 attempt: str):
        self.ws, self.spec, self.run_id, self.run_key, self.agg = ws, spec, run_id, run_key, aggregation_site
        self.mode, self.attempt = mode, attempt
        self.timeout_s = spec.training.federated.round_timeout_s
        self.lost_s = spec.training.federated.site_lost_s
        sites = ws.load_sites()
        self.watch = PoolWatch([sites.get(d.site).work_pool for d in spec.site_datasets()])

    def _one(self, step: Flow, result: type[R], site: str, tag: str, params: dict[str, Any]) -> R | str:
        params = {"spec": self.spec, "site": site, "run_id": self.run_id, "run_key": self.run_key,
                  "aggregation_site": self.agg, "tag": tag, **params}
        pool = self.ws.load_sites().get(site).work_pool
        name = deployment_name(step, pool)
        deadline = time.monotonic() + self.timeout_s
        try:
            if self.mode == "inline" or (self.mode == "auto" and not has_deployment(name)):
                return step.fn(**params, workspace=str(self.ws.root))
            payload = {k: v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v
                       for k, v in params.items()}
            run = self._submit(name, payload, tag, deadline)
        except HybridtrainError as exc:
            return f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            if not transient_api_error(exc):
                raise
            return f"the Prefect API did not take the step within {self.timeout_s:.0f} s: {exc}"
        run, lost = self._wait(run, pool, deadline)
        state = run.state
        if lost is not None:
            self._cancel(run)
            return lost
        if not state.is_completed():
            return f"flow run {run.id} ended {state.name}: {state.message or ''}".strip()
        # An adopted step (submitted by an earlier aggregator of this run key) saved its result in that attempt's run.
        return stages.load_result(self.ws, run.parameters.get("run_id", self.run_id), run.parameters.get("tag", tag),
                                  result)

    def _submit(self, name: str, payload: dict[str, Any], tag: str, deadline: float) -> FlowRun:
        """The step's flow run: the one an earlier aggregator of this run key submitted, when it is still
        scheduled, running or completed (a restarted aggregator adopts the round in flight instead of training it
        again), else a new one. Keyed by job, run key and tag, so it is also idempotent against API retries."""
        first = retry_transient(deadline, lambda: run_deployment(
            name, parameters=payload, timeout=0, idempotency_key=f"{self.spec.name}:{self.run_key}:{tag}", as_subflow=False),
            log)
        if first.parameters.get("run_id") == self.run_id:
            return first  # this aggregator's own
        if first.state is not None and (first.state.is_completed() or not first.state.is_final()):
            log.warning("adopting %s (flow run %s, %s) submitted by an earlier aggregator of run key %s", tag, first.id,
                     first.state.name, self.run_key)
            return first
        return retry_transient(deadline, lambda: run_deployment(
            name, parameters=payload, timeout=0, idempotency_key=f"{self.spec.name}:{self.run_key}:{tag}:{self.attempt}",
            as_subflow=False), log)

    def _cancel(self, run: FlowRun) -> None:
        """Cancel a dropped step's run, so a worker that comes back does not run a stale step."""
        def cancel() -> None:
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run.id, Cancelled(message="dropped from the federated round"), force=True)
        try:
            retry_transient(time.monotonic() + CANCEL_TRIES_S, cancel, log)
        except Exception as exc:
            if not transient_api_error(exc):
                raise
            log.warning("could not cancel dropped flow run %s (%s); a worker that comes back may still run it",
                        run.id, exc)

    def _wait(self, run: FlowRun, pool: str, deadline: float) -> tuple[FlowRun, str | None]:
        """Poll ``run`` until it ends; or why the site is dropped: no report by ``deadline`` (``round_timeout_s``),
        or its pool down (``PoolWatch``) for ``site_lost_s`` (the site went down with its step). The poll
        interval grows from ``POLL_S`` to ``POLL_MAX_S``: a step takes minutes, the API server is shared."""
        lost_since: float | None = None
        delay = POLL_S
        with get_client(sync_client=True) as client:
            while True:
                try:
                    run = client.read_flow_run(run.id)
                except Exception as exc:  # busy: ask again
                    if not transient_api_error(exc):
                        raise
                state = run.state.name if run.state else "unknown"
                if run.state is not None and run.state.is_final():
                    return run, None
                now = time.monotonic()
                if now >= deadline:
                    return run, (f"no report within {self.timeout_s:.0f} s (flow run {run.id} was {state}; "
                                 f"is a worker of pool {pool!r} alive?)")
                if not self.watch.down(pool):
                    lost_since = None
                elif lost_since is None:
                    lost_since = now
                elif now - lost_since >= self.lost_s:
                    return run, (f"no live worker in pool {pool!r} for {self.lost_s:.0f} s while its step was "
                                 f"{state} (flow run {run.id}): the site is down; start a worker with "
                                 f"`prefect worker start --pool {pool}`")
                time.sleep(delay)  # polling the API, as run_deployment itself does
                delay = min(delay * 1.5, POLL_MAX_S)

    def _each(self, step: Flow, result: type[R], sites: list[str], tag: str,
              params: dict[str, dict[str, Any]]) -> dict[str, R | str]:
        if self.mode == "inline":
            return {s: self._one(step, result, s, f"{tag}-{s}", params.get(s, {})) for s in sites}
        with ThreadPoolExecutor(max_workers=max(1, len(sites))) as pool:
            futures = {s: pool.submit(self._one, step, result, s, f"{tag}-{s}", params.get(s, {})) for s in sites}
            return {s: f.result() for s, f in futures.items()}

    def prepare(self, sites: list[str], rnd: int = 0) -> dict[str, steps.SitePrepared | str]:
        return self._each(federated_prepare, steps.SitePrepared, sites, f"fed-prepare-r{rnd}", {})

    def train(self, rnd: int, approved: dict[str, DatasetVersion], featurizer: dict,
              secure: SecureRound | None = None) -> dict[str, steps.SiteUpdate | str]:
        """Round ``rnd`` in the sites' pools. A secure round's later attempts (a participant dropped) are steps of
        their own (tag ``fed-round-<rnd>-a<attempt>``): keyed apart from attempt 1, adopted like it after a restart."""
        params = {s: {"rnd": rnd, "approved": v, "featurizer": featurizer} for s, v in approved.items()}
        tag = f"fed-round-{rnd}"
        if secure is not None:
            params = {s: {**p, "secure": secure} for s, p in params.items()}
            tag += f"-a{secure.attempt}" if secure.attempt > 1 else ""
        return self._each(federated_round, steps.SiteUpdate, sorted(approved), tag, params)

    def evaluate(self, rnd: int, approved: dict[str, DatasetVersion],
                 featurizer: dict) -> dict[str, steps.SiteEvaluation | str]:
        params = {s: {"rnd": rnd, "approved": v, "featurizer": featurizer} for s, v in approved.items()}
        return self._each(federated_evaluate, steps.SiteEvaluation, sorted(approved), f"fed-evaluate-r{rnd}",
                          params)


class FederatedSummary(BaseModel):
    """What a federated lifecycle did: mode decision, rounds, metrics, the version, what crossed sites."""

    job: str
    flow_run_id: str | None
    mlflow_run_id: str
    run_key: str
    mode: dict[str, Any]
    rounds: list[dict[str, Any]]
    metrics: dict[str, float]
    model_name: str
    model_version: str
    promoted: bool
    gates: dict[str, str]
    cost_usd: float
    bytes_crossed: int
    resumed_after_round: int | None

    def to_markdown(self) -> str:
        lines = [f"# Federated training of **{self.job}** (run key {self.run_key})", ""]
        lines += [f"- {r}" for r in self.mode.get("reasons", [])]
        lines += ["", "| round | participants | dropped | global val auc |", "|---|---|---|---|"]
        for r in self.rounds:
            tries = f" ({len(r['attempts'])} secure-aggregation attempts)" if len(r.get("attempts", [])) > 1 else ""
            lines.append(f"| {r['round']} | {', '.join(r['participants'])}{tries} | "
                         f"{'; '.join(f'{s}: {w}' for s, w in r['dropped'].items())[:200]} | "
                         f"{r['global_metrics'].get('val_auc', float('nan')):.4f} |")
        lines += ["", "Test metrics (row-weighted over the sites): "
                      + ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items() if k != "n"),
                  (f"Model {self.model_name} v{self.model_version}: {'promoted' if self.promoted else 'not promoted'}; "
                   f"cost ${self.cost_usd:.4f}; {self.bytes_crossed:,} bytes crossed site boundaries (model bytes only)")]
        lines += [f"- gate {k}: {v}" for k, v in self.gates.items()]
        return "\n".join(lines)


def run_federated(ws: Workspace, job: JobSpec, decision: ModeDecision, run_id: str, run_key: str, dispatch: Mode,
                  flow_run_id: str | None, actor: str) -> FederatedSummary:
    """The federated lifecycle inside the calling flow run (``lifecycle`` hands over to it)."""
    started = time.perf_counter()
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    agg = decision.aggregation_site
    registry.set_tags(run_id, {"hybridtrain.training.mode": "federated", "hybridtrain.federated.run_key": run_key})
    sites = PoolSites(ws, job, run_id, run_key, agg, dispatch, attempt=flow_run_id or run_id)
    outcome: FederationOutcome = run_federation(ws, job, run_key, agg, sites,
                                                on_round=lambda r: log_round(registry, run_id, r))
    promoted = register_and_promote(ws, job, run_id, run_key, outcome, agg, release_key_pem(ws.release_key_block),
                                    actor, started, flow_run_id)
    summary = FederatedSummary(
        job=job.name, flow_run_id=flow_run_id, mlflow_run_id=run_id, run_key=run_key,
        mode={"mode": decision.mode, "reasons": decision.reasons, "aggregation_site": agg},
        rounds=[r.model_dump(mode="json", include={"round", "participants", "dropped", "global_metrics", "rows",
                                                    "attempts"})
                for r in outcome.state.rounds],
        metrics=outcome.metrics, model_name=promoted.model_name, model_version=promoted.version,
        promoted=promoted.promoted, gates=promoted.gates, cost_usd=promoted.cost_usd,
        bytes_crossed=sum(t.bytes for t in outcome.transfers), resumed_after_round=outcome.resumed_after_round)
    create_markdown_artifact(summary.to_markdown(), key=f"federated-{job.name}", description="Federated lifecycle")
    return summary
