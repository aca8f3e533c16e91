"""Sync throughput: the project's sync of the approved dataset to an S3 site vs raw boto3, and re-sync bytes.

Standalone: starts its own S3 server (moto in server mode, a separate process on 127.0.0.1 and
a free port), builds a workspace in a temporary directory (generated churn data, ``jobs/churn.yaml``
with ``layout.partition_by: signup_date:month``, the project's preprocess and anonymize stages with
a random 32-byte pseudonym key) whose cloud site ``cloud-eu`` has an S3 store on that server.

1. Throughput, in one run against the same server: ``DataMover.sync_dataset`` of the approved
   version to ``cloud-eu`` (DVC push via dvc-s3, after counting what the remote lacks) vs a raw
   boto3 ``upload_file`` of the same files, one after another, to the same bucket. The two
   alternate (which goes first alternates too), the destination prefix emptied before each
   trial; best of ``--repeats`` (7) each.
   Each side's MB/s is its own bytes over its own wall time (ours also sends DVC's ``.dir``
   manifest); the ratio is ours / raw. A threaded boto3 baseline is printed for context.
2. Incremental sync: 1 % of the source rows (``round(0.01 * rows)``) are chosen at random (seed
   0) among the customers who signed up in one calendar month — the most recent full month
   before the extract date, where corrections cluster — and their ``monthly_charges`` is
   corrected by +1.00 (a column that is neither sensitive nor a quasi-identifier). The raw file
   is re-versioned, preprocess and anonymize run again (k-anonymity is global: whatever its
   suppression changes is counted too), and the approved version is synced again. The bytes
   DVC pushed (checked against the growth of the bucket) over the bytes of the full sync is
   the figure. The same change is also measured under the default entity-hash layout.

Run: .venv/bin/python benchmarks/sync_throughput.py [--rows 200000] [--repeats 7]
The last two lines are the re-sync fraction and the throughput ratio (the headline).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUCKET = "hybridtrain-bench"
PREFIX = "cloud-eu"
KEY_ID, SECRET = "bench", "bench-secret"
TARGET_RATIO = 0.8
TARGET_RESYNC = 0.05

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


# -- S3 server -------------------------------------------------------------------------------------


def start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process (so it does not share this process's GIL)."""
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        fh = open(log, "wb")  # noqa: SIM115 - lives as long as the server
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return proc, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=10)
    raise RuntimeError(f"moto server did not start: {log.read_text()}")


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                        region_name="us-east-1",
                        config=Config(connect_timeout=5, read_timeout=60, max_pool_connections=16,
                                      retries={"mode": "standard", "total_max_attempts": 3}))


def empty_prefix(client, prefix: str) -> None:
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})


