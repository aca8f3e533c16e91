"""DataSync stage: approved data to the training site — policy-checked, counted and priced."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import DataMover
from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.policy import Policy, capacity_options
from hybridtrain.placement.request import request_from_spec
from hybridtrain.reporting import progress
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.stages.results import SyncResult
from hybridtrain.stages.site_access import audit, workspace_repo
from hybridtrain.workspace import Workspace


def check_destination(ws: Workspace, spec: JobSpec, approved: DatasetVersion, destination: str,
                      sites: SitesCatalog) -> None:
    """Refuse to send ``spec``'s data to a site the placement policy does not allow for it."""

    policy = Policy.load(ws.policy_file, sites)
    request = request_from_spec(spec, dataset_bytes=approved.size, now=datetime.now(UTC))
    site = sites.get(destination)
    verdicts = [policy.evaluate(request, site, k) for k in capacity_options(site)]
    if not any(v.allowed for v in verdicts):
        why = "; ".join(f"{v.rule}: {v.reason}" for v in verdicts)
        raise SpecError(f"job {spec.name}", [Problem(
            "placement", f"the policy does not allow this job's data at site {destination} ({why}); nothing was "
                         "synced")])


def sync(ws: Workspace, approved: DatasetVersion, destination: str, spec: JobSpec | None = None) -> SyncResult:
    """Make ``approved`` available in ``destination``'s store; only missing objects move.

    Only approved data may leave its site (DataMover enforces the tier) and, given the job's
    ``spec``, only to a site the placement policy allows for it. Every sync is audited.
    """
    started = time.perf_counter()
    sites = ws.load_sites()
    if approved.site == destination:
        return SyncResult(dataset=approved, transfer=None, site=destination, seconds=0.0)
    DataMover.check_tier(approved, approved.site, destination)
    if spec is not None:
        check_destination(ws, spec, approved, destination, sites)
    progress.report("sync", "start", f"sync started: approved {approved.path}@{approved.md5[:8]} "
                    f"({approved.size:,} bytes) {approved.site} -> {destination}", done=0, total=approved.size or 1,
                    site=approved.site, destination=destination)
    repo = workspace_repo(ws, sites, approved.site)
    moving = progress.TransferProgress("sync", approved.site, destination)
    moved, record = DataMover(repo).sync_dataset(approved, sites.get(approved.site), sites.get(destination),
                                                 on_progress=moving.update)
    audit(ws).append(actor=ws.actor, action="sync", subject=f"dataset {approved.path}@{approved.md5}",
                     inputs=record.as_row(), outcome=f"{record.bytes} bytes to {destination}")
    seconds = time.perf_counter() - started
    progress.report("sync", "end", f"sync finished: {record.bytes:,} bytes in {record.files} files, {approved.site} -> "
                    f"{destination} in {seconds:.1f} s ({progress.rate(record.bytes, record.seconds)}), egress "
                    f"${record.cost_usd:.4f}", done=approved.size or 1, total=approved.size or 1, site=approved.site,
                    destination=destination, bytes=record.bytes, seconds=seconds)
    return SyncResult(dataset=moved, transfer=record, site=destination, seconds=seconds)
