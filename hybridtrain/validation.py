"""Validation: a job spec checked against everything it names — sites, policy, gates, release targets.

``specs.job`` checks what one spec file says on its own (types, columns, splits, features);
this module adds what the spec *names* elsewhere: the sites catalog (``dataset.site``,
``placement.site``, object-store release targets), the placement policy (``placement.strategy``,
``placement.job_class``), the promotion gate registry (``promotion.gates``) and the release
target kinds (``promotion.release_targets[].kind``) and the sweep samplers and pruners
(``sweep.sampler.name``, ``sweep.pruner.name``). ``hybridtrain validate``, ``plan``, ``run``,
the lifecycle and sweep flows and the drill load specs through here, so a spec that names a strategy the
policy does not know is refused before anything runs, together with every other problem::

    jobs/churn.yaml: 2 problems found; fix and re-run:
      - placement.strategy (line 98): unknown strategy 'fastest-ever'; choose one of: ...
      - model.epochs (line 61): Input should be greater than or equal to 1

Keeping these checks here (not in ``specs.job``) keeps the spec models free of the governance
and placement packages, which themselves import the spec: no import cycle, hidden or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridtrain.errors import Problem
from hybridtrain.governance.gates import GATES
from hybridtrain.governance.release import TARGET_KINDS
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.strategy import STRATEGIES
from hybridtrain.specs.config_file import load_model, read_yaml, validate_data
from hybridtrain.specs.job import JobSpec, check_semantics
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.sweeps.registry import PRUNERS, SAMPLERS

#: The ``kind:`` of each config file ``validate_file`` knows (a file without one is a job spec).
KINDS = ("TrainingJob", "SitesCatalog", "PlacementPolicy")


def job_problems(spec: JobSpec, sites: SitesCatalog | None = None, policy: Policy | None = None) -> list[Problem]:
    """Every problem of ``spec``: its own rules, then what it names in ``sites``, ``policy`` and the registries."""
    return [*check_semantics(spec, sites), *promotion_problems(spec, sites), *placement_problems(spec, policy),
            *sweep_problems(spec, policy)]


def sweep_problems(spec: JobSpec, policy: Policy | None = None) -> list[Problem]:
    """``sweep.sampler.name`` and ``sweep.pruner.name`` must be registered samplers and pruners, and
    ``sweep.job_class`` (the trials' placement class) a class of the policy."""
    p: list[Problem] = []
    if spec.sweep is None:
        return p
    if spec.sweep.sampler.name not in SAMPLERS:
        p.append(Problem("sweep.sampler.name", SAMPLERS.unknown_message(spec.sweep.sampler.name)))
    if spec.sweep.pruner.name not in PRUNERS:
        p.append(Problem("sweep.pruner.name", PRUNERS.unknown_message(spec.sweep.pruner.name)))
    job_class = spec.sweep.job_class
    if policy is not None and job_class not in policy.job_classes:
        p.append(Problem("sweep.job_class", f"unknown job class {job_class!r}; the policy knows: "
                                            f"{', '.join(sorted(policy.job_classes))}"))
    return p


def placement_problems(spec: JobSpec, policy: Policy | None) -> list[Problem]:
    """``placement.strategy`` must be a registered strategy; ``placement.job_class`` a class of the policy."""
    p: list[Problem] = []
    strategy = spec.placement.strategy
    if strategy is not None and strategy not in STRATEGIES:
        p.append(Problem("placement.strategy", STRATEGIES.unknown_message(strategy)))
    job_class = spec.placement.job_class
    if policy is not None and job_class is not None and job_class not in policy.job_classes:
        p.append(Problem("placement.job_class", f"unknown job class {job_class!r}; the policy knows: "
                                                f"{', '.join(sorted(policy.job_classes))}"))
    return p


def promotion_problems(spec: JobSpec, sites: SitesCatalog | None) -> list[Problem]:
    """Gate names from the gate registry, release target kinds from the target registry, and their fields."""
    promo = spec.promotion
    p: list[Problem] = []
    if promo.gates is not None:
        if not promo.gates:
            p.append(Problem("promotion.gates", "an empty list would promote without any check; leave gates out to "
                                                "evaluate all of them"))
        seen_gates: set[str] = set()
        for i, name in enumerate(promo.gates):
            if name not in GATES:
                p.append(Problem(f"promotion.gates[{i}]", GATES.unknown_message(name)))
            elif name in seen_gates:
                p.append(Problem(f"promotion.gates[{i}]", f"gate {name!r} is listed twice"))
            seen_gates.add(name)
    chosen = set(promo.gates) if promo.gates is not None else set(GATES.names)
    if promo.max_cost_usd is not None and "cost" not in chosen:
        p.append(Problem("promotion.max_cost_usd", "is set, but the cost gate is not in promotion.gates: add it"))
    if promo.require_approval and "approval" not in chosen:
        p.append(Problem("promotion.require_approval", "is true, but the approval gate is not in promotion.gates: "
                                                       "add it"))
    names: set[str] = set()
    for i, target in enumerate(promo.release_targets):
        path = f"promotion.release_targets[{i}]"
        if target.name in names:
            p.append(Problem(f"{path}.name", f"target name {target.name!r} is used twice; names must be unique"))
        names.add(target.name)
        if target.kind not in TARGET_KINDS:
            p.append(Problem(f"{path}.kind", TARGET_KINDS.unknown_message(target.kind)))
            continue
        for field, message in TARGET_KINDS.get(target.kind).spec_problems(target, sites):
            p.append(Problem(f"{path}.{field}", message))
    return p


def load_job(path: Path | str, sites: SitesCatalog | None = None, policy: Policy | None = None) -> JobSpec:
    """Load a job spec file and check it completely; one ``SpecError`` lists every problem with its line."""
    return load_model(JobSpec, path, semantic=lambda s: job_problems(s, sites, policy))


def parse_job(data: dict[str, Any], source: str = "job spec", sites: SitesCatalog | None = None,
              policy: Policy | None = None) -> JobSpec:
    """``load_job`` for a spec given as a mapping (a Prefect parameter, a generated spec)."""
    return validate_data(JobSpec, data, source=source, semantic=lambda s: job_problems(s, sites, policy))


def kind_of(path: Path | str) -> str:
    """The ``kind:`` a config file declares (``TrainingJob`` when it declares none); ``SpecError`` if unreadable."""
    data, _ = read_yaml(Path(path))
    kind = data.get("kind", "TrainingJob") if isinstance(data, dict) else "TrainingJob"
    return kind if isinstance(kind, str) and kind in KINDS else "TrainingJob"


def validate_file(path: Path | str, sites_file: Path | None = None, policy_file: Path | None = None) -> str:
    """Check one config file of any kind completely (a job against ``sites_file`` and ``policy_file`` when
    they exist); return its kind, or raise ``SpecError`` listing every problem."""
    kind = kind_of(path)
    if kind == "SitesCatalog":
        SitesCatalog.load(path)
    elif kind == "PlacementPolicy":
        sites = SitesCatalog.load(sites_file) if sites_file is not None and Path(sites_file).is_file() else None
        Policy.load(path, sites)
    else:
        sites = SitesCatalog.load(sites_file) if sites_file is not None and Path(sites_file).is_file() else None
        policy = (Policy.load(policy_file, sites)
                  if policy_file is not None and Path(policy_file).is_file() else None)
        load_job(path, sites, policy)
    return kind
