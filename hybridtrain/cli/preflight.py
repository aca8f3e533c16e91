"""Preflight: what a run checks before it starts anything (Prefect, DVC, MLflow, torch) — is the pinned dataset there?

A fresh clone has the job specs and the ``.dvc`` pointers but not the data they pin: without this
check the run would start a Prefect server and open an MLflow run before DVC found nothing to pull.
Here the missing dataset is one line, naming the command that makes or fetches it, in well under
2 s (nothing heavy is imported). A spec whose ``dataset.md5`` is not the version the checkout
tracks, and that no store here holds, is refused the same way, with the md5 to pin (the message
the prepare-data stage would give after an MLflow run was opened). ``hybridtrain run`` and the
lifecycle and sweep flows (``flows.lifecycle.validate_spec``) call it. Only local stores are looked
at; data on an S3 or SSH store is left for the run's own fetch to find.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from hybridtrain.errors import DataError, DatasetMissing, Problem
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import DVC_SUBDIR, LocalStore, SitesCatalog
from hybridtrain.workspace import Workspace

#: The dataset ``hybridtrain data generate`` makes (jobs/churn.yaml trains on it).
SAMPLE_PATH = "data/raw/churn.csv"


def _object(base: Path, md5: str) -> Path:
    """Where DVC 3 keeps the object ``md5`` under a cache or a local remote."""
    return base / "files" / "md5" / md5[:2] / md5[2:]


def tracked_md5(ws: Workspace, path: str) -> str | None:
    """The md5 the checkout's ``<path>.dvc`` pointer records; None when there is no readable pointer."""
    try:
        data = yaml.safe_load(ws.path(f"{path}.dvc").read_text())
        return str(data["outs"][0]["md5"])
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
        return None


def check_dataset(ws: Workspace, job: JobSpec, sites: SitesCatalog, spec_name: str) -> None:
    """Raise when the job's pinned raw dataset is nowhere a run could read it.

    Present: the checkout tracks the pinned md5 and has the file, or the DVC cache or the data
    site's local store holds that version. A data site whose store is not local (S3, SSH) is not
    looked at. ``DataError`` (``dataset.md5``) when the checkout tracks another version: the pin is
    wrong, or that version was never pushed; ``DatasetMissing`` (one line with the fix) otherwise.
    """
    ds = job.dataset
    have = tracked_md5(ws, ds.path)
    if have == ds.md5 and ws.path(ds.path).exists():
        return
    if have is None and ws.path(ds.path).exists() and not ws.path(f"{ds.path}.dvc").exists():
        return  # an untracked file: the run's own fetch says what to do (`dvc add` it)
    if _object(ws.root / ".dvc" / "cache", ds.md5).exists():
        return
    site = sites.get(ds.site)
    if not isinstance(site.store, LocalStore):
        return  # a remote store: the run's fetch says whether it has the version
    if _object(Path(site.store_url(ws.root)) / DVC_SUBDIR, ds.md5).exists():
        return
    if have is not None and have != ds.md5:
        # The same words as the prepare-data stage (``stages.preprocessing.resolve_raw``), before anything ran.
        raise DataError(ds.path, [Problem("dataset.md5", (
            f"pinned version {ds.md5} is not in the store of site {ds.site} (the workspace has {have}); "
            f"set dataset.md5 to {have} or push the pinned version"))])
    if ds.path == SAMPLE_PATH and spec_name.endswith((".yaml", ".yml")):
        fix = f"run `hybridtrain data generate --pin {spec_name}` to make the churn sample and pin it"
    elif ds.path == SAMPLE_PATH:  # a spec given as a form: nothing to --pin
        fix = "run `hybridtrain data generate` to make the churn sample and set dataset.md5 to the md5 it prints"
    else:
        fix = f"`dvc pull {ds.path}` from where it is stored, or `dvc add {ds.path}` and pin its md5"
    raise DatasetMissing(ds.path, f"dataset {ds.path} (md5 {ds.md5[:8]}, pinned by {spec_name}) is not in this "
                                  f"checkout, its DVC cache or the {site.name} store: {fix}")
