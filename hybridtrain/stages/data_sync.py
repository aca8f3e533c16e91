"""DataSync stage: approved data to the training site — policy-checked, counted and priced."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo
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

#: Only versions the workspace's own prepare-data made leave their site; said in every refusal.
ONLY_PREPARED = "only versions made by prepare-data may be synced; nothing was synced"


@dataclass
class _Recorded:
    """What the workspace's audit log says about one dataset version."""

    tier: str
    path: str
    site: str
    #: Sites whose store holds it: where it was promoted, then every earlier sync's destination.
    holders: list[str] = field(default_factory=list)


def _records_of(ws: Workspace, md5: str) -> tuple[list[_Recorded], _Recorded | None]:
    """(its promotions to the approved tier — one per path: two jobs may approve the same content —, what
    else the log knows of it: curated, or the raw input of a promotion), from the ``tier_promotion`` and
    ``sync`` records of the workspace's audit log."""
    approved: dict[str, _Recorded] = {}
    other: _Recorded | None = None
    synced_to: dict[str, list[str]] = {}
    for rec in audit(ws).records():
        inputs = rec.inputs
        if rec.action == "tier_promotion":
            if inputs.get("to_md5") == md5 and rec.outcome.startswith(f"{inputs.get('tier_to')} "):
                found = _Recorded(tier=str(inputs.get("tier_to")), path=str(inputs.get("path")),
                                  site=str(inputs.get("site")))
                if found.tier == "approved":
                    approved.setdefault(found.path, found)
                else:
                    other = other or found
            elif inputs.get("from_md5") == md5 and other is None:
                other = _Recorded(tier=str(inputs.get("tier_from")), path="", site=str(inputs.get("site")))
        elif rec.action == "sync" and rec.subject.endswith(f"@{md5}"):
            synced_to.setdefault(rec.subject.removeprefix("dataset ").rsplit("@", 1)[0], []).append(
                str(inputs.get("destination")))
    for found in approved.values():
        found.holders = [found.site, *synced_to.get(found.path, [])]
    return list(approved.values()), other


def recorded_version(ws: Workspace, approved: DatasetVersion) -> DatasetVersion:
    """``approved`` as this workspace recorded it, or ``SpecError`` naming ``approved``.

    The tier of what a caller hands in is never taken from the caller (a Prefect UI form can say
    ``tier: approved`` of the raw CSV): the version must be one that prepare-data promoted to the
    approved tier here — its ``tier_promotion`` record in the workspace's audit log, written only
    after the data gates and the leak scan passed — with the same path, at a site that holds it
    (where it was promoted, or a site an earlier sync sent it to). Size and file count come from
    the workspace too (the approved tier's ``.dvc`` pointer, else the DVC cache; the caller's only
    when the cache no longer holds it), so the policy's egress cap sees the real bytes. Reads only:
    nothing is created or changed.
    """
    promotions, other = _records_of(ws, approved.md5)
    what = f"{approved.path}@{approved.md5[:8]}"
    found = next((r for r in promotions if r.path == approved.path), None)
    if found is None:
        if promotions:
            why = f"this content was approved as {', '.join(r.path for r in promotions)}, not {approved.path}"
        elif other is not None:
            why = f"its tier is {other.tier}: {other.tier} data may not leave site {other.site}"
        else:
            why = "the workspace has no record of it"
        raise SpecError("sync", [Problem("approved", f"{what} is not an approved dataset version of this workspace "
                                                     f"({why}); {ONLY_PREPARED}")])
    if approved.site not in found.holders:
        raise SpecError("sync", [Problem("approved", f"{what} is not held by site {approved.site} (prepare-data "
                                                     f"approved it at {found.site}); {ONLY_PREPARED}")])
    current = _pointer_version(ws, found.path, approved.md5, approved.site)
    return current if current is not None else approved.model_copy(update={"tier": "approved"})


def _pointer_version(ws: Workspace, path: str, md5: str, site: str) -> DatasetVersion | None:
    """``path`` at ``md5`` with the size and file count the workspace recorded: its ``.dvc`` pointer when that
    is still this version, else the DVC cache's objects; None when neither has it."""
    try:
        repo = DvcRepo(ws.root)
    except SpecError:
        return None
    pointed = repo.version(path, "approved", site)
    if pointed is not None and pointed.md5 == md5:
        return pointed
    return repo.cached_version(path, md5, "approved", site)


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


def sync(ws: Workspace, approved: DatasetVersion, destination: str, spec: JobSpec | None) -> SyncResult:
    """Make ``approved`` available in ``destination``'s store; only missing objects move.

    Only a version this workspace recorded as approved leaves its site (``recorded_version``:
    made by prepare-data, whatever tier the caller wrote on it; DataMover checks that tier again),
    and only to a site the placement policy allows for the job's ``spec`` — which is required: no
    policy check, no sync. A refusal moves nothing and writes no audit record. Every sync is audited.
    """
    started = time.perf_counter()
    if spec is None:
        raise SpecError("sync", [Problem("spec", "the job spec is needed: the placement policy decides where its "
                                                 "data may go; nothing was synced")])
    sites = ws.load_sites()
    sites.get(destination)  # an unknown destination is named (with the known sites) before anything else
    try:
        version = recorded_version(ws, approved)
        refused: SpecError | None = None
    except SpecError as exc:
        version, refused = approved, exc
    if approved.site == destination:
        if refused is not None:
            raise refused
        return SyncResult(dataset=version, transfer=None, site=destination, seconds=0.0)
    # Refusals, all before a byte moves: a version its caller itself calls raw or curated; a site the
    # job's data may not go to (whatever version it sent); a version the workspace never approved.
    DataMover.check_tier(approved, approved.site, destination)
    check_destination(ws, spec, version, destination, sites)
    if refused is not None:
        raise refused
    progress.report("sync", "start", f"sync started: approved {version.path}@{version.md5[:8]} "
                    f"({version.size:,} bytes) {version.site} -> {destination}", done=0, total=version.size or 1,
                    site=version.site, destination=destination)
    repo = workspace_repo(ws, sites, version.site)
    moving = progress.TransferProgress("sync", version.site, destination)
    moved, record = DataMover(repo).sync_dataset(version, sites.get(version.site), sites.get(destination),
                                                 on_progress=moving.update)
    audit(ws).append(actor=ws.actor, action="sync", subject=f"dataset {version.path}@{version.md5}",
                     inputs=record.as_row(), outcome=f"{record.bytes} bytes to {destination}")
    seconds = time.perf_counter() - started
    progress.report("sync", "end", f"sync finished: {record.bytes:,} bytes in {record.files} files, {version.site} -> "
                    f"{destination} in {seconds:.1f} s ({progress.rate(record.bytes, record.seconds)}), egress "
                    f"${record.cost_usd:.4f}", done=version.size or 1, total=version.size or 1, site=version.site,
                    destination=destination, bytes=record.bytes, seconds=seconds)
    return SyncResult(dataset=moved, transfer=record, site=destination, seconds=seconds)
