"""`init` and `credentials` on a real embedded Prefect server: usable credentials are stored as given, a bad one
is refused by ``set_credentials`` too (the Python path) and leaves what was stored before.

The CLI runs as a user runs it (a subprocess, no Prefect settings: the workspace's own embedded server and
database under ``.hybridtrain/prefect``); the blocks are read back the way flows read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.fixtures.workspaces import ROOT

READ_BACK = """
import json, sys
from blocks.register import set_credentials
from blocks.site import SiteBlock
from hybridtrain.errors import SpecError
from orchestration.session import open_session

open_session(sys.argv[1], reap=False)
try:
    set_credentials("onprem-dc1", ssh_private_key="hi")
    refused = None
except SpecError as exc:
    refused = [p.path for p in exc.problems]
onprem, cloud = SiteBlock.load("onprem-dc1"), SiteBlock.load("cloud-eu")
print(json.dumps({"key": onprem.ssh_private_key.get_secret_value(), "known_hosts": onprem.ssh_known_hosts,
                  "key_id": cloud.aws_access_key_id, "secret": cloud.aws_secret_access_key.get_secret_value(),
                  "refused": refused}))
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    drop = ("PREFECT_", "HYBRIDTRAIN_", "MLFLOW_TRACKING", "PYTEST_")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=420,
                          check=False)


def test_usable_credentials_are_stored_as_given_and_a_bad_one_never_replaces_them(workspace, tmp_path):
    sites = workspace / "deployments" / "sites.yaml"
    data = yaml.safe_load(sites.read_text())
    data["sites"][0]["hosts"] = [{"hostname": "127.0.0.1", "port": 2222, "username": "train", "gpus": 1}]
    data["sites"][1]["store"] = {"kind": "s3", "bucket": "ml-data", "prefix": "cloud-eu"}
    sites.write_text(yaml.safe_dump(data, sort_keys=False))
    private = ed25519.Ed25519PrivateKey.generate()
    key_text = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                     serialization.NoEncryption()).decode()
    host = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    key, known, secret = tmp_path / "id_ed25519", tmp_path / "known_hosts", tmp_path / "s3_secret"
    key.write_text(key_text)
    known.write_text(f"[127.0.0.1]:2222 {host}\n")
    secret.write_text("wJalrXUtnFEMI/K7MDENG\n")

    out = run("-m", "orchestration.cli", "init", "--home", str(workspace))
    assert out.returncode == 0 and "workspace ready" in out.stdout, out.stderr[-3000:]
    out = run("-m", "orchestration.cli", "credentials", "onprem-dc1", "--ssh-key", str(key), "--known-hosts",
              str(known), "--home", str(workspace))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "site onprem-dc1: stored ssh_known_hosts, ssh_private_key" in out.stdout
    out = run("-m", "orchestration.cli", "credentials", "cloud-eu", "--aws-access-key-id", " AKIAEXAMPLE1234 ",
              "--aws-secret-access-key-file", str(secret), "--home", str(workspace))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "site cloud-eu: stored aws_access_key_id, aws_secret_access_key" in out.stdout

    out = run("-c", READ_BACK, str(workspace))
    assert out.returncode == 0, out.stderr[-3000:]
    stored = json.loads(out.stdout.strip().splitlines()[-1])
    assert stored == {"key": key_text, "known_hosts": f"[127.0.0.1]:2222 {host}\n", "key_id": "AKIAEXAMPLE1234",
                      "secret": "wJalrXUtnFEMI/K7MDENG", "refused": ["ssh_private_key"]}
