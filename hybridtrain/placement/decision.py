"""PlacementDecision: where a job goes, at what estimated cost and finish, and why — with every candidate and rejection.

The decision is what the flow records on the run (``to_table()`` for a Prefect table artifact,
``to_tags()`` for MLflow tags) and what ``hybridtrain plan`` prints. Its explanation — the
candidates table, the rejected sites with their rules, the cost breakdown — is built only when
read, so deciding stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from hybridtrain.placement.candidate import CandidateView, Conditions
from hybridtrain.placement.cost_model import Estimate, clock, hhmm
from hybridtrain.placement.policy import Verdict
from hybridtrain.placement.queue_state import QueueTier
from hybridtrain.placement.request import ResourceRequest
from hybridtrain.specs.sites import CapacityClass


class Explainer(Protocol):
    """What a decision asks its engine when it is read: full estimates and every verdict, computed lazily."""

    def estimate(self, request: ResourceRequest, site: str, capacity_class: CapacityClass, *, now: float,
                 conditions: Conditions | None = None) -> Estimate: ...

    def verdicts(self, view: CandidateView, team_spend: Mapping[str, float] | None = None) -> list[Verdict]: ...

#: MLflow caps tag values at 5,000 characters (mlflow/utils/validation.py MAX_TAG_VAL_LENGTH).
MAX_TAG_CHARS = 5000


@dataclass(frozen=True, slots=True)
class Candidate:
    """One row of the candidates table: a (site, capacity class), its verdict and, if priced, its numbers."""

    site: str
    capacity_class: CapacityClass
    allowed: bool
    chosen: bool = False
    rule: str | None = None
    reason: str | None = None
    cost_usd: float | None = None
    finish_at: float | None = None
    meets_deadline: bool | None = None
    queue_wait_s: float | None = None

    def row(self) -> dict[str, str]:
        return {
            "site": self.site,
            "capacity": self.capacity_class.value,
            "verdict": "chosen" if self.chosen else ("allowed" if self.allowed else "rejected"),
            "cost_usd": "" if self.cost_usd is None else f"{self.cost_usd:.2f}",
            "finish": "" if self.finish_at is None else clock(self.finish_at),
            "meets_deadline": "" if self.meets_deadline is None else ("yes" if self.meets_deadline else "no"),
            "queue_wait": "" if self.queue_wait_s is None else hhmm(self.queue_wait_s),
            "rule": self.rule or "",
            "reason": self.reason or "",
        }


class PlacementDecision:
    """The engine's answer for one request (built by ``Placement.decide``)."""

    def __init__(
        self,
        engine: Explainer,
        view: CandidateView,
        pos: int,
        strategy: str,
        reasons: Callable[[], list[str]] | None,
        team_spend: Mapping[str, float] | None,
        urgent: bool = False,
        late: bool = False,
    ) -> None:
        self._engine = engine
        self._view = view
        self._pos = pos
        self.strategy = strategy
        self._reasons = reasons
        self._team_spend = team_spend
        self.urgent = urgent
        self.late = late

    # --- the decision ----------------------------------------------------------------------

    @property
    def request(self) -> ResourceRequest:
        return self._view.request

    @property
    def now(self) -> float:
        return self._view.now

    @property
    def job(self) -> str:
        return self._view.request.job

    @property
    def site(self) -> str:
        return self._view.plan.cands[self._pos].site

    @property
    def capacity_class(self) -> CapacityClass:
        return self._view.plan.cands[self._pos].klass

    @property
    def is_onprem(self) -> bool:
        return self._view.plan.cands[self._pos].onprem

    @property
    def cost_usd(self) -> float:
        return self._view.priced(self._pos).total

    @property
    def finish_at(self) -> float:
        return self._view.finish_at(self._pos)

    @property
    def queue_wait_s(self) -> float:
        return self._view.priced(self._pos).wait

    @property
    def meets_deadline(self) -> bool:
        """True when the chosen candidate finishes by the deadline (or starts within the wait SLO)."""
        return self._view.priced(self._pos).meets

    @property
    def deadline(self) -> float | None:
        return self._view.deadline

    @property
    def must_stay(self) -> bool:
        """True when policy allows no off-prem site for this job: it is never moved."""
        return self._view.plan.must_stay

    @property
    def queue_tier(self) -> QueueTier:
        """The on-prem pool's work queue to submit to (``QueueTier``: stay, on_demand, spot, late).

        Urgent runs — only on-prem, and only starting now, makes their deadline — go first too;
        runs the strategy let be late (``Choice.late``) go last.
        """
        if self.urgent:
            return QueueTier.stay
        return QueueTier.late if self.late else self._view.plan.tier

    @property
    def needs_sync(self) -> bool:
        """Whether the data must be synced to the chosen site before training."""
        return self._view.plan.cands[self._pos].remote

    @cached_property
    def reasons(self) -> list[str]:
        return list(self._reasons()) if self._reasons is not None else []

    @cached_property
    def estimate(self) -> Estimate:
        """The chosen candidate's full cost breakdown (same inputs, same numbers as the decision)."""
        return self._engine.estimate(self.request, self.site, self.capacity_class, now=self.now,
                                     conditions=self._view.conditions)

    # --- the explanation -------------------------------------------------------------------

    @cached_property
    def candidates(self) -> tuple[Candidate, ...]:
        """Every candidate: the chosen one first, then allowed ones by cost, then rejected ones."""
        v, plan = self._view, self._view.plan
        pos_of = {n: p for p, n in enumerate(plan.allowed)}
        rows: list[Candidate] = []
        for n, verdict in enumerate(self._engine.verdicts(v, self._team_spend)):
            p = pos_of.get(n)
            if p is None:
                rows.append(Candidate(verdict.site, verdict.capacity_class, False,
                                      rule=verdict.rule, reason=verdict.reason))
                continue
            pr = v.priced(p)
            rows.append(Candidate(verdict.site, verdict.capacity_class, verdict.allowed, chosen=p == self._pos,
                                  rule=verdict.rule, reason=verdict.reason, cost_usd=pr.total,
                                  finish_at=v.now + pr.finish, meets_deadline=pr.meets, queue_wait_s=pr.wait))

        def order(c: Candidate) -> tuple:
            return (not c.chosen, not c.allowed, c.cost_usd if c.cost_usd is not None else math.inf)
        return tuple(sorted(rows, key=order))

    @property
    def rejected(self) -> dict[str, str]:
        """``"site (capacity)"`` → ``"rule: reason"`` for every rejected candidate."""
        return {f"{c.site} ({c.capacity_class.value})": f"{c.rule}: {c.reason}"
                for c in self.candidates if not c.allowed}

    def to_table(self) -> list[dict[str, str]]:
        """Rows for a Prefect table artifact (``create_table_artifact(table=...)``)."""
        return [c.row() for c in self.candidates]

    def to_tags(self) -> dict[str, str]:
        """Flat string tags for MLflow (``mlflow.set_tags``)."""
        rejected = "; ".join(f"{k}: {v}" for k, v in self.rejected.items())
        tags = {
            "placement.site": self.site,
            "placement.capacity_class": self.capacity_class.value,
            "placement.strategy": self.strategy,
            "placement.est_cost_usd": f"{self.cost_usd:.2f}",
            "placement.est_finish": clock(self.finish_at),
            "placement.meets_deadline": str(self.meets_deadline).lower(),
            "placement.needs_sync": str(self.needs_sync).lower(),
            "placement.must_stay": str(self.must_stay).lower(),
            "placement.queue_tier": self.queue_tier.name,
            "placement.urgent": str(self.urgent).lower(),
            "placement.reasons": " | ".join(self.reasons),
            "placement.rejected": rejected,
        }
        if self.deadline is not None:
            tags["placement.deadline"] = clock(self.deadline)
        return {k: v[:MAX_TAG_CHARS] for k, v in tags.items()}

    def summary(self) -> str:
        flag = "" if self.meets_deadline else "  [MISSES DEADLINE]"
        return (f"{self.job} → {self.site} ({self.capacity_class.value}) ${self.cost_usd:.2f}, "
                f"finish {clock(self.finish_at)}{flag}")

    def __repr__(self) -> str:
        return f"PlacementDecision({self.summary()})"
