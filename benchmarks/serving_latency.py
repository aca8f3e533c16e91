"""Serving latency: records in, scores out over HTTP from `hybridtrain serve`, against the bare network in-process.

Set-up (in a temporary workspace made of this project's ``deployments/`` and ``jobs/``): a
churn featurizer fitted on ``generate_churn(--fit-rows)``, the spec's TabularMLP, registered
as a ``RecordModel`` pyfunc in MLflow (SQLite), signed into a bundle and published to the
spec's release targets exactly as promotion does; then ``hybridtrain serve onprem-serving
--port 0`` runs as a subprocess (one uvicorn process, CPU torch).

Measured in the same run:

  (a) served, single record: ``POST /invocations`` with one record (``dataframe_records``), one
      request at a time over a keep-alive connection — JSON parsing, MLflow schema
      enforcement, record checks, featurizing, the network, the JSON answer, HTTP;
  (b) served, 1,000-record batch: the same with 1,000 records per request;
  (c) baseline: the bare network called in this process on pre-featurized float32 tensors
      (one row, then 1,000 rows), under ``torch.inference_mode``.

Latencies are per request (``time.perf_counter`` around each call), p50 and p99 after a warm-up.
The ratios say what serving costs on top of the arithmetic. The last line is the headline:
p99 of a single record over HTTP, against the 20 ms target.

    .venv/bin/python benchmarks/serving_latency.py [--single 1000] [--batches 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_P99_MS = 20.0
MODEL = "churn-classifier"


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    ms = np.array(samples_s) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def timed(fn, n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def records(rows: int, seed: int):
    import pandas as pd

    from hybridtrain.datasets.sample_data import generate_churn
    from hybridtrain.specs.job import load_spec
    from hybridtrain.training.record_model import feature_columns

    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    df = generate_churn(rows=max(rows + rows // 10, 200), seed=seed)  # a few rows lack a label and are dropped
    df["date_of_birth"] = pd.to_datetime(df["date_of_birth"]).dt.year.astype("int64")
    return df.dropna(subset=["churned"])[list(feature_columns(spec))].head(rows).reset_index(drop=True)


def publish(ws_root: Path, fit_rows: int) -> tuple[object, object]:
    """Register, sign and publish a RecordModel; return (network, featurizer)."""
    import mlflow
    import torch

    from hybridtrain.governance.bundle import BundleDataset, ModelBundle
    from hybridtrain.governance.signing_key import SigningKey
    from hybridtrain.specs.job import load_spec
    from hybridtrain.stages.promotion import releaser_for
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.training.featurizer import Featurizer
    from hybridtrain.training.model import TabularMLP
    from hybridtrain.training.record_model import feature_columns
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(ws_root)
    spec = load_spec(ws_root / "jobs" / "churn.yaml")
    feat = Featurizer.fit(records(fit_rows, seed=1), spec.model.features)
    torch.manual_seed(0)
    net = TabularMLP.from_spec(spec.model, feat.n_features).eval()
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    run_id = registry.start_run("serving-benchmark", "bench", {"hybridtrain.job": "churn"})
    ref = registry.log_model(run_id, net, feat.to_dict(), feat.n_features, columns=feature_columns(spec))
    registry.end_run(run_id)
    version = registry.register(ref.model_uri, MODEL, run_id, {}).version
    key = SigningKey.generate()
    ws.release_public_key.parent.mkdir(parents=True, exist_ok=True)
    ws.release_public_key.write_bytes(key.public.to_pem())
    mlflow.set_tracking_uri(ws.tracking_uri)
    tmp = Path(tempfile.mkdtemp(dir=ws_root))
    weights = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref.model_uri, dst_path=str(tmp / "model")))
    bundle = ModelBundle.build(
        tmp / "bundle", model=MODEL, version=version, weights=weights, spec=spec.to_dict(),
        datasets=[BundleDataset(tier=t, path=f"data/{t}", md5="0" * 32) for t in ("raw", "curated", "approved")],
        evaluation={}, lineage={}, checkpoint_sha256=None, signing_key=key)
    releaser_for(ws, spec, ws.load_sites(), key.public).publish(bundle)
    return net, feat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--single", type=int, default=1000, help="single-record requests measured")
    ap.add_argument("--batches", type=int, default=50, help="1,000-record requests measured")
    ap.add_argument("--fit-rows", type=int, default=5000)
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    import httpx
    import torch

    ws_root = Path(tempfile.mkdtemp(prefix="hybridtrain-serving-bench-"))
    proc = None
    try:
        for rel in ("deployments", "jobs"):
            shutil.copytree(ROOT / rel, ws_root / rel, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        net, feat = publish(ws_root, args.fit_rows)
        one, batch = records(1, seed=2), records(1000, seed=3)

        proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "serve", "onprem-serving", "--spec",
                                 "jobs/churn.yaml", "--port", "0", "--home", str(ws_root)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        first = lines.get(timeout=180)
        url = first.split(" at ")[1].split()[0]

        single_body = json.dumps({"dataframe_records": json.loads(one.to_json(orient="records"))})
        batch_body = json.dumps({"dataframe_records": json.loads(batch.to_json(orient="records"))})
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=60) as client:
            def post(body: str) -> None:
                r = client.post(f"{url}/invocations", content=body, headers=headers)
                r.raise_for_status()

            assert len(client.post(f"{url}/invocations", content=batch_body, headers=headers).json()["predictions"]) \
                == 1000
            served_single = timed(lambda: post(single_body), args.single, warmup=50)
            served_batch = timed(lambda: post(batch_body), args.batches, warmup=5)

        torch.set_num_threads(1)  # the server's torch also runs one request's math on one thread at a time
        x1 = torch.from_numpy(feat.transform(one))
        x1000 = torch.from_numpy(feat.transform(batch))

        def bare(x):
            with torch.inference_mode():
                net(x)

        bare_single = timed(lambda: bare(x1), args.single, warmup=50)
        bare_batch = timed(lambda: bare(x1000), args.batches, warmup=5)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(ws_root, ignore_errors=True)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; torch {torch.__version__}; model {feat.n_features} features -> "
          f"{net.hidden_layers} -> 1")
    rows = [("served over HTTP, 1 record", served_single, bare_single),
            ("served over HTTP, 1,000 records", served_batch, bare_batch)]
    print(f"{'request':34s} {'p50 ms':>9s} {'p99 ms':>9s} {'bare p50':>9s} {'bare p99':>9s} {'p50 ratio':>10s}")
    for name, served, base in rows:
        s50, s99 = percentiles(served)
        b50, b99 = percentiles(base)
        print(f"{name:34s} {s50:9.3f} {s99:9.3f} {b50:9.3f} {b99:9.3f} {s50 / b50:9.0f}x")
    b50, _ = percentiles(served_batch)
    print(f"batch throughput: {1000 / (b50 / 1000):,.0f} records/s served (p50), "
          f"{1000 / (percentiles(bare_batch)[0] / 1000):,.0f} records/s bare network")
    _, p99 = percentiles(served_single)
    print(f"serving_p99_ms_single: {p99:.2f} ms (target <= {TARGET_P99_MS:g})")


if __name__ == "__main__":
    main()