def prefix_bytes(client, prefix: str) -> tuple[int, int]:
    sizes = [o["Size"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
             for o in page.get("Contents", [])]
    return len(sizes), sum(sizes)


# -- workspace -------------------------------------------------------------------------------------


def build_workspace(dest: Path, endpoint: str, partition_by: str | None) -> Path:
    """A git workspace with the project's configs; cloud-eu's store is S3 on ``endpoint``."""
    dest.mkdir(parents=True)
    for rel in ("deployments", "jobs"):
        shutil.copytree(ROOT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    sites_file = dest / "deployments" / "sites.yaml"
    sites = yaml.safe_load(sites_file.read_text())
    for site in sites["sites"]:
        if site["name"] == "cloud-eu":
            site["store"] = {"kind": "s3", "bucket": BUCKET, "prefix": PREFIX, "endpoint_url": endpoint,
                             "region": "us-east-1", "access_key_id": KEY_ID, "secret_access_key": SECRET}
    sites_file.write_text(yaml.safe_dump(sites, sort_keys=False))
    spec = yaml.safe_load((dest / "jobs" / "churn.yaml").read_text())
    spec["layout"] = {"partitions": 16, **({"partition_by": partition_by} if partition_by else {})}
    (dest / "jobs" / "bench.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest


class Pipeline:
    """raw → curated → approved in one workspace, with one pseudonym key across versions."""

    def __init__(self, root: Path, rows: int, key: bytes):
        from hybridtrain import stages
        from hybridtrain.cli.main import ensure_sample_data
        from hybridtrain.workspace import Workspace

        self.ws = Workspace.resolve(root, tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
        self.key = key
        self.sites = self.ws.load_sites()
        ensure_sample_data(self.ws, rows, 20261121, Path("jobs/bench.yaml"))
        self.repo = stages.workspace_repo(self.ws, self.sites, "onprem-dc1")

    def approved(self):
        from hybridtrain import stages
        from hybridtrain.specs.job import load_spec

        spec = load_spec(self.ws.root / "jobs" / "bench.yaml", self.sites)
        prep = stages.preprocess(self.ws, spec)
        anon = stages.anonymize(self.ws, spec, prep.curated, self.key)
        return anon.approved, anon.report

    def sync(self, version):
        from hybridtrain.datasets.transfer import DataMover

        return DataMover(self.repo).sync_dataset(version, self.sites.get("onprem-dc1"), self.sites.get("cloud-eu"))

    def change_one_percent(self) -> str:
        """Correct monthly_charges of 1 % of rows, all from one signup month; re-version the raw file."""
        import numpy as np
        import pandas as pd

        from hybridtrain.datasets.sample_data import SNAPSHOT

        raw = self.ws.path("data/raw/churn.csv")
        df = pd.read_csv(raw, dtype=str, keep_default_na=False)
        n = round(0.01 * len(df))
        snapshot = pd.Timestamp(str(SNAPSHOT))
        month = (snapshot - pd.offsets.MonthBegin(1)).strftime("%Y-%m")  # last full month before the extract
        candidates = df.index[df["signup_date"].str.startswith(month)]
        if len(candidates) < n:
            raise RuntimeError(f"month {month} has {len(candidates)} rows, fewer than 1 % ({n})")
        chosen = np.random.default_rng(0).choice(candidates, n, replace=False)
        charges = pd.to_numeric(df.loc[chosen, "monthly_charges"])
        df.loc[chosen, "monthly_charges"] = (charges + 1.0).map(lambda v: f"{v:.2f}")
        df.to_csv(raw, index=False)
        version = self.repo.add("data/raw/churn.csv", "raw", "onprem-dc1")
        self.repo.push(version, remote="onprem-dc1")
        spec_file = self.ws.root / "jobs" / "bench.yaml"
        spec = yaml.safe_load(spec_file.read_text())
        spec["dataset"]["md5"] = version.md5
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        return (f"{n} of {len(df)} source rows ({n / len(df):.2%}), drawn at random (seed 0) from the "
                f"{len(candidates)} customers who signed up in {month}; monthly_charges +1.00")


def resync_fraction(pipe: Pipeline, client, full_bytes: int) -> tuple[float, str, str]:
    how = pipe.change_one_percent()
    before = prefix_bytes(client, f"{PREFIX}/dvc/")
    v2, report = pipe.approved()
    _, rec = pipe.sync(v2)
    after = prefix_bytes(client, f"{PREFIX}/dvc/")
    grown = after[1] - before[1]
    assert grown == rec.bytes, f"DVC counted {rec.bytes} B but the bucket grew by {grown} B"
    detail = (f"re-sync moved {rec.files} files, {rec.bytes:,} B of {full_bytes:,} B "
              f"(bucket grew by {after[0] - before[0]} objects, {grown:,} B; k-anonymity suppressed "
              f"{report['rows_suppressed']} rows)")
    return rec.bytes / full_bytes, how, detail


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="generated source rows (default 200000)")
    parser.add_argument("--repeats", type=int, default=7, help="trials per side, alternating (default 7)")
    args = parser.parse_args()
    logging.getLogger("dvc").setLevel(logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="hybridtrain-sync-bench-"))
    server, endpoint = start_moto(tmp / "moto.log")
    try:
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        key = secrets.token_bytes(32)
        started = time.perf_counter()
        pipe = Pipeline(build_workspace(tmp / "ws", endpoint, "signup_date:month"), args.rows, key)
        v1, _ = pipe.approved()
        print(f"workspace built in {time.perf_counter() - started:.1f} s (moto S3 at {endpoint}, separate process)")

        approved_dir = pipe.ws.path(v1.path)
        files = sorted(p for p in approved_dir.rglob("*") if p.is_file())
        data_bytes = sum(p.stat().st_size for p in files)
        print(f"approved dataset: {len(files)} files, {data_bytes / 1e6:.2f} MB "
              f"(layout.partition_by signup_date:month, {args.rows} source rows, sync.sample_fraction 0.5)")

        def raw_upload(parallel: int) -> float:
            empty_prefix(client, "raw/")
            t = time.perf_counter()
            if parallel == 1:
                for p in files:
                    client.upload_file(str(p), BUCKET, f"raw/{p.relative_to(approved_dir).as_posix()}")
            else:
                with ThreadPoolExecutor(parallel) as pool:
                    list(pool.map(lambda p: client.upload_file(
                        str(p), BUCKET, f"raw/{p.relative_to(approved_dir).as_posix()}"), files))
            return time.perf_counter() - t

        ours, raw, threaded, full_bytes, full_files = [], [], [], 0, 0

        def our_sync() -> None:
            nonlocal full_bytes, full_files
            empty_prefix(client, f"{PREFIX}/")
            t = time.perf_counter()
            _, rec = pipe.sync(v1)
            ours.append(time.perf_counter() - t)
            full_bytes, full_files = rec.bytes, rec.files
            assert rec.files == len(files) + 1, f"sync moved {rec.files} files, expected {len(files) + 1}"

        for trial in range(args.repeats):
            # Alternate which side goes first, so drift in machine load hits both alike.
            if trial % 2 == 0:
                raw.append(raw_upload(1))
                our_sync()
            else:
                our_sync()
                raw.append(raw_upload(1))
            threaded.append(raw_upload(8))
        empty_prefix(client, f"{PREFIX}/")
        pipe.sync(v1)  # the remote holds v1 before the re-sync
        assert prefix_bytes(client, f"{PREFIX}/dvc/")[1] == full_bytes
        ours_mbs = full_bytes / 1e6 / min(ours)
        raw_mbs = data_bytes / 1e6 / min(raw)
        thr_mbs = data_bytes / 1e6 / min(threaded)
        print(f"ours  DataMover.sync_dataset (DVC push, dvc-s3): best {min(ours):.3f} s of "
              f"{[round(x, 3) for x in ours]}, {full_files} files, {full_bytes:,} B -> {ours_mbs:.1f} MB/s")
        print(f"raw   boto3 upload_file, one file after another: best {min(raw):.3f} s of "
              f"{[round(x, 3) for x in raw]}, {len(files)} files, {data_bytes:,} B -> {raw_mbs:.1f} MB/s")
        print(f"(context) boto3 upload_file on 8 threads: best {min(threaded):.3f} s -> {thr_mbs:.1f} MB/s; "
              f"ours / threaded = {ours_mbs / thr_mbs:.2f} x")

        fraction, how, detail = resync_fraction(pipe, client, full_bytes)
        print(f"change: {how}")
        print(f"partition_by signup_date:month: {detail}")

        # The same change under the default layout (entity-key hash, 16 partitions per split).
        empty_prefix(client, f"{PREFIX}/")
        hashed = Pipeline(build_workspace(tmp / "ws-hash", endpoint, None), args.rows, key)
        h1, _ = hashed.approved()
        _, hrec = hashed.sync(h1)
        h_fraction, _, h_detail = resync_fraction(hashed, client, hrec.bytes)
        print(f"default entity-hash layout, same change: {h_detail} -> fraction {h_fraction:.3f}")

        ratio = ours_mbs / raw_mbs
        print(f"resync_bytes_fraction: {fraction:.3f} (target <= {TARGET_RESYNC})")
        print(f"sync_throughput_ratio: {ratio:.2f} x (target >= {TARGET_RATIO})")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
