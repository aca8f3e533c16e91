"""Lineage: what a model version was made from — dataset versions, spec, code, site, data moved.

Written as MLflow tags on the run and the model version (``hybridtrain.*`` keys), so a
version can be traced back to the exact DVC hashes of its raw, curated and approved data,
the spec that asked for it and the code commit that built it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pydantic import BaseModel

from hybridtrain.datasets.dvc_repo import DatasetVersion

PREFIX = "hybridtrain."


def code_version(root: Path) -> str:
    """Git commit of the workspace (suffix ``-dirty`` with uncommitted changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


class Lineage(BaseModel):
    job: str
    spec_hash: str
    code_version: str
    raw: DatasetVersion
    curated: DatasetVersion
    approved: DatasetVersion
    train_site: str
    bytes_synced: int
    duration_s: float
    flow_run_id: str | None = None

    def tags(self) -> dict[str, str]:
        t = {
            "job": self.job,
            "spec_hash": self.spec_hash,
            "code_version": self.code_version,
            "site": self.train_site,
            "bytes_synced": str(self.bytes_synced),
            "duration_s": f"{self.duration_s:.1f}",
        }
        for ds in (self.raw, self.curated, self.approved):
            t[f"dataset.{ds.tier}.md5"] = ds.md5
            t[f"dataset.{ds.tier}.path"] = ds.path
        if self.flow_run_id:
            t["prefect_flow_run_id"] = self.flow_run_id
        return {PREFIX + k: v for k, v in t.items()}
