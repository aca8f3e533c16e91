"""Transfer: the one place where bytes cross a site boundary, and the record each crossing leaves.

Every movement of data between sites goes through ``DataMover``, which refuses what may not
leave (only ``approved`` data leaves its site), moves only what the destination lacks, and
returns a ``TransferRecord``: source, destination, what, bytes, files, seconds and the egress
price that applied. Records are attached to the run (MLflow tags, Prefect artifact) and feed
the cost ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.sites import Site

GB = 1_000_000_000


class TransferRecord(BaseModel):
    """One crossing of a site boundary."""

    source: str
    destination: str
    what: str = Field(description="Dataset path@md5, checkpoint key or bundle name.")
    bytes: int
    files: int
    seconds: float
    egress_per_gb: float
    cost_usd: float
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def throughput_mb_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_row(self) -> dict[str, str | int | float]:
        return {
            "source": self.source,
            "destination": self.destination,
            "what": self.what,
            "bytes": self.bytes,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "egress_usd_per_gb": self.egress_per_gb,
            "cost_usd": round(self.cost_usd, 6),
        }


def egress_cost(nbytes: int, source: Site) -> float:
    """Egress is charged by the sending site, per decimal GB."""
    return nbytes / GB * source.egress_per_gb


class DataMover:
    """Moves datasets between site stores through DVC remotes, counting every byte."""

    def __init__(self, repo: DvcRepo):
        self.repo = repo

    @staticmethod
    def check_tier(version: DatasetVersion, source: str, destination: str) -> None:
        """Only approved data (anonymized and leak-scanned) may leave its site."""
        if version.tier != "approved" and source != destination:
            raise SpecError(
                version.path,
                [Problem("tier", f"{version.tier} data may not leave site {source}; only approved data "
                                 "(anonymized and leak-scanned) may be synced")],
            )

    def sync_dataset(self, version: DatasetVersion, source: Site, destination: Site) -> tuple[DatasetVersion, TransferRecord]:
        """Push ``version`` from ``source`` to ``destination``'s store; only missing objects move."""
        self.check_tier(version, source.name, destination.name)
        result = self.repo.push(version, remote=destination.dvc_remote)
        record = TransferRecord(
            source=source.name,
            destination=destination.name,
            what=f"{version.path}@{version.md5}",
            bytes=result.bytes,
            files=result.files,
            seconds=result.seconds,
            egress_per_gb=source.egress_per_gb,
            cost_usd=egress_cost(result.bytes, source),
        )
        return version.at(destination.name), record
