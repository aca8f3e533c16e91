"""Canary: a share of one target's traffic sent to a new version, judged against the current one on live requests.

A canary is a pointer beside ``current`` on a release target (``canary/<model>.json``, one
JSON object written atomically): the version (already accepted by the target, so its bundle
verified there), the share of requests it gets, and the thresholds. A server of that target
(``hybridtrain serve``) loads it beside the current version, routes ``share`` of the requests
to it, and keeps a window of each version's outcomes (``LiveStats``). Once both have
``min_requests`` the ``judge`` compares them:

- error rate: the canary's may exceed the current's by at most ``max_error_rate_increase``;
- latency: the canary's p99 may be at most ``max_p99_ratio`` times the current's (plus 5 ms,
  so sub-millisecond noise cannot fail a canary);
- score distribution: the two-sample Kolmogorov–Smirnov statistic of their scores at most
  ``max_score_ks`` (a canary that suddenly scores everyone as churning is refused).

All pass: **promote** — the target's ``current`` moves to the canary version, the pointer is
removed. Any fails: **rollback** — the pointer is removed, ``current`` stays. Every step
(start, promote, rollback) is an audit-log record, and a step whose record cannot be written is refused
before any pointer moves (a server then keeps the canary running and says why, once). Example: v2 canary at 20 %, 200 requests
each; v2's p99 3.1 ms vs 2.9 ms, no errors, KS 0.04 → promoted; the server swaps to v2.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridtrain.errors import Problem, ReleaseRefused, SpecError

CANARY_KEY = "canary/{model}.json"
LATENCY_SLACK_MS = 5.0


class CanaryPlan(BaseModel):
    """What a canary is and how it is judged (stored as the target's canary pointer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Registered model name.")
    version: str = Field(description="The version on trial; the target must already hold it.")
    # Finite numbers only: JSON has no NaN or infinity, so the stored pointer could not be read back.
    share: float = Field(0.1, gt=0, lt=1, allow_inf_nan=False, description="Share of requests routed to the canary.")
    min_requests: int = Field(200, ge=10, description="Requests each version must have served before judging.")
    max_error_rate_increase: float = Field(0.01, ge=0, le=1, allow_inf_nan=False,
                                           description="Allowed rise in error rate.")
    max_p99_ratio: float = Field(1.5, gt=0, allow_inf_nan=False,
                                 description="Allowed canary p99 latency / current p99 latency.")
    max_score_ks: float = Field(0.2, gt=0, le=1, allow_inf_nan=False,
                                description="Allowed KS statistic between the two score samples.")
    started_at: str = Field(description="When the canary started (UTC).")


LIMITS = ("share", "min_requests", "max_error_rate_increase", "max_p99_ratio", "max_score_ks")


def _bounds(name: str) -> str:
    """``"> 0 and < 1"`` from the field's constraints."""
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    found = [f"{words[attr]} {getattr(m, attr)}" for m in CanaryPlan.model_fields[name].metadata for attr in words
             if getattr(m, attr, None) is not None]
    return " and ".join(found)


def limit_problems(limits: dict[str, Any]) -> list[Problem]:
    """Every limit in ``limits`` that a ``CanaryPlan`` refuses, one ``Problem`` each (path: the field's name)."""
    unknown = sorted(set(limits) - set(LIMITS))
    if unknown:
        raise TypeError(f"not canary limits: {', '.join(unknown)}")
    try:
        CanaryPlan(model="m", version="v", started_at="", **limits)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            name = str(e["loc"][0])
            value, field = e.get("input"), CanaryPlan.model_fields[name]
            kind = "a whole number" if field.annotation is int else "a number"
            if isinstance(value, float) and math.isnan(value):
                what = f"{value} is not a number"
            elif isinstance(value, float) and math.isinf(value):
                what = f"{value} is not a finite number"
            elif "than" in e["type"]:  # greater_than, less_than_equal, ...
                what = f"{value!r} is out of range"
            else:
                what = f"{value!r}: {e['msg'][:1].lower() + e['msg'][1:]}"
            about = (field.description or name).rstrip(".")
            problems.append(Problem(name, f"{what}; give {kind} {_bounds(name)} "
                                          f"({about[:1].lower() + about[1:]}; default {field.default})"))
        return problems
    return []


def new_plan(model: str, version: str, **limits: Any) -> CanaryPlan:
    """A plan for ``version`` under ``limits``; ``SpecError`` listing every limit out of range."""
    problems = limit_problems(limits)
    if problems:
        raise SpecError("canary", problems)
    return CanaryPlan(model=model, version=version, started_at=_now(), **limits)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_target(target: Any, model: str, version: str) -> str:
    """The version ``target`` serves, which a canary of ``version`` is compared with; ``ReleaseRefused`` when it
    serves none or ``version`` itself (checked before anything is released to it)."""
    current = target.current(model)
    if current is None:
        raise ReleaseRefused(model, f"target {target.name} serves no version yet, so there is nothing to compare a "
                                    "canary with; release it normally")
    if current == version:
        raise ReleaseRefused(model, f"target {target.name} already serves v{version}")
    return current


def start(target: Any, audit: Any, *, model: str, version: str, actor: str, **limits: Any) -> CanaryPlan:
    """Put ``version`` on trial at ``target`` (which must hold it, and not serve it already)."""
    plan = new_plan(model, version, **limits)
    if version not in target.versions(model):
        raise ReleaseRefused(model, f"target {target.name} does not hold v{version}; release (stage) it there first")
    current = check_target(target, model, version)
    audit.check_appendable()  # its record must not go missing: refused before the pointer is written
    key = CANARY_KEY.format(model=model)
    target.meta.put_bytes(key, plan.model_dump_json().encode())
    try:
        audit.append(actor=actor, action="canary", subject=f"model {model} v{version}",
                     inputs={"target": target.name, "current": current, **plan.model_dump(exclude={"model", "version"})},
                     outcome=f"started: {plan.share:.0%} of {target.name}'s requests go to v{version}, "
                             f"v{current} keeps the rest")
    except BaseException:
        target.meta.delete(key)  # no canary without its record
        raise
    return plan


def plan_of(target: Any, model: str) -> CanaryPlan | None:
    """The target's canary pointer, or None."""
    key = CANARY_KEY.format(model=model)
    try:
        raw = target.meta.get_bytes(key)
    except FileNotFoundError:
        return None
    try:
        plan = CanaryPlan.model_validate_json(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise ReleaseRefused(model, f"target {target.name}'s canary pointer {target.meta.url.rstrip('/')}/{key} is "
                                    f"unreadable ({where + ': ' if where else ''}{e['msg']}): it was edited or "
                                    "truncated; delete it (no canary), or start the canary again") from None
    if plan.model != model:
        raise ReleaseRefused(model, f"target {target.name}'s canary pointer {target.meta.url.rstrip('/')}/{key} is "
                                    f"for model {plan.model!r}; delete it (no canary), or start the canary again")
    return plan


def clear(target: Any, model: str) -> None:
    target.meta.delete(CANARY_KEY.format(model=model))


@dataclass
class LiveStats:
    """A window of one version's recent outcomes: latency per request, errors, scores (thread-safe)."""

    window: int = 5000
    latencies_ms: deque[float] = field(default_factory=deque)
    errors: deque[bool] = field(default_factory=deque)
    scores: deque[float] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, latency_ms: float, error: bool, scores: Any = ()) -> None:
        with self.lock:
            self.latencies_ms.append(latency_ms)
            self.errors.append(error)
            self.scores.extend(float(s) for s in scores)
            for q in (self.latencies_ms, self.errors):
                while len(q) > self.window:
                    q.popleft()
            while len(self.scores) > self.window:
                self.scores.popleft()

    def reset(self) -> None:
        """Forget the window: a canary compares the two versions on the same requests, those since it started."""
        with self.lock:
            self.latencies_ms.clear()
            self.errors.clear()
            self.scores.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            lat = np.array(self.latencies_ms, dtype=float)
            return {"requests": len(self.errors),
                    "error_rate": float(np.mean(self.errors)) if self.errors else 0.0,
                    "p50_ms": float(np.percentile(lat, 50)) if lat.size else 0.0,
                    "p99_ms": float(np.percentile(lat, 99)) if lat.size else 0.0,
                    "scores": np.array(self.scores, dtype=float)}


@dataclass(frozen=True)
class Verdict:
    decision: Literal["wait", "promote", "rollback"]
    reasons: list[str]
    evidence: dict[str, Any]


def judge(plan: CanaryPlan, current: dict[str, Any], canary: dict[str, Any]) -> Verdict:
    """Compare two ``LiveStats.snapshot()``s under ``plan``'s thresholds."""
    from scipy.stats import ks_2samp

    evidence = {
        "current": {k: v for k, v in current.items() if k != "scores"},
        "canary": {k: v for k, v in canary.items() if k != "scores"},
    }
    if min(current["requests"], canary["requests"]) < plan.min_requests:
        return Verdict("wait", [(f"{canary['requests']} canary and {current['requests']} current requests so far; "
                                 f"{plan.min_requests} each are needed")], evidence)
    reasons, failed = [], False
    rise = canary["error_rate"] - current["error_rate"]
    ok = rise <= plan.max_error_rate_increase
    failed |= not ok
    reasons.append(f"error rate {canary['error_rate']:.3%} vs {current['error_rate']:.3%} "
                   f"({'ok' if ok else 'too high'}, allowed +{plan.max_error_rate_increase:.1%})")
    limit = current["p99_ms"] * plan.max_p99_ratio + LATENCY_SLACK_MS
    ok = canary["p99_ms"] <= limit
    failed |= not ok
    reasons.append(f"p99 {canary['p99_ms']:.2f} ms vs {current['p99_ms']:.2f} ms ({'ok' if ok else 'too slow'}, "
                   f"limit {limit:.2f} ms)")
    if canary["scores"].size and current["scores"].size:
        ks = float(ks_2samp(canary["scores"], current["scores"]).statistic)
        evidence["score_ks"] = ks
        evidence["score_mean"] = {"current": float(current["scores"].mean()), "canary": float(canary["scores"].mean())}
        ok = ks <= plan.max_score_ks
        failed |= not ok
        reasons.append(f"score distribution KS {ks:.3f} ({'ok' if ok else 'shifted'}, limit {plan.max_score_ks})")
    return Verdict("rollback" if failed else "promote", reasons, evidence)


def conclude(target: Any, audit: Any, plan: CanaryPlan, verdict: Verdict, *, actor: str) -> None:
    """Act on a promote/rollback verdict at ``target`` and audit it; a no-op if the pointer moved meanwhile."""
    live = plan_of(target, plan.model)
    if live is None or live.version != plan.version or live.started_at != plan.started_at:
        return  # another server of this target concluded it first
    audit.check_appendable()  # refused before ``current`` or the pointer moves: every step has its record
    previous = target.current(plan.model)
    if verdict.decision == "promote":
        target.set_current(plan.model, plan.version)
    clear(target, plan.model)
    outcome = (f"promoted: {target.name} serves v{plan.version} (was v{previous})" if verdict.decision == "promote"
               else f"rolled back: {target.name} keeps v{previous}")
    audit.append(actor=actor, action="canary", subject=f"model {plan.model} v{plan.version}",
                 inputs={"target": target.name, "current_before": previous, "reasons": verdict.reasons,
                         **verdict.evidence}, outcome=outcome)
