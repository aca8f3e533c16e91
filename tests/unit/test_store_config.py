"""A site's store as a DVC remote (config apart from secrets) and as an ObjectStore."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hybridtrain.specs.sites import LocalStore, Site
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore


def site(store: dict) -> Site:
    return Site.model_validate({"name": "cloud-x", "kind": "cloud", "region": "eu-west-1", "jurisdiction": "EU",
                                "price_per_gpu_hour": 1.0, "work_pool": "cloud", "store": store})


def test_local_store_remote_is_the_dvc_directory_without_secrets(tmp_path):
    s = site({"kind": "local", "path": "stores/x"})
    assert s.dvc_remote_config(tmp_path) == {"url": str(tmp_path / "stores" / "x" / "dvc")}
    assert s.dvc_remote_secrets() == {}


def test_s3_store_remote_carries_endpoint_and_region_and_secrets_apart():
    s = site({"kind": "s3", "bucket": "ml-data", "prefix": "/team/", "endpoint_url": "http://minio:9000",
              "region": "eu-west-1", "access_key_id": "AKIAX", "secret_access_key": "s3cr3t"})
    conf = s.dvc_remote_config(Path("/ws"))
    assert conf == {"url": "s3://ml-data/team/dvc", "endpointurl": "http://minio:9000", "region": "eu-west-1",
                    "connect_timeout": "10", "read_timeout": "120"}
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(conf)
    assert s.dvc_remote_secrets() == {"access_key_id": "AKIAX", "secret_access_key": "s3cr3t"}


def test_aws_store_without_keys_uses_the_default_chain():
    s = site({"kind": "s3", "bucket": "ml-data"})
    conf = s.dvc_remote_config(Path("/ws"))
    assert conf["url"] == "s3://ml-data/dvc" and conf["region"] == "us-east-1" and "endpointurl" not in conf
    assert s.dvc_remote_secrets() == {}


def test_open_store_for_a_local_store_is_a_directory_and_imports_no_boto3(tmp_path):
    st = open_store(LocalStore(path="stores/x"), tmp_path, "objects")
    assert isinstance(st, LocalObjectStore) and st.root == tmp_path / "stores" / "x" / "objects"
    absolute = open_store(LocalStore(path=str(tmp_path / "abs")), Path("/elsewhere"))
    assert absolute.root == tmp_path / "abs"
    code = "import sys, hybridtrain.storage.object_store, hybridtrain.stages; print('boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"  # boto3 is imported only when an S3 store is opened
