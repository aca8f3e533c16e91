"""Transfer: the one place where bytes cross a site boundary, and the record each crossing leaves.

Every movement of data between sites goes through ``DataMover``, which refuses what may not
leave (only ``approved`` data leaves its site; the sync stage gives it the version as the
workspace recorded it, never a caller's claim), moves only what the destination lacks, and
returns a ``TransferRecord``: source, destination, what, bytes, files, seconds and the egress
price that applied. Records are attached to the run (MLflow tags, Prefect artifact) and feed
the cost ledger. The model bytes of federated training (updates, global weights, feature
statistics) cross through ``ModelMover`` and leave the same records.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from hybridtrain.datasets.dvc_repo import DatasetVersion, DvcRepo, PushProgress
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.sites import Site
from hybridtrain.storage.object_store import ObjectStore

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
        """Only approved data (anonymized and leak-scanned) may leave its site.

        This checks the tier ``version`` carries, so that tier must come from the workspace's own
        records, never from whoever asked for the sync: the sync stage hands over the version as
        prepare-data recorded it (``stages.data_sync.recorded_version``), not the one it was given.
        """
        if version.tier != "approved" and source != destination:
            raise SpecError(
                version.path,
                [Problem("tier", f"{version.tier} data may not leave site {source}; only approved data "
                                 "(anonymized and leak-scanned) may be synced")],
            )

    def sync_dataset(self, version: DatasetVersion, source: Site, destination: Site,
                     on_progress: PushProgress | None = None) -> tuple[DatasetVersion, TransferRecord]:
        """Push ``version`` from ``source`` to ``destination``'s store; only missing objects move.

        ``on_progress`` follows the push: ``(files done, files to move, bytes done, bytes to move)``.
        """
        self.check_tier(version, source.name, destination.name)
        result = self.repo.push(version, remote=destination.dvc_remote, on_progress=on_progress)
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


class ModelMover:
    """Moves model bytes — federated updates, global weights, feature statistics — between site stores, counting every byte.

    The model counterpart of ``DataMover``: the caller checks the policy for the route first (an
    update is derived from its site's approved data and gets the same check), and every crossing
    returns a ``TransferRecord`` for the run's ledger. Within one site nothing is recorded.
    """

    @staticmethod
    def send(data: bytes, store: ObjectStore, key: str, source: Site, destination: Site,
             what: str, exclusive: bool = False) -> TransferRecord | None:
        """Write ``data`` to ``destination``'s ``store`` under ``key``. ``exclusive``: only if nothing else is there
        (``FileExistsError`` when other bytes are; the same bytes, from a retried send, count as sent)."""
        started = time.perf_counter()
        if not exclusive:
            store.put_bytes(key, data)
        elif not store.create(key, data) and store.get_bytes(key) != data:
            raise FileExistsError(f"{key} in {store.url} already holds other bytes; {what} was not sent")
        return ModelMover._record(len(data), source, destination, what, time.perf_counter() - started)

    @staticmethod
    def fetch(store: ObjectStore, key: str, source: Site, destination: Site,
              what: str) -> tuple[bytes, TransferRecord | None]:
        """Read ``key`` from ``source``'s ``store`` into ``destination`` (this process, at that site)."""
        started = time.perf_counter()
        data = store.get_bytes(key)
        return data, ModelMover._record(len(data), source, destination, what, time.perf_counter() - started)

    @staticmethod
    def _record(nbytes: int, source: Site, destination: Site, what: str, seconds: float) -> TransferRecord | None:
        if source.name == destination.name:
            return None
        return TransferRecord(source=source.name, destination=destination.name, what=what, bytes=nbytes, files=1,
                              seconds=seconds, egress_per_gb=source.egress_per_gb,
                              cost_usd=egress_cost(nbytes, source))
