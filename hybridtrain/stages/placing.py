"""Placing: the placement decision for one lifecycle from live inputs, and the site health it depends on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import Site
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from concurrent.futures import ThreadPoolExecutor

from hybridtrain.placement.burst import pass_now
from hybridtrain.placement.duration_estimator import PLAN_QUANTILE, HistoryQuantile
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.queue_state import due_at
from hybridtrain.placement.request import request_from_spec
from hybridtrain.remote.site_health import check_site
from hybridtrain.stages.site_access import audit

M = TypeVar("M", bound=BaseModel)

class PlacementOutcome(BaseModel):
    """The engine's decision for one lifecycle, in a form that travels (Prefect results, MLflow)."""

    site: str
    capacity_class: str
    strategy: str
    cost_usd: float
    finish_at: datetime
    deadline: datetime | None
    meets_deadline: bool
    needs_sync: bool
    must_stay: bool
    queue_tier: str
    queue_wait_s: float
    run_hours: float
    #: when the run is due, its place in the pool's work queue (its deadline, else the end of its wait SLO)
    due_at: datetime | None = None
    urgent: bool = False  # only an immediate on-prem start makes the deadline: room is made for it
    late: bool = False  # stays on-prem late: a rescue costs more than the policy says a deadline is worth
    controller_pass: bool = False  # run a burst-controller pass as soon as the run is queued (``burst.pass_now``)
    reasons: list[str]
    breakdown: list[str]
    candidates: list[dict[str, str]]
    rejected: dict[str, str]
    tags: dict[str, str]

    def why(self) -> list[str]:
        """The engine's reasons, with "no on-prem site is allowed" spelled out by the rules that
        rejected the on-prem (fixed-capacity) candidates — the same words as the table's."""
        onprem = sorted({f"{c.get('rule')}: {c.get('reason')}" for c in self.candidates
                         if c.get("capacity") == "fixed" and c.get("verdict") == "rejected"})
        out = []
        for r in self.reasons:
            if r.startswith("no on-prem site is allowed") and onprem:
                r = "no on-prem site is allowed for this job (" + "; ".join(onprem) + ")"
            out.append(r)
        return out

    def headline(self) -> str:
        """One line: site, capacity, estimated cost and finish, and why."""
        why = self.why()
        return (f"placement: {self.site} ({self.capacity_class}, strategy {self.strategy}), est. ${self.cost_usd:.2f}, "
                f"finish {self.finish_at:%Y-%m-%d %H:%M} UTC"
                + ("" if self.meets_deadline else " (misses the deadline)")
                + (f"; {' / '.join(why)}" if why else ""))

    def to_markdown(self) -> str:
        """Headline and reasons, cost breakdown, then every candidate in a table that fits 1440 px:
        short columns only; each rejected candidate's rule and reason follow the table in full."""
        lines = [f"# Placement: **{self.site}** ({self.capacity_class}, strategy {self.strategy})", "",
                 f"Estimated cost ${self.cost_usd:.2f}, finish {self.finish_at:%Y-%m-%d %H:%M} UTC"
                 + (f", deadline {self.deadline:%Y-%m-%d %H:%M} UTC" if self.deadline else "")
                 + (" — meets it." if self.meets_deadline else " — **misses it** (least late option)."), ""]
        lines += [f"- {r}" for r in self.why()]
        lines += ["", "## Cost breakdown", ""] + [f"- {b}" for b in self.breakdown]
        if self.candidates:
            cols = ["site", "capacity", "verdict", "cost_usd", "finish", "meets_deadline", "queue_wait", "rule"]
            lines += ["", "## Every candidate", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(str(c.get(k, "")).replace("|", "\\|") for k in cols) + " |"
                      for c in self.candidates]
        if self.rejected:
            lines += ["", "## Rejected, and why", ""] + [f"- **{k}** — {v}" for k, v in self.rejected.items()]
        return "\n".join(lines)


def past_run_hours(ws: Workspace, job: str) -> list[float]:
    """Hours the last finished runs of ``job`` (MLflow tag ``hybridtrain.job``) trained, newest first
    (metric ``train_seconds``; at most 50)."""
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    runs = registry.job_runs(ws.experiment, job, limit=50)
    return [r.data.metrics["train_seconds"] / 3600 for r in runs if "train_seconds" in r.data.metrics]


