"""HostRound: the host side of a federated round over SSH — a round bundle in, the site's update in the round store, a report out.

``python -m hybridtrain.federated.host_round BUNDLE_DIR`` on an SSH host of a data site (started
by ``hybridtrain.federated.remote_round``):

1. reads the RoundBundle — a ``JobBundle`` (spec, approved pointer, site, run key) plus the
   round, the global featurizer and the aggregation site — and validates its spec;
2. fetches the site's approved part by its DVC pointer from the site's own store into the
   host's working copy ``<workdir>/data-copy`` (the same fetch as a centralized host job; raw
   data is never here, and the approved rows never leave the site);
3. reads the global model of round N-1 from the round store at the aggregation site and trains
   ``local_epochs`` from it (``train_local``: FedAvg or FedProx, DP-SGD when configured);
4. writes its update to the round store (with secure aggregation: to the site's own store, where
   the site's step masks it), and ``BUNDLE_DIR/round.json`` (RoundReport: rows,
   metrics, epsilon, the update's sha256, both crossings as ``ModelMover`` recorded them, this
   host's name and process id) — all the control side ever reads back.

Exit status 0 on success; on a HybridtrainError the message goes to stderr and to
``BUNDLE_DIR/error.0.txt`` and the status is the error's ``exit_code``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.transfer import ModelMover, TransferRecord
from hybridtrain.errors import HybridtrainError
from hybridtrain.federated.local import train_local
from hybridtrain.federated.rounds import RoundStore, load_state, state_bytes
from hybridtrain.federated.secure_aggregation import SitePrivate
from hybridtrain.remote.host_training import ERROR_FILES, PREFIX, materialize
from hybridtrain.remote.job_bundle import JobBundle
from hybridtrain.specs.sites import CHECKPOINT_SUBDIR, Site
from hybridtrain.storage import open_store
from hybridtrain.training.featurizer import Featurizer

REPORT_FILE = "round.json"
ENTRY_POINT = "hybridtrain.federated.host_round"


class RoundBundle(JobBundle):
    """One site's federated round as shipped to its host: the job bundle plus what the round needs."""

    step: Literal["train"] = "train"
    round: int = Field(ge=1, description="The round to train: from the global model of round - 1.")
    featurizer: dict[str, Any] = Field(description="The global featurizer (Featurizer.to_dict()).")
    aggregation_site: Site = Field(description="Where the round store is: global models in, the update out.")
    keep_at_site: bool = Field(False, description="Secure aggregation: keep the update in the site's own store "
                                                  "(SitePrivate); the site's step masks it and sends only that.")


class RoundReport(BaseModel):
    """What a host reports of its round: no rows, no weights — the update itself went to the round store."""

    job_id: str
    site: str
    round: int
    rows: int
    metrics: dict[str, float]
    epsilon: float | None = None
    update_sha256: str
    transfers: list[TransferRecord] = Field(default_factory=list)
    seconds: float
    hostname: str
    pid: int


def run(bundle_dir: Path | str, *, out: Callable[[str], None] | None = None) -> RoundReport:
    """Train the bundle's round on this host; the update goes to the round store, the report to ``round.json``."""
    started = time.perf_counter()
    bundle_dir = Path(bundle_dir).resolve()
    say = out or (lambda line: print(line, flush=True))
    bundle = RoundBundle.read(bundle_dir)
    spec = bundle.job_spec()
    fed = spec.training.federated
    site, agg, rnd = bundle.site, bundle.aggregation_site, bundle.round
    say(f"{PREFIX} federated round {rnd} of {spec.name} (run key {bundle.run_key}) for site {site.name} on "
        f"{socket.gethostname()} (pid {os.getpid()})")
    data_dir = materialize(bundle, None, say)
    train = partitioned.read(data_dir, ["train"])
    val = partitioned.read(data_dir, ["val"])
    say(f"{PREFIX} data ready: {len(train)} train rows, {len(val)} val rows (they stay on this host)")
    rs = RoundStore(open_store(agg.store, Path(bundle.workdir), CHECKPOINT_SUBDIR, site=agg.name), spec.name,
                    bundle.run_key)
    transfers: list[TransferRecord] = []
    data, record = ModelMover.fetch(rs.store, rs.global_key(rnd - 1), agg, site, rs.global_what(rnd - 1))
    transfers += [record] if record is not None else []
    result = train_local(spec.model, Featurizer.from_dict(bundle.featurizer), load_state(data), train, val,
                         spec.data_schema.label, site=site.name, rnd=rnd, epochs=fed.local_epochs,
                         mu=fed.mu if fed.aggregator == "fedprox" else 0.0, dp=fed.dp,
                         threads=spec.model.threads or spec.resources.cpus)
    if bundle.keep_at_site:  # within the site: no crossing; the site's step masks it
        private = SitePrivate(open_store(site.store, Path(bundle.workdir), CHECKPOINT_SUBDIR, site=site.name),
                              spec.name, bundle.run_key, site.name)
        update = private.keep_update(rnd, result.state, result.rows, result.metrics, result.epsilon)
    else:
        update = state_bytes(result.state)
        record = ModelMover.send(update, rs.store, rs.update_key(rnd, site.name), site, agg,
                                 rs.update_what(rnd, site.name))
        transfers += [record] if record is not None else []
    report = RoundReport(job_id=bundle.job_id, site=site.name, round=rnd, rows=result.rows, metrics=result.metrics,
                         epsilon=result.epsilon, update_sha256=hashlib.sha256(update).hexdigest(),
                         transfers=transfers, seconds=time.perf_counter() - started,
                         hostname=socket.gethostname(), pid=os.getpid())
    _write_atomic(bundle_dir / REPORT_FILE, report.model_dump_json(indent=1))
    shown = " ".join(f"{k}={v:.4f}" for k, v in result.metrics.items() if k in ("train_loss", "val_auc"))
    where = f"kept at {site.name} (to be masked)" if bundle.keep_at_site else f"sent to {agg.name}"
    say(f"{PREFIX} round {rnd} done: {result.rows} rows, {fed.local_epochs} local epoch(s), {shown}; "
        f"update {len(update)} bytes {where}")
    return report


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {ENTRY_POINT}",
                                     description="Train one federated round of a data site on this host.")
    parser.add_argument("bundle_dir", help="directory holding bundle.json (and secrets.json)")
    args = parser.parse_args(argv)
    try:
        run(args.bundle_dir)
    except HybridtrainError as exc:
        print(f"{PREFIX} error: {exc}", file=sys.stderr, flush=True)
        _write_atomic(Path(args.bundle_dir) / ERROR_FILES.replace("*", "0"), f"{exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
