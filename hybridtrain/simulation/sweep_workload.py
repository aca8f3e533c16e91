"""SweepWorkload: a hyperparameter sweep replayed beside the pod trace — its trials as simulator jobs, and what the sweep cost and took.

A sweep of ``n_trials`` trials, ``parallelism`` at a time, arrives at ``arrival`` into a cluster
already busy with the trace's jobs. Trials are opportunistic (checkpointed, spot allowed) with
the sweep's own data (``dataset_gb``, approved, internal). The simulator has no dependencies
between jobs, so the sweep's slots are modelled as waves: wave ``k`` of ``parallelism`` trials
arrives when wave ``k-1`` would end on dedicated capacity (``k × trial_hours``). Pruning shortens
trials: a seeded ``pruned_share`` of them stop after ``pruned_fraction`` of their epochs. Every
trial must end by the sweep's deadline: ``deadline_slack`` × the dedicated-capacity makespan
after arrival (the time an all-on-demand sweep takes, plus slack), or ``deadline_hours`` after
arrival when given.

``compare`` replays trace + sweep under two contenders with the production engine — our policy
(opportunistic trials may take spot) and the all-on-demand burst baseline (every job goes to
on-demand cloud capacity at once) — and reports the sweep's trials only: their cost, and the
sweep's completion time (last trial's finish − arrival). A cheaper sweep that finishes later is
not the same service, so ``compare_at_equal_completion`` also replays ours with the sweep's
deadline set to the all-on-demand sweep's own completion time: ours may take spot only where it
still ends by then (the engine's deadline rule), and the cost ratio is read at that equal
completion time (``meets`` says whether ours did end by it).

The trials' own cost is not all the sweep costs: where it holds on-prem GPUs that the cluster's
other jobs would have used, those jobs wait or pay for the cloud instead — and where it yields
them, the trials pay. ``EqualCompletion.ratio_marginal`` counts both: the whole cluster's cost
with the sweep minus without it, under each contender.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hybridtrain.simulation.simulator import Contender, Outcome, Scenario, Simulation
from hybridtrain.simulation.workload import SimJob
from hybridtrain.specs.job import Sensitivity

SWEEP_PREFIX = "sweep-trial-"
SWEEP_FAMILY = "sweep"  # every trial is a run of the same job: the engine learns their durations together


@dataclass(frozen=True)
class SweepWorkload:
    """The sweep's shape (see the module docstring)."""

    n_trials: int = 32
    parallelism: int = 4
    gpus: int = 1
    trial_hours: float = 2.0
    pruned_share: float = 0.5
    pruned_fraction: float = 0.34
    dataset_gb: float = 5.0
    checkpoint_gb: float = 0.5
    checkpoint_interval_s: float = 900.0
    deadline_slack: float = 1.5
    deadline_hours: float | None = None
    seed: int = 7

    @property
    def waves(self) -> int:
        return math.ceil(self.n_trials / self.parallelism)

    def jobs(self, arrival: float) -> list[SimJob]:
        rng = np.random.default_rng(self.seed)
        hours = self.deadline_hours if self.deadline_hours is not None else \
            self.deadline_slack * self.waves * self.trial_hours
        deadline = arrival + hours * 3600
        out = []
        for i in range(self.n_trials):
            wave = i // self.parallelism
            hours = self.trial_hours * (self.pruned_fraction if rng.random() < self.pruned_share else 1.0)
            out.append(SimJob(
                id=f"{SWEEP_PREFIX}{i}", arrival=arrival + wave * self.trial_hours * 3600, gpus=self.gpus,
                true_hours=hours, declared_hours=self.trial_hours, job_class="opportunistic",
                sensitivity=Sensitivity.internal, deadline=deadline,
                dataset_bytes=int(self.dataset_gb * 1e9), checkpoint_bytes=int(self.checkpoint_gb * 1e9),
                checkpoint_interval_s=self.checkpoint_interval_s, family=SWEEP_FAMILY))
        return out


@dataclass(frozen=True)
class SweepReplay:
    """The sweep's trials under one contender."""

    contender: str
    cost_usd: float
    completion_h: float
    missed: int
    spot_gpu_hours: float
    on_demand_gpu_hours: float
    onprem_gpu_hours: float
    preemptions: int
    failovers: int = 0  # moves of spot runs to another site's spot when theirs was gone
    cluster_usd: float = math.nan  # every job of the replay (the trace's and the sweep's)