def estimate_run_hours(ws: Workspace, spec: JobSpec, samples: Sequence[float] | None = None) -> float | None:
    """The engine's own run-time estimate for ``spec``: a high quantile (``PLAN_QUANTILE``) of what
    this job's recent training runs took (``past_run_hours``; or the hours in ``samples``), capped
    by its declared limit; None (use the declared limit) until three runs have finished."""
    samples = past_run_hours(ws, spec.name) if samples is None else samples
    history = HistoryQuantile(quantile=PLAN_QUANTILE)
    if len(samples) < history.family_min_samples:
        return None
    for hours in samples:
        history.observe(spec.resources.max_hours, hours, family=spec.name)
    return history.estimate(spec.resources.max_hours, family=spec.name)


def place(ws: Workspace, spec: JobSpec, dataset_bytes: int, queues: dict | None, now: datetime,
          run_hours: float | None = None, unavailable: dict[str, str] | None = None) -> PlacementOutcome:
    """Decide the training site with the placement engine (pure given its inputs: queues, clock, history).

    ``unavailable`` (site → reason: failed health checks, a site that just lost the run) is left out
    of this decision; when it leaves no site the policy allows, ``NoFeasiblePlacement`` says so.
    """

    sites = ws.load_sites()
    policy = Policy.load(ws.policy_file, sites)
    request = request_from_spec(spec, dataset_bytes=dataset_bytes, now=now, run_hours=run_hours)
    decision = Placement(sites, policy).decide(request, now=now.timestamp(), queues=queues, unavailable=unavailable)
    outcome = PlacementOutcome(
        site=decision.site,
        capacity_class=decision.capacity_class.value,
        strategy=decision.strategy,
        cost_usd=decision.cost_usd,
        finish_at=datetime.fromtimestamp(decision.finish_at, UTC),
        deadline=datetime.fromtimestamp(decision.deadline, UTC) if decision.deadline else None,
        meets_deadline=decision.meets_deadline,
        needs_sync=decision.needs_sync,
        must_stay=decision.must_stay,
        queue_tier=decision.queue_tier.name,
        queue_wait_s=decision.queue_wait_s,
        run_hours=request.run_hours,
        due_at=datetime.fromtimestamp(due_at(request.deadline, request.submitted_at, policy.wait_slo_hours * 3600.0),
                                      UTC),
        urgent=decision.urgent,
        late=decision.late,
        controller_pass=pass_now(decision),
        reasons=decision.reasons,
        breakdown=decision.estimate.lines(),
        candidates=decision.to_table(),
        rejected=decision.rejected,
        tags={f"hybridtrain.{k}": v for k, v in decision.to_tags().items()},
    )
    progress.report("place", "decision", outcome.headline(), site=outcome.site, capacity=outcome.capacity_class,
                    cost_usd=outcome.cost_usd)
    return outcome


def site_health(ws: Workspace, workers_online: Callable[[str], int | None] | None = None,
                timeout_s: float = 5.0) -> list[Any]:
    """Health of every site in the catalog (``site_health.check_site``): its SSH hosts with the key
    its block holds, its store, and — when ``workers_online`` (pool → live workers) is given — its
    pool's worker heartbeat. Probes run in parallel threads, each bounded by ``timeout_s``."""


    sites = ws.load_sites()

    def one(site: Site) -> Any:
        secret = ws.secrets.get(site.name) if ws.secrets is not None else None
        ssh = secret is not None and secret.has_ssh and bool(site.hosts)
        workers = workers_online(site.work_pool) if workers_online is not None else None
        return check_site(site, ws.root, private_key=secret.ssh_private_key if ssh else None,
                          known_hosts=(secret.ssh_known_hosts or "") if ssh else None,
                          workers_online=workers, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(sites.sites)))) as pool:
        return list(pool.map(one, sites.sites))


def record_placement(ws: Workspace, run_id: str, outcome: PlacementOutcome, job: str = "") -> None:
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    registry.set_tags(run_id, outcome.tags)
    registry.log_dict(run_id, outcome.model_dump(mode="json"), "reports/placement.json")
    audit(ws).append(actor=ws.actor, action="placement", subject=f"job {job or run_id}",
                     inputs={"mlflow_run_id": run_id, "site": outcome.site, "capacity_class": outcome.capacity_class,
                             "strategy": outcome.strategy, "est_cost_usd": round(outcome.cost_usd, 4),
                             "rejected": outcome.rejected, "reasons": outcome.reasons},
                     outcome=f"{outcome.site} ({outcome.capacity_class})")
