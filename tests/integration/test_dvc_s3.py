"""DVC datasets on an S3 site store (moto over HTTP): counted pushes, pulls by pointer, secrets in memory only."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hybridtrain.datasets import partitioned
from hybridtrain.datasets.dvc_repo import DvcRepo
from hybridtrain.datasets.preprocess import Preprocessor
from hybridtrain.datasets.sample_data import write_churn_csv
from hybridtrain.errors import SiteUnavailable, SpecError
from hybridtrain.specs.job import parse_spec
from hybridtrain.specs.sites import Site
from hybridtrain.storage.s3 import S3ObjectStore

ROOT = Path(__file__).resolve().parents[2]


def cloud_site(s3, key: str = "testing", secret: str = "testing") -> Site:
    return Site.model_validate({
        "name": "cloud-s3", "kind": "cloud", "region": "eu-west-1", "jurisdiction": "EU",
        "price_per_gpu_hour": 4.0, "work_pool": "cloud",
        "store": s3.store("sites/cloud-s3", key=key, secret=secret).model_dump(mode="python"),
    })


def repo_for(root: Path, site: Site, *, scm: bool) -> DvcRepo:
    if scm:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    return DvcRepo.ensure(root, {site.dvc_remote: site.dvc_remote_config(root)}, default_remote=site.dvc_remote,
                          scm=scm, secrets={site.dvc_remote: site.dvc_remote_secrets()})


def remote_objects(s3, client=None, prefix: str = "sites/cloud-s3/dvc/") -> dict[str, int]:
    pages = (client or s3.client).get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def write_parts(d: Path, n: int = 4, size: int = 10_000, change: int | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        fill = b"y" if i == change else b"x"
        (d / f"part-{i}.bin").write_bytes(bytes([i]) + fill * (size - 1))


def test_push_and_pull_by_pointer_with_credentials_only_in_memory(s3, s3_server, tmp_path):
    with s3_server.enforce_auth() as (key_id, secret):
        site = cloud_site(s3, key_id, secret)
        ws = repo_for(tmp_path / "ws", site, scm=True)
        write_parts(ws.root / "data" / "approved" / "job")
        v = ws.add("data/approved/job", "approved", "onprem-dc1")
        first = ws.push(v, site.dvc_remote)
        objects = remote_objects(s3, S3ObjectStore(site.store).client)
        assert first.files == 5 and len(objects) == 5  # four parts and the .dir manifest
        assert first.bytes == sum(objects.values())
        assert all(k.startswith("sites/cloud-s3/dvc/files/md5/") for k in objects)
        assert ws.missing_on(v, site.dvc_remote) == (0, 0)

        copy = repo_for(tmp_path / "site", site, scm=False)
        path = copy.pull_pointer(v.at(site.name), site.dvc_remote)
        assert sorted(p.name for p in path.iterdir()) == [f"part-{i}.bin" for i in range(4)]
        assert (path / "part-2.bin").read_bytes() == (ws.root / "data/approved/job/part-2.bin").read_bytes()
        assert ws.remote_url(v, site.dvc_remote) == f"s3://{s3.bucket}/sites/cloud-s3/dvc/files/md5/{v.md5[:2]}/{v.md5[2:]}"

        # The secret authenticated those calls, yet no file of either checkout holds it.
        for root in (ws.root, copy.root):
            assert files_containing(root, secret) == []
            local = (root / ".dvc" / "config.local").read_text()
            assert f"url = s3://{s3.bucket}/sites/cloud-s3/dvc" in local and f"endpointurl = {s3.endpoint}" in local
        # Without them the same remote is refused: the credentials really came from memory.
        bare = DvcRepo(tmp_path / "site")
        with pytest.raises(SpecError) as refused:
            bare.missing_on(v.at(site.name), site.dvc_remote)
    assert "remote 'cloud-s3' refused access" in str(refused.value)


def test_a_push_to_a_stopped_endpoint_fails_clearly_and_soon(s3, tmp_path):
    from tests.fixtures.s3_server import MotoS3Server

    server = MotoS3Server()
    server.start()
    site = cloud_site(s3).model_copy(update={"store": s3.store("sites/cloud-s3").model_copy(
        update={"endpoint_url": server.url})})
    ws = repo_for(tmp_path / "ws", site, scm=False)
    write_parts(ws.root / "data" / "approved" / "job", n=2)
    v = ws.add("data/approved/job", "approved", "onprem-dc1")
    server.stop()
    started = time.monotonic()
    with pytest.raises(SiteUnavailable) as exc:
        ws.push(v, site.dvc_remote)
    # Bounded by dvc-s3's own retries (aiobotocore + s3fs backoff), a few seconds; never a hang.
    assert time.monotonic() - started < 25
    assert exc.value.site == "cloud-s3" and server.url in str(exc.value)
    assert remote_objects(s3) == {}
    server.close()


def test_secrets_cannot_be_written_as_remote_config(tmp_path, s3):
    site = cloud_site(s3)
    with pytest.raises(ValueError, match="secret_access_key would be written"):
        DvcRepo.ensure(tmp_path / "ws", {"cloud": {**site.dvc_remote_config(tmp_path), **site.dvc_remote_secrets()}},
                       scm=False)


def test_plain_url_remotes_still_work(tmp_path):
    repo = DvcRepo.ensure(tmp_path / "ws", {"local": str(tmp_path / "store")}, "local", scm=False)
    write_parts(repo.root / "d", n=2)
    v = repo.add("d", "approved", "onprem-dc1")
    assert repo.push(v, "local").files == 3


def churn_spec(partition_by: str | None) -> dict:
    data = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    data["layout"] = {"partitions": 8, **({"partition_by": partition_by} if partition_by else {})}
    return data


def correct_rows(raw: Path, month: str, share: float) -> int:
    """Correct ``monthly_charges`` of rows that signed up in ``month`` (up to ``share`` of all rows)."""
    df = pd.read_csv(raw, dtype=str, keep_default_na=False)
    rows = df.index[df["signup_date"].str.startswith(month)][: max(1, int(len(df) * share))]
    df.loc[rows, "monthly_charges"] = (df.loc[rows, "monthly_charges"].astype(float) + 1).round(2).astype(str)
    df.to_csv(raw, index=False)
    return len(rows)


def test_repush_after_a_change_in_one_period_moves_only_that_periods_partitions(s3, tmp_path):
    site = cloud_site(s3)
    ws = repo_for(tmp_path / "ws", site, scm=True)
    raw = ws.root / "raw.csv"
    write_churn_csv(raw, rows=3000, seed=5)
    pre = Preprocessor(parse_spec(churn_spec("signup_date:quarter")))
    curated = ws.root / "data" / "curated" / "churn"
    pre.run(raw, curated)
    v1 = ws.add("data/curated/churn", "curated", "onprem-dc1")
    full = ws.push(v1, site.dvc_remote)
    before = {p.relative_to(curated): p.read_bytes() for p in partitioned.files(curated)}

    changed_rows = correct_rows(raw, "2024-03", share=0.01)
    pre.run(raw, curated)
    v2 = ws.add("data/curated/churn", "curated", "onprem-dc1")
    after = {p.relative_to(curated): p.read_bytes() for p in partitioned.files(curated)}
    changed = sorted(str(k) for k in after if before.get(k) != after[k])
    assert changed_rows >= 20 and changed and all(c.endswith("part-20241.parquet") for c in changed)
    objects_before = remote_objects(s3)
    again = ws.push(v2, site.dvc_remote)
    new_objects = {k: n for k, n in remote_objects(s3).items() if k not in objects_before}
    assert again.files == len(changed) + 1 == len(new_objects)  # the period's files and the new manifest
    assert again.bytes == sum(new_objects.values())
    assert again.bytes < 0.1 * full.bytes
