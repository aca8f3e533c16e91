"""Preprocessing stage: the pinned raw dataset → the curated one, versioned and stored on-prem."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.preprocess import Preprocessor
from hybridtrain.errors import DataError, Problem
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass

from hybridtrain.stages.results import PreprocessResult
from hybridtrain.stages.site_access import audit, site_repo, workspace_repo


def resolve_raw(ws: Workspace, spec: JobSpec, sites: SitesCatalog) -> tuple[DatasetVersion, Path]:
    """The pinned raw version and a local path holding exactly it (pulled by pointer if needed)."""
    ref = spec.dataset
    repo = workspace_repo(ws, sites, ref.site)
    current = repo.version(ref.path, "raw", ref.site)
    if current is not None and current.md5 == ref.md5:
        if not repo.is_present(current):
            repo.checkout(current, remote=sites.get(ref.site).dvc_remote)
        return current, ws.path(ref.path)
    if current is None and not ws.path(ref.path).exists():
        raise DataError(ref.path, [Problem("dataset.path", f"{ref.path} is not tracked by DVC in {ws.root}; "
                                                           f"track it with `dvc add {ref.path}` and pin its md5, or, "
                                                           "for the churn sample, run `hybridtrain data generate`")])
    pinned = DatasetVersion(path=ref.path, md5=ref.md5, size=0, tier="raw", site=ref.site)
    # The workspace holds another version: fetch the pinned one by its hash into the site copy.
    site = sites.get(ref.site)
    try:
        path = site_repo(ws, site).pull_pointer(pinned, remote=site.dvc_remote)
    except DataError:
        have = current.md5 if current else "nothing"
        raise DataError(
            ref.path,
            [Problem("dataset.md5", f"pinned version {ref.md5} is not in the store of site {ref.site} "
                                    f"(the workspace has {have}); set dataset.md5 to {have} or push the pinned "
                                    "version")],
        ) from None
    return pinned, path


def preprocess(ws: Workspace, spec: JobSpec) -> PreprocessResult:
    """Raw (pinned) → curated: validate, clean, split, partition; version and store on-prem."""
    started = time.perf_counter()
    sites = ws.load_sites()
    site = spec.dataset.site
    progress.report("preprocess", "start", f"preprocess started at {site}: {spec.dataset.path}@{spec.dataset.md5[:8]}", site=site)
    raw, raw_path = resolve_raw(ws, spec, sites)
    curated_path = ws.tier_path("curated", spec.name)
    report = Preprocessor(spec).run(raw_path, ws.path(curated_path))
    repo = workspace_repo(ws, sites, site)
    curated = repo.add(curated_path, "curated", site)
    repo.push(curated, remote=sites.get(site).dvc_remote)  # within the site: versioned, not a crossing
    audit(ws).append(actor=ws.actor, action="tier_promotion", subject=f"dataset {curated_path}",
                     inputs={"path": curated_path, "tier_from": "raw", "tier_to": "curated", "from_md5": raw.md5,
                             "to_md5": curated.md5, "spec_hash": spec.spec_hash(), "site": site,
                             "reason": "schema validated, cleaned, split and partitioned", "report": report.as_dict()},
                     outcome=f"curated {curated.md5}")
    rep, seconds = report.as_dict(), time.perf_counter() - started
    progress.report("preprocess", "end", f"preprocess finished at {site} in {seconds:.1f} s: {rep.get('rows_in')} rows "
                    f"in, {rep.get('rows_out')} curated (curated md5 {curated.md5[:8]})", site=site, seconds=seconds)
    return PreprocessResult(raw=raw, curated=curated, report=rep, site=site, seconds=seconds)
