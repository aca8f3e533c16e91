import json
import stat

import pytest

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import SpecError
from hybridtrain.remote.job_bundle import BUNDLE_FILE, SECRETS_FILE, JobBundle
from hybridtrain.specs.job import load_spec
from hybridtrain.specs.sites import S3Store, Site
from tests.fixtures.workspaces import ROOT

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


def bundle(**kw) -> JobBundle:
    site = Site(name="cloud-eu", kind="cloud", region="eu-west-1", jurisdiction="EU", price_per_gpu_hour=4.0,
                work_pool="cloud", store=S3Store(bucket="ds-bucket", prefix="sites/cloud-eu", access_key_id="AKIA1",
                                                 secret_access_key=SECRET))
    approved = DatasetVersion(path="data/approved/churn", md5="a" * 32 + ".dir", size=10, nfiles=2, tier="approved",
                              site="cloud-eu")
    spec = load_spec(ROOT / "jobs" / "churn.yaml")
    return JobBundle(job_id="churn-run-1", code_version="abc123", spec=spec.to_dict(), approved=approved, site=site,
                     workdir="/srv/hybridtrain", run_key="run-1", mlflow_run_id="m1", **kw)


def test_round_trip_keeps_secrets_out_of_the_bundle_file(tmp_path):
    b = bundle()
    b.write(tmp_path)
    public = (tmp_path / BUNDLE_FILE).read_text()
    assert SECRET not in public and json.loads(public)["site"]["store"]["secret_access_key"] is None
    assert json.loads((tmp_path / SECRETS_FILE).read_text()) == {"site.store.secret_access_key": SECRET}
    assert stat.S_IMODE((tmp_path / SECRETS_FILE).stat().st_mode) == 0o600
    back = JobBundle.read(tmp_path)
    assert back == b and back.site.store.secret_access_key.get_secret_value() == SECRET
    assert back.job_spec() == load_spec(ROOT / "jobs" / "churn.yaml")
    assert SECRET not in repr(back)


def test_invalid_job_id_and_unreadable_bundles_are_refused(tmp_path):
    with pytest.raises(ValueError, match="job_id"):
        JobBundle.model_validate({**bundle().model_dump(mode="python"), "job_id": "../x"})
    with pytest.raises(SpecError, match="cannot read the job bundle"):
        JobBundle.read(tmp_path)
    (tmp_path / BUNDLE_FILE).write_text('{"format": 1}')
    with pytest.raises(SpecError, match="not a valid job bundle"):
        JobBundle.read(tmp_path)


def test_a_host_without_credentials_for_an_s3_store_says_how_to_give_them_before_fetching(tmp_path):
    # The site's block holds no S3 keys and the host has none of its own (environment, files, instance role).
    import os
    import subprocess
    import sys

    keyless = bundle().site.store.model_copy(update={"access_key_id": None, "secret_access_key": None})
    b = bundle()
    b = b.model_copy(update={"site": b.site.model_copy(update={"store": keyless}), "workdir": str(tmp_path / "work")})
    b.write(tmp_path / "bundle")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(ROOT)})
    out = subprocess.run([sys.executable, "-m", "hybridtrain.remote.host_training", str(tmp_path / "bundle")],
                         capture_output=True, text=True, env=env, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert out.returncode == SpecError.exit_code, out.stderr
    assert "Traceback" not in out.stderr
    assert "cloud-eu.aws_access_key_id" in out.stderr and "s3://ds-bucket" in out.stderr
    assert "hybridtrain credentials cloud-eu --aws-access-key-id" in out.stderr
    assert not (tmp_path / "work" / "data-copy").exists()  # nothing fetched, nothing half-made
