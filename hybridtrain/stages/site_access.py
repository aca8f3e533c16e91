"""SiteAccess: how a stage reaches a site from its workspace — DVC repos, checkpoint store, audit log."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR, DVC_SUBDIR, Site, SitesCatalog
from hybridtrain.storage import open_store
from hybridtrain.storage.object_store import ObjectStore
from hybridtrain.workspace import Workspace

if TYPE_CHECKING:
    pass



# -- environment -----------------------------------------------------------------------------


def audit(ws: Workspace) -> Any:
    """The workspace's append-only audit log, its head signed with the workspace's audit key."""
    from hybridtrain.governance.audit_key import workspace_log

    return workspace_log(ws.root)


def control_site(ws: Workspace, sites: SitesCatalog) -> Site:
    """The site hosting the control plane (Prefect server, MLflow): ``HYBRIDTRAIN_CONTROL_SITE`` or the
    first on-prem site of the catalog. Bytes sent to it from another site cross a boundary."""
    if ws.control_site:
        return sites.get(ws.control_site)
    return next((x for x in sites.sites if x.kind.value == "onprem"), sites.sites[0])


def remotes_for(ws: Workspace, sites: SitesCatalog) -> dict[str, dict[str, str]]:
    """Every site's store as a DVC remote section (no secrets) named after the site."""
    return {s.dvc_remote: s.dvc_remote_config(ws.root, DVC_SUBDIR) for s in sites.sites}


def remote_secrets_for(sites: SitesCatalog) -> dict[str, dict[str, str]]:
    """Credentials of every site's store, per DVC remote — handed to DvcRepo in memory only."""
    return {s.dvc_remote: secrets for s in sites.sites if (secrets := s.dvc_remote_secrets())}


def workspace_repo(ws: Workspace, sites: SitesCatalog, data_site: str) -> DvcRepo:
    """The workspace's DVC repo (the on-prem gateway checkout), remotes from the sites catalog.

    Local state (site working copies, MLflow artifacts) lives under ``.hybridtrain/`` inside the
    workspace; it holds DVC repos and pointers of its own, which the workspace repo must ignore.
    """
    repo = DvcRepo.ensure(ws.root, remotes_for(ws, sites), default_remote=sites.get(data_site).dvc_remote,
                          secrets=remote_secrets_for(sites))
    repo.ignore(f"/{ws.state_dir.name}/")
    return repo


def site_repo(ws: Workspace, site: Site) -> DvcRepo:
    """A site's own working copy: what a host at that site would have — its cache, its store."""
    remote = {site.dvc_remote: site.dvc_remote_config(ws.root, DVC_SUBDIR)}
    return DvcRepo.ensure(ws.site_workdir(site.name), remote, default_remote=site.dvc_remote, scm=False,
                          secrets={site.dvc_remote: site.dvc_remote_secrets()})


def checkpoint_store(ws: Workspace, site: Site) -> ObjectStore:
    """The site's object store (checkpoints, artifacts) as an ObjectStore: a directory or an S3 bucket."""

    return open_store(site.store, ws.root, CHECKPOINT_SUBDIR, site=site.name)


def dataset_at(ws: Workspace, sites: SitesCatalog, version: DatasetVersion, site: str, data_site: str) -> Path:
    """Local directory holding ``version`` for a stage running at ``site``."""
    if site == data_site:
        repo = workspace_repo(ws, sites, data_site)
        if not repo.is_present(version):
            repo.checkout(version, remote=sites.get(data_site).dvc_remote)
        return ws.path(version.path)
    s = sites.get(site)
    return site_repo(ws, s).pull_pointer(version, remote=s.dvc_remote)
