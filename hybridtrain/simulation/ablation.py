"""Rule ablation: what one policy rule costs — the same comparison under the policy and under a copy with the rule relaxed.

``run_ablation`` runs ``comparison.run_comparison`` twice on the same workload, seed, deadlines and
on-prem capacity: once under the policy file (the rule in force), once under a second file that
relaxes it (e.g. ``data/traces/simulation-policy-spot-allowed.yaml``: production and standard jobs
may use spot). By default the relaxed side keeps the setting our policy was tuned to with the rule
(duration quantiles, what a deadline is worth), so the rule is the only difference; ``retune=True``
tunes it again under the relaxed policy (each side at its own best operating point, which can trade
misses for dollars differently). Each side replays *every* contender under its own policy file, so
each baseline family obeys the same rules as we do on that side:

- the threshold-burst family bursts to on-demand only, so its frontier — on which ``cost ×ref``
  and ``cloud ×ref`` read the reference at our misses — is the same on both sides
  (``reference_same``); the reference dollars differ only as far as our misses do;
- the spot-burst family may put the relaxed classes on spot too, so ``×best`` compares with the
  best baseline under the same rules (a baseline kept off spot while we use it would flatter us);
- the capacity-aware bound prices the cheapest *allowed* cloud, so it drops with the rule.

``ablation_rows`` groups ablations per deadline regime and load and gives, with the rule and
without it, the mean / worst over seeds of our cost ×ref, cloud ×ref, misses, ×bound, our dollars,
the GPU-hours the relaxed classes ran on spot, and what the rule costs: our dollars with it minus
our dollars without it (positive: the rule costs money).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.policy import Policy
from hybridtrain.simulation.comparison import SIM_POLICY, Report, Tuning, run_comparison
from hybridtrain.simulation.traces import TRACES_DIR

#: The simulation policy with "production and standard jobs never on spot" relaxed.
SPOT_ALLOWED_POLICY = TRACES_DIR / "simulation-policy-spot-allowed.yaml"


def relaxed_classes(policy: Policy, relaxed: Policy) -> list[str]:
    """The job classes whose allowed capacity classes differ between the two policies (what the rule governs)."""
    return sorted(name for name, jc in relaxed.job_classes.items()
                  if name not in policy.job_classes
                  or set(policy.job_classes[name].capacity_classes) != set(jc.capacity_classes))


@dataclass
class Ablation:
    """One seed, load and deadline regime under the policy (``strict``) and with the rule relaxed."""

    strict: Report
    relaxed: Report
    classes: list[str]  # the job classes whose capacity classes the rule changes

    def side(self, which: str) -> dict:
        """The numbers of one side ("with" the rule or "without" it)."""
        r = self.strict if which == "with" else self.relaxed
        t = r.targets
        return {"cost_ratio": t["cost_ratio"], "cloud_ratio": t["cloud_ratio"], "best_family_ratio": t["best_family_ratio"],
                "misses": t["misses"], "bound_ratio": t["bound_ratio"], "ours_usd": r.row("ours").total_usd,
                "cloud_usd": r.row("ours").cloud_usd, "reference_usd": t["reference_usd"],
                "spot_gpu_hours": sum(r.spot_gpu_hours.get("ours", {}).get(c, 0.0) for c in self.classes)}

    @property
    def rule_usd(self) -> float:
        """What the rule costs us on this seed: our total with it minus our total without it."""
        return self.strict.row("ours").total_usd - self.relaxed.row("ours").total_usd

    @property
    def reference_same(self) -> bool:
        """Whether the threshold-burst frontier is the same on both sides (it never uses spot; the
        reference read on it still moves with our misses)."""
        return self.strict.frontiers.get("threshold_burst") == self.relaxed.frontiers.get("threshold_burst")


def run_ablation(relaxed_policy: Path | str = SPOT_ALLOWED_POLICY, *, policy_path: Path | str = SIM_POLICY,
                 tunings: tuple[Tuning | None, Tuning | None] = (None, None), retune: bool = False,
                 **kwargs) -> Ablation:
    """``run_comparison(**kwargs)`` under ``policy_path`` and under ``relaxed_policy`` (see the module docstring).

    ``tunings``: each side's setting chosen earlier (e.g. on the first seed), None to tune here;
    without ``retune`` the relaxed side takes the strict side's setting (its own is ignored).
    The relaxed policy must declare every job class of the policy.
    """
    policy, relaxed = Policy.load(policy_path), Policy.load(relaxed_policy)
    missing = sorted(set(policy.job_classes) - set(relaxed.job_classes))
    if missing:
        raise SpecError(str(relaxed_policy), [Problem("job_classes", f"{', '.join(missing)} missing: the relaxed "
                                                                     "policy must declare every class of the policy")])
    classes = relaxed_classes(policy, relaxed)
    strict = run_comparison(policy_path=policy_path, tuning=tunings[0], **kwargs)
    kwargs = {**kwargs, "capacity": strict.capacity, "load": None}  # the same pool, whatever the load rounding
    tuning = tunings[1] if retune else strict.tuning
    return Ablation(strict, run_comparison(policy_path=relaxed_policy, tuning=tuning, **kwargs), classes)


def _mean_worst(vals: Sequence[float]) -> tuple[float, float]:
    return float(np.mean(vals)), float(np.max(vals))


def ablation_rows(ablations: Sequence[Ablation]) -> list[dict]:
    """Per deadline regime and load (in the order first seen): one row with the rule, one without.

    Each row holds (mean, worst) over seeds of cost ×ref, cloud ×ref, ×best, ×bound (worst = max)
    and the means of misses, our dollars, the relaxed classes' spot GPU-hours; ``rule_usd`` (our
    dollars with the rule minus without, mean and max over seeds) and ``reference_same`` (the
    threshold-burst frontier identical on every seed) are on both rows of a group.
    """
    groups: dict[tuple[str, int], list[Ablation]] = {}
    for a in ablations:
        groups.setdefault((a.strict.deadlines, a.strict.capacity), []).append(a)
    rows = []
    for (regime, capacity), abl in groups.items():
        rule = _mean_worst([a.rule_usd for a in abl])
        for which in ("with", "without"):
            sides = [a.side(which) for a in abl]
            rows.append({
                "deadlines": regime, "capacity": capacity, "demand_ratio": abl[0].strict.demand_ratio,
                "rule": which, "seeds": len(abl), "classes": abl[0].classes,
                "policy": (abl[0].strict if which == "with" else abl[0].relaxed).policy,
                **{k: _mean_worst([s[k] for s in sides])
                   for k in ("cost_ratio", "cloud_ratio", "best_family_ratio", "bound_ratio")},
                **{k: float(np.mean([s[k] for s in sides]))
                   for k in ("misses", "ours_usd", "cloud_usd", "reference_usd", "spot_gpu_hours")},
                "rule_usd": rule, "reference_same": all(a.reference_same for a in abl),
            })
    return rows


def format_rows(rows: Sequence[dict]) -> list[str]:
    """The ablation table as text lines (header first), for the benchmark and the CLI."""
    head = ("deadlines", "demand", "rule", "cost xref", "cloud xref", "xbest", "misses", "xbound", "ours $",
            "ref $", "spot GPU-h (" + "+".join(rows[0]["classes"]) + ")" if rows else "spot GPU-h", "rule costs $")
    lines = [" | ".join(head)]
    for r in rows:
        def mw(k: str, r: dict = r) -> str:
            return f"{r[k][0]:.3f} / {r[k][1]:.3f}"
        lines.append(" | ".join([
            r["deadlines"], f"{r['demand_ratio']:.2f}x", f"{r['rule']} ({Path(r['policy']).name})", mw("cost_ratio"),
            mw("cloud_ratio"), mw("best_family_ratio"), f"{r['misses']:.0f}", mw("bound_ratio"),
            f"{r['ours_usd']:,.0f}", f"{r['reference_usd']:,.0f}" + ("" if r["reference_same"] else " (frontier differs)"),
            f"{r['spot_gpu_hours']:,.0f}",
            f"{r['rule_usd'][0]:+,.0f} / {r['rule_usd'][1]:+,.0f}" if r["rule"] == "with" else "",
        ]))
    return lines