def sweep_outcome(name: str, outcomes: Sequence[Outcome], arrival: float) -> SweepReplay:
    trials = [o for o in outcomes if o.job.id.startswith(SWEEP_PREFIX)]
    finish = max((o.finish for o in trials if not math.isnan(o.finish)), default=math.nan)
    return SweepReplay(
        contender=name, cost_usd=math.fsum(o.cost_usd for o in trials), completion_h=(finish - arrival) / 3600,
        missed=sum(o.missed for o in trials), spot_gpu_hours=math.fsum(o.spot_gpu_hours for o in trials),
        on_demand_gpu_hours=math.fsum(o.od_gpu_hours for o in trials),
        onprem_gpu_hours=math.fsum(o.onprem_gpu_hours for o in trials), preemptions=sum(o.preemptions for o in trials),
        failovers=sum(o.failovers for o in trials), cluster_usd=math.fsum(o.cost_usd for o in outcomes))


def cluster_cost(scenario: Scenario, jobs: Sequence[SimJob], contender: Contender) -> float:
    """What every job of ``jobs`` costs under ``contender``."""
    ordered = sorted(jobs, key=lambda j: (j.arrival, j.id))
    return math.fsum(o.cost_usd for o in Simulation(scenario, contender).run(ordered))


def compare(scenario: Scenario, trace_jobs: Sequence[SimJob], workload: SweepWorkload, arrival: float,
            contenders: Sequence[Contender]) -> list[SweepReplay]:
    """Replay the trace's jobs plus the sweep under each contender; the sweep's part of each."""
    jobs = sorted([*trace_jobs, *workload.jobs(arrival)], key=lambda j: (j.arrival, j.id))
    return [sweep_outcome(c.name, Simulation(scenario, c).run(jobs), arrival) for c in contenders]


@dataclass(frozen=True)
class EqualCompletion:
    """Ours against all-on-demand with the same completion-time budget, and ours with the workload's own slack."""

    on_demand: SweepReplay
    ours_equal: SweepReplay  # deadline = the all-on-demand sweep's completion time
    ours_slack: SweepReplay  # deadline = the workload's (deadline_slack x the dedicated makespan)
    ours_alone_usd: float = math.nan  # the trace's jobs without the sweep, under ours
    on_demand_alone_usd: float = math.nan  # the same under all-on-demand

    @property
    def meets(self) -> bool:
        """Ours ended no later than all-on-demand (1 s of float tolerance) and missed no trial's deadline."""
        return self.ours_equal.completion_h <= self.on_demand.completion_h + 1 / 3600 and not self.ours_equal.missed

    @property
    def ratio_equal(self) -> float:
        return self.ours_equal.cost_usd / self.on_demand.cost_usd

    @property
    def ratio_slack(self) -> float:
        return self.ours_slack.cost_usd / self.on_demand.cost_usd

    @property
    def ratio_marginal(self) -> float:
        """At equal completion, what adding the sweep costs the cluster under ours (with minus without)
        ÷ the same under all-on-demand."""
        return (self.ours_equal.cluster_usd - self.ours_alone_usd) / (self.on_demand.cluster_usd
                                                                      - self.on_demand_alone_usd)


def compare_at_equal_completion(scenario: Scenario, trace_jobs: Sequence[SimJob], workload: SweepWorkload,
                                arrival: float, ours: Contender, on_demand: Contender) -> EqualCompletion:
    """All-on-demand first; then ours with the sweep's deadline at that completion time, and ours with the slack."""
    od, slack = compare(scenario, trace_jobs, workload, arrival, [on_demand, ours])
    equal = replace(workload, deadline_hours=od.completion_h)
    (eq,) = compare(scenario, trace_jobs, equal, arrival, [ours])
    return EqualCompletion(on_demand=od, ours_equal=eq, ours_slack=slack,
                           ours_alone_usd=cluster_cost(scenario, trace_jobs, ours),
                           on_demand_alone_usd=cluster_cost(scenario, trace_jobs, on_demand))
