"""FederationChecks: the cross-field rules of ``dataset.sites`` and ``training`` in a job spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridtrain.errors import Problem

if TYPE_CHECKING:
    from hybridtrain.specs.job import JobSpec
    from hybridtrain.specs.sites import SitesCatalog


def federation_problems(spec: JobSpec, sites: SitesCatalog | None) -> list[Problem]:
    """Every problem with the job's data sites and training mode (``check_semantics`` adds them)."""
    p: list[Problem] = []
    parts = spec.site_datasets()
    seen_sites = {spec.dataset.site: "dataset.site"}
    seen_paths = {spec.dataset.path: "dataset.path"}
    for i, part in enumerate(spec.dataset.sites):
        path = f"dataset.sites[{i}]"
        if part.site in seen_sites:
            p.append(Problem(f"{path}.site", f"site {part.site!r} already holds a part ({seen_sites[part.site]}); "
                                             "list each site once"))
        seen_sites.setdefault(part.site, f"{path}.site")
        if part.path in seen_paths:
            p.append(Problem(f"{path}.path", f"{part.path} is also {seen_paths[part.path]}; give each site's part "
                                             "its own path (e.g. data/raw/churn-<site>.csv)"))
        seen_paths.setdefault(part.path, f"{path}.path")
        if sites is not None and part.site not in sites.names:
            p.append(Problem(f"{path}.site", f"unknown site {part.site!r}; known: {', '.join(sites.names)}"))
    mode = spec.training.mode
    fed = spec.training.federated
    if mode == "centralized" and len(parts) > 1:
        p.append(Problem("training.mode", f"the data is split across {len(parts)} sites (dataset.sites) and raw data "
                                          "never leaves its site: use federated (or auto)"))
    if mode != "centralized" and fed.min_sites > len(parts):
        p.append(Problem("training.federated.min_sites", f"is {fed.min_sites}, but only {len(parts)} site(s) hold "
                                                         "data; lower it or add sites to dataset.sites"))
    if fed.aggregator == "fedprox" and fed.mu == 0:
        p.append(Problem("training.federated.mu", "fedprox with mu 0 is plain fedavg: set mu > 0 (e.g. 0.01) or "
                                                  "aggregator: fedavg"))
    if mode == "centralized" and fed.dp is not None:
        p.append(Problem("training.federated.dp", "differential privacy applies to federated training only; remove "
                                                  "dp or set training.mode: federated"))
    if len(parts) > 1 and spec.placement.site is not None:
        p.append(Problem("placement.site", "pins one training site, but federated training trains at every data "
                                           "site: remove it (training.federated.aggregation_site picks the "
                                           "aggregator)"))
    if (mode == "federated" or len(parts) > 1) and spec.resources.nodes > 1:
        p.append(Problem("resources.nodes", f"is {spec.resources.nodes}, but federated training trains each site's "
                                            "rounds on one host: set resources.nodes: 1 (resources.gpus gives the "
                                            "round more GPUs on that host)"))
    if sites is not None and fed.aggregation_site is not None and fed.aggregation_site not in sites.names:
        p.append(Problem("training.federated.aggregation_site",
                         f"unknown site {fed.aggregation_site!r}; known: {', '.join(sites.names)}"))
    if fed.secure_aggregation:
        p += _secure_aggregation_problems(spec)
    return p


def _secure_aggregation_problems(spec: JobSpec) -> list[Problem]:
    parts = spec.site_datasets()
    p: list[Problem] = []
    if spec.training.mode == "centralized":
        p.append(Problem("training.federated.secure_aggregation", "applies to federated training only; remove it or "
                                                                  "set training.mode: federated"))
    elif len(parts) < 2:
        p.append(Problem("training.federated.secure_aggregation", "needs at least 2 data sites (with one, the sum is "
                                                                  "that site's update): add sites to dataset.sites "
                                                                  "or remove it"))
    return p
