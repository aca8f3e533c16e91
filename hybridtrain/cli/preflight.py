"""Preflight: what ``hybridtrain run`` checks before it starts anything (Prefect, DVC, MLflow, torch).

A fresh clone has the job specs and the ``.dvc`` pointers but not the data they pin: without this
check the run would start a Prefect server and open an MLflow run before DVC found nothing to pull.
Here the missing dataset is one line, naming the command that makes or fetches it, in well under
2 s (nothing heavy is imported). Only local stores are looked at; data on an S3 or SSH store is
left for the run's own fetch to find.
"""

from __future__ import annotations

from pathlib import Path

from hybridtrain.errors import DatasetMissing
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import DVC_SUBDIR, LocalStore, SitesCatalog
from hybridtrain.workspace import Workspace

#: The dataset ``hybridtrain data generate`` makes (jobs/churn.yaml trains on it).
SAMPLE_PATH = "data/raw/churn.csv"


def _object(base: Path, md5: str) -> Path:
    """Where DVC 3 keeps the object ``md5`` under a cache or a local remote."""
    return base / "files" / "md5" / md5[:2] / md5[2:]


def check_dataset(ws: Workspace, job: JobSpec, sites: SitesCatalog, spec_name: str) -> None:
    """Raise ``DatasetMissing`` (one line with the fix) when the job's raw dataset is nowhere a run could read it."""
    ds = job.dataset
    if ws.path(ds.path).exists() or _object(ws.root / ".dvc" / "cache", ds.md5).exists():
        return
    site = sites.get(ds.site)
    if not isinstance(site.store, LocalStore):
        return  # a remote store: the run's fetch says whether it has the version
    if _object(Path(site.store_url(ws.root)) / DVC_SUBDIR, ds.md5).exists():
        return
    if ds.path == SAMPLE_PATH:
        fix = f"run `hybridtrain data generate --pin {spec_name}` to make the churn sample and pin it"
    else:
        fix = f"`dvc pull {ds.path}` from where it is stored, or `dvc add {ds.path}` and pin its md5"
    raise DatasetMissing(ds.path, f"dataset {ds.path} (md5 {ds.md5[:8]}, pinned by {spec_name}) is not in this "
                                  f"checkout, its DVC cache or the {site.name} store: {fix}")
