"""ModeDecision: centralized or federated training for a job, from its data sites and the placement policy, with the reasons.

``training.mode: auto`` picks federated when the data is split across sites (``dataset.sites``):
raw data never leaves its site, and no site holds all of it. The decision also says whether a
centralized run would even be allowed — one site that the policy lets hold every site's approved
part — and, when not, which rule refused each candidate. For federated training it checks what
federated training needs from the policy: each data site may train on its own part, and each
site's model update may go to the aggregation site (the same check as for its data).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.policy import Policy, capacity_options
from hybridtrain.placement.request import ResourceRequest, request_from_spec
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import SitesCatalog

Mode = Literal["centralized", "federated"]


@dataclass(frozen=True)
class ModeDecision:
    """The chosen training mode, the data sites, the aggregator and why."""

    mode: Mode
    data_sites: tuple[str, ...]
    aggregation_site: str | None
    reasons: list[str] = field(default_factory=list)
    #: Training site -> the rule that keeps it from holding every part ("rules[i] (name): reason").
    centralized_rejections: dict[str, str] = field(default_factory=dict)

    @property
    def federated(self) -> bool:
        return self.mode == "federated"

    def lines(self) -> list[str]:
        out = [f"training mode: {self.mode}"] + [f"  - {r}" for r in self.reasons]
        if self.centralized_rejections:
            out.append("  centralized candidates refused:")
            out += [f"    - {site}: {why}" for site, why in self.centralized_rejections.items()]
        return out


def default_aggregation_site(spec: JobSpec, sites: SitesCatalog, control_site: str | None = None) -> str:
    """``training.federated.aggregation_site``, else the control plane's site (the first on-prem site)."""
    if spec.training.federated.aggregation_site:
        return spec.training.federated.aggregation_site
    if control_site:
        return control_site
    return next((s.name for s in sites.sites if s.kind.value == "onprem"), sites.sites[0].name)


def _first_rejection(policy: Policy, request: ResourceRequest, sites: SitesCatalog, site_name: str,
                     data_sites: list[str]) -> str | None:
    """None when some capacity class of ``site_name`` may hold every data site's part; else the
    first rule that refused it (for the best class)."""
    site = sites.get(site_name)
    first = None
    for klass in capacity_options(site):
        refused = None
        for data_site in data_sites:
            v = policy.evaluate(dataclasses.replace(request, data_site=data_site), site, klass)
            if not v.allowed:
                refused = f"{v.rule}: {v.reason}" + (f" (data of {data_site})" if len(data_sites) > 1 else "")
                break
        if refused is None:
            return None
        first = first or refused
    return first


def update_route_rejection(policy: Policy, spec: JobSpec, sites: SitesCatalog, data_site: str,
                           aggregation_site: str, now: datetime | float) -> str | None:
    """Why the policy refuses ``data_site``'s model update at ``aggregation_site`` (None: allowed).

    An update is derived from the site's approved data, so it gets the same check as that data
    would — sensitivity, residency, jurisdictions, site kinds, the spec's limits, every rule —
    without the GPU needs of training, and with one exception: ``stay_at_data_site`` keeps the
    data itself at home, and a model update is not the data (that rule is what makes a job
    federated in the first place)."""
    if data_site == aggregation_site:
        return None
    request = dataclasses.replace(request_from_spec(spec, dataset_bytes=0, now=now), data_site=aggregation_site,
                                  gpus=0, gpu_type=None, pinned_site=None)
    why = _first_rejection(policy, request, sites, aggregation_site, [aggregation_site])
    return None if why is None else f"{why} (update of {data_site})"


def decide_mode(spec: JobSpec, sites: SitesCatalog, policy: Policy, now: datetime | float,
                control_site: str | None = None) -> ModeDecision:
    """Centralized or federated for ``spec``, and why. ``SpecError`` when federated training is
    chosen (or asked for) but the policy refuses a site's local training or its update's route."""
    parts = spec.site_datasets()
    data_sites = [d.site for d in parts]
    requested = spec.training.mode
    if requested == "centralized" or (requested == "auto" and len(parts) == 1):
        why = ("training.mode: centralized" if requested == "centralized"
               else f"training.mode: auto and the data is at one site ({data_sites[0]}): the placement engine "
                    "picks the training site")
        return ModeDecision("centralized", tuple(data_sites), None, [why])

    request = dataclasses.replace(request_from_spec(spec, dataset_bytes=0, now=now), pinned_site=None)
    rejections = {}
    allowed_central = []
    for site in sites.sites:
        why = _first_rejection(policy, request, sites, site.name, data_sites)
        if why is None:
            allowed_central.append(site.name)
        else:
            rejections[site.name] = why
    reasons = []
    if requested == "federated":
        reasons.append("training.mode: federated")
    if len(parts) > 1:
        reasons.append(f"the data is split across {len(parts)} sites ({', '.join(data_sites)}), and raw data never "
                       "leaves its site: each site trains on its own part and only model updates travel")
    if allowed_central:
        reasons.append(f"centralized training on every site's approved part would be allowed at "
                       f"{', '.join(allowed_central)}, but would move the data itself")
    else:
        reasons.append("centralized training is not allowed: the policy lets no site hold every site's approved part "
                       "(the rule refusing each site is listed)")
    aggregator = default_aggregation_site(spec, sites, control_site)
    problems = []
    for i, site_name in enumerate(data_sites):
        field_path = "dataset.site" if i == 0 else f"dataset.sites[{i - 1}].site"
        local = _first_rejection(policy, request, sites, site_name, [site_name])
        if local is not None:
            problems.append(Problem(field_path, f"federated training needs site {site_name} to train on its own "
                                                f"part, but the policy refuses it ({local})"))
        route = update_route_rejection(policy, spec, sites, site_name, aggregator, now)
        if route is not None:
            problems.append(Problem(field_path, f"the model update of site {site_name} may not go to the aggregation "
                                                f"site {aggregator} ({route}); set training.federated."
                                                "aggregation_site to a site the policy allows"))
    if problems:
        raise SpecError(f"job {spec.name}", problems)
    fed = spec.training.federated
    reasons.append(f"aggregation at {aggregator} ({fed.aggregator}"
                   + (f", mu {fed.mu:g}" if fed.aggregator == "fedprox" else "")
                   + f"), {fed.rounds} rounds of {fed.local_epochs} local epoch(s); a round needs "
                   f"{required_sites(spec)} of {len(data_sites)} sites; every update is policy-checked, recorded "
                   "and charged like data")
    if fed.secure_aggregation:
        reasons.append("secure aggregation (training.federated.secure_aggregation): each site sends its update "
                       "masked with pairwise masks that cancel in the sum; the aggregator learns only the weighted "
                       "mean, and a site that drops out makes the others mask again (no retraining)")
    return ModeDecision("federated", tuple(data_sites), aggregator, reasons,
                        rejections if not allowed_central else {})


def required_sites(spec: JobSpec) -> int:
    """Updates a round needs: ``min_sites`` and ``min_fraction`` of the data sites, whichever is more."""
    import math

    fed = spec.training.federated
    n = len(spec.site_datasets())
    return min(n, max(fed.min_sites, math.ceil(fed.min_fraction * n - 1e-9)))
