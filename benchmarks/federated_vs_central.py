"""Federated vs centralized: the sample data split over 3 sites, the same model and the same budget of epochs.

In one temporary workspace (three on-prem sites, each its own store; ``hybridtrain split-sites``'s
non-IID split: own regions, size and churn rate), measured in the same run:

  (a) federated — ``run_federation`` with every site step in this process (``InlineSites``):
      each site prepares its own part (preprocess, anonymize, leak scan), then ``--rounds`` rounds
      of ``--local-epochs`` local epochs, FedAvg at ``onprem-dc1``;
  (b) centralized — the same prepared parts, the two remote parts synced to ``onprem-dc1``
      through ``stages.sync`` (DVC, what a centralized run moves), then the project's ``Trainer``
      for rounds x local epochs epochs on the union.

Both models are scored on the union of the sites' test splits (AUC on all rows together). Printed:
AUC of each and the gap; bytes that crossed site boundaries (model bytes vs the approved data a
centralized run syncs); wall time of each and the ratio. The sites run one after another here, so
the federated wall time is also given as it would be with the sites in parallel (per round, the
slowest site). The last line is the headline ``federated_auc_gap: X (target <= 0.01)``.

    .venv/bin/python benchmarks/federated_vs_central.py [--rows 30000] [--rounds 5] [--local-epochs 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
for name, value in (("GIT_AUTHOR_NAME", "bench"), ("GIT_AUTHOR_EMAIL", "bench@hybridtrain.invalid"),
                    ("GIT_COMMITTER_NAME", "bench"), ("GIT_COMMITTER_EMAIL", "bench@hybridtrain.invalid")):
    os.environ.setdefault(name, value)

KEY = b"benchmark-pseudonym-key-0123456789"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--aggregator", choices=("fedavg", "fedprox"), default="fedavg")
    args = ap.parse_args()

    import pandas as pd
    import yaml

    from hybridtrain import stages
    from hybridtrain.datasets import partitioned
    from hybridtrain.federated.coordinator import InlineSites, global_model, run_federation
    from hybridtrain.federated.rounds import RoundStore
    from hybridtrain.specs.job import load_spec
    from hybridtrain.storage.local import LocalObjectStore
    from hybridtrain.training import evaluation
    from hybridtrain.training.checkpoint import CheckpointStore
    from hybridtrain.training.trainer import Trainer
    from hybridtrain.workspace import Workspace
    from tests.federated.conftest import build_federated_workspace, federated_spec

    with tempfile.TemporaryDirectory(prefix="fed-bench-") as tmp:
        root, parts = build_federated_workspace(Path(tmp) / "ws", rows=args.rows)
        path = federated_spec(root, parts, name="bench", rounds=args.rounds, local_epochs=args.local_epochs,
                              aggregator=args.aggregator)
        data = yaml.safe_load(path.read_text())
        data["data_policy"] = {"sensitivity": "internal", "residency": ["EU"]}  # so a centralized run may sync
        data["model"]["epochs"] = args.rounds * args.local_epochs
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        ws = Workspace.resolve(root)
        spec = load_spec(path, ws.load_sites())
        sites = [p["site"] for p in parts]
        agg = sites[0]

        began = time.perf_counter()
        outcome = run_federation(ws, spec, "bench", agg, InlineSites(ws, spec, "bench", agg, KEY))
        fed_s = time.perf_counter() - began
        prepared = outcome.prepared()
        prep_seconds = {s: p.seconds for s, p in prepared.items()}
        parallel_s = (max(prep_seconds.values()) + sum(max(r.site_seconds.values()) for r in outcome.state.rounds)
                      + max(e.seconds for e in outcome.evaluations.values()))
        fed_bytes = sum(t.bytes for t in outcome.transfers)

        # Centralized: sync the approved parts to the aggregator's site, train there on the union.
        began = time.perf_counter()
        synced_bytes, frames = 0, {"train": [], "val": [], "test": []}
        for site, p in prepared.items():
            moved = stages.sync(ws, p.anon.approved, agg, spec)
            synced_bytes += moved.transfer.bytes if moved.transfer else 0
            directory = stages.dataset_at(ws, ws.load_sites(), p.anon.approved, agg, site)
            for split in frames:
                frames[split].append(partitioned.read(directory, [split]))
        union = {k: pd.concat(v, ignore_index=True) for k, v in frames.items()}
        store = CheckpointStore.for_run(LocalObjectStore(Path(tmp) / "central-ckpt"), "bench", "central", keep_last=1)
        result = Trainer(spec.model, spec.checkpoint, store, spec.data_schema.label,
                         threads=spec.resources.cpus, job="bench").fit(union["train"], union["val"])
        central_s = time.perf_counter() - began + sum(prep_seconds.values())  # it needs the same preparation

        label = spec.data_schema.label
        central_auc = evaluation.evaluate(result.model, result.featurizer, union["test"], label)["auc"]
        rs = RoundStore(stages.checkpoint_store(ws, ws.load_sites().get(agg)), "bench", "bench")
        model, featurizer = global_model(spec, outcome.state.featurizer, rs.load_global(outcome.state.completed))
        fed_auc = evaluation.evaluate(model, featurizer, union["test"], label)["auc"]

    gap = central_auc - fed_auc
    print(f"sites: {', '.join(f'{s} ({n:,} train rows)' for s, n in outcome.state.feature_rows.items())}")
    print(f"budget: {args.rounds} rounds x {args.local_epochs} local epoch(s) = {args.rounds * args.local_epochs} "
          f"epochs centralized; {args.aggregator}; {args.rows:,} rows generated")
    print(f"AUC on the union of the test splits: centralized {central_auc:.4f}, federated {fed_auc:.4f} "
          f"(row-weighted per-site mean {outcome.metrics['auc']:.4f})")
    print(f"bytes across site boundaries: federated {fed_bytes:,} (model bytes: statistics, updates, global "
          f"weights), centralized {synced_bytes:,} (approved data synced); ratio {fed_bytes / max(synced_bytes, 1):.3f}")
    print(f"wall time: federated {fed_s:.1f} s (sites in turn; {parallel_s:.1f} s with sites in parallel), "
          f"centralized {central_s:.1f} s; ratio {fed_s / central_s:.2f} ({parallel_s / central_s:.2f} parallel)")
    print(f"federated_auc_gap: {gap:.4f} (target <= 0.01)")


if __name__ == "__main__":
    main()
