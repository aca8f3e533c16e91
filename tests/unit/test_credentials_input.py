"""`init` and `credentials` refuse a wrong home, site or credential in one line before anything is set up.

Each refusal names the option (or file) and the fix, exits non-zero without a traceback, and leaves the
workspace as it was: no ``.hybridtrain/`` (Prefect database), no ``.dvc``, no server started, nothing stored.
The commands run as a user runs them (``python -m orchestration.cli`` in a subprocess, no Prefect settings
in the environment, so the old code would have started its embedded server); what a credential must be is
checked directly too (``blocks.register.credential_problems``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from hybridtrain.errors import HybridtrainError
from hybridtrain.specs.sites import Site, SitesCatalog
from tests.fixtures.workspaces import ROOT

KEY_ID = "AKIAEXAMPLE1234"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a newcomer's shell runs it: no Prefect, MLflow or hybridtrain settings in the environment."""
    drop = ("PREFECT_", "HYBRIDTRAIN_", "MLFLOW_TRACKING", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="80")  # narrow: a message must stay one line all the same
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def refused(out: subprocess.CompletedProcess[str], *needles: str, lines: int = 1) -> str:
    """The one-line refusal (``lines`` lines) on stderr, exit 2, no traceback, holding every needle."""
    text = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert len(text.splitlines()) == lines, text
    for needle in needles:
        assert needle in text, text
    return text


def untouched(root: Path) -> None:
    """Nothing of a set-up workspace exists: no state (Prefect database, keys), no DVC repo."""
    assert not (root / ".hybridtrain").exists() and not (root / ".dvc").exists(), sorted(os.listdir(root))


def openssh(key, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption).decode()


def public_line(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


HOSTS = [{"hostname": "127.0.0.1", "port": 2222, "username": "train", "gpus": 1},
         {"hostname": "gpu2.example.com", "username": "train", "gpus": 1}]


@pytest.fixture
def ssh_workspace(workspace: Path) -> Path:
    """The project's workspace with two SSH hosts at onprem-dc1 and an S3 store at cloud-eu."""
    sites = workspace / "deployments" / "sites.yaml"
    data = yaml.safe_load(sites.read_text())
    data["sites"][0]["hosts"] = HOSTS
    data["sites"][1]["store"] = {"kind": "s3", "bucket": "ml-data", "prefix": "cloud-eu"}
    sites.write_text(yaml.safe_dump(data, sort_keys=False))
    return workspace


@pytest.fixture
def host_key() -> str:
    return public_line(ed25519.Ed25519PrivateKey.generate())


def known_hosts(host_key: str, *names: str) -> str:
    return "".join(f"{name} {host_key}\n" for name in names)


# -- init ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("home, why", [
    ("missing/dir", "does not exist"),
    ("a-file", "is a file, not a directory"),
    ("empty", "is not a workspace"),
])
def test_init_refuses_a_home_that_is_not_a_project_checkout_and_creates_nothing(tmp_path, home, why):
    (tmp_path / "a-file").write_text("not a workspace\n")
    (tmp_path / "empty").mkdir()
    out = cli("init", "--home", str(tmp_path / home))
    refused(out, "--home", str(tmp_path / home), why, "deployments/sites.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "empty"]
    assert list((tmp_path / "empty").iterdir()) == []


def test_init_with_an_invalid_sites_catalog_names_it_before_creating_anything(workspace):
    sites = workspace / "deployments" / "sites.yaml"
    data = yaml.safe_load(sites.read_text())
    data["sites"][0]["gpu_count"] = -1
    sites.write_text(yaml.safe_dump(data, sort_keys=False))
    out = cli("init", "--home", str(workspace))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert str(sites) in out.stderr and "gpu_count" in out.stderr
    untouched(workspace)


def test_opening_a_session_from_python_checks_the_home_first(tmp_path, workspace):
    from orchestration.session import open_session

    with pytest.raises(HybridtrainError) as exc:
        open_session(tmp_path / "missing")
    assert "does not exist" in str(exc.value) and "deployments/sites.yaml" in str(exc.value)
    assert not (tmp_path / "missing").exists()
    (workspace / ".hybridtrain").write_text("")  # where the Prefect database and keys would go
    with pytest.raises(HybridtrainError) as exc:
        open_session(workspace)
    assert f"{workspace / '.hybridtrain'}: is a file" in str(exc.value)
    assert not (workspace / ".dvc").exists()


# -- credentials: the site and the options ------------------------------------------------------


def test_credentials_for_an_unknown_site_lists_the_known_ones_and_sets_nothing_up(ssh_workspace, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text(openssh(ed25519.Ed25519PrivateKey.generate()))
    out = cli("credentials", "nosuchsite", "--ssh-key", str(key), "--home", str(ssh_workspace))
    refused(out, "'nosuchsite'", "sites: onprem-dc1, cloud-eu")
    untouched(ssh_workspace)


def test_credentials_with_no_option_is_an_error_not_a_success(ssh_workspace):
    out = cli("credentials", "onprem-dc1", "--home", str(ssh_workspace))
    refused(out, "nothing to store for site onprem-dc1", "--ssh-key", "--aws-secret-access-key-file")
    untouched(ssh_workspace)


def test_an_option_the_site_does_not_use_is_refused(workspace, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text(openssh(ed25519.Ed25519PrivateKey.generate()))
    # The project's catalog: onprem-dc1 lists no SSH hosts, cloud-eu keeps a local store and starts no instances.
    out = cli("credentials", "onprem-dc1", "--ssh-key", str(key), "--home", str(workspace))
    refused(out, f"--ssh-key {key}:", "site onprem-dc1 has no SSH hosts", "sites.onprem-dc1.hosts")
    out = cli("credentials", "cloud-eu", "--aws-access-key-id", KEY_ID, "--home", str(workspace))
    text = refused(out, "--aws-access-key-id:", "store.kind: local", "uses no AWS credentials")
    assert KEY_ID not in text
    untouched(workspace)


# -- credentials: what each value must be ---------------------------------------------------------


@pytest.mark.parametrize("content, needle", [
    (b"\x00\xff\xfe\x80binary", "is not a text file"),
    (b"hi\n", "not a private key hybridtrain can use"),
    (b"", "is empty"),
])
def test_an_ssh_key_that_is_not_a_private_key_is_refused(ssh_workspace, tmp_path, content, needle):
    key = tmp_path / "key"
    key.write_bytes(content)
    out = cli("credentials", "onprem-dc1", "--ssh-key", str(key), "--home", str(ssh_workspace))
    refused(out, f"--ssh-key {key}", needle)
    untouched(ssh_workspace)


def test_a_passphrase_protected_key_is_refused_with_how_to_store_a_usable_copy(ssh_workspace, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text(openssh(ed25519.Ed25519PrivateKey.generate(), b"correct horse"))
    out = cli("credentials", "onprem-dc1", "--ssh-key", str(key), "--home", str(ssh_workspace))
    refused(out, f"--ssh-key {key}", "passphrase", "ssh-keygen -p -N ''")
    untouched(ssh_workspace)


def test_known_hosts_that_do_not_parse_or_miss_a_host_are_refused(ssh_workspace, tmp_path, host_key):
    bad = tmp_path / "known_hosts"
    bad.write_text("hi\n")
    out = cli("credentials", "onprem-dc1", "--known-hosts", str(bad), "--home", str(ssh_workspace))
    refused(out, f"--known-hosts {bad}", "line 1")
    partial = tmp_path / "known_hosts_partial"
    partial.write_text(known_hosts(host_key, "[127.0.0.1]:2222"))
    out = cli("credentials", "onprem-dc1", "--known-hosts", str(partial), "--home", str(ssh_workspace))
    refused(out, f"--known-hosts {partial}", "pins no key for gpu2.example.com")
    untouched(ssh_workspace)


def test_empty_aws_credentials_are_refused_and_every_problem_is_named_at_once(ssh_workspace, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("\n")
    out = cli("credentials", "cloud-eu", "--aws-access-key-id", "", "--aws-secret-access-key-file", str(secret),
              "--home", str(ssh_workspace))
    text = refused(out, lines=2)
    assert text.splitlines()[0].startswith("--aws-access-key-id: is empty"), text
    assert text.splitlines()[1].startswith(f"--aws-secret-access-key-file {secret} is empty"), text
    untouched(ssh_workspace)


def test_a_missing_or_directory_file_is_named(ssh_workspace, tmp_path):
    out = cli("credentials", "onprem-dc1", "--ssh-key", str(tmp_path / "nope"), "--known-hosts", str(tmp_path),
              "--home", str(ssh_workspace))
    text = refused(out, lines=2)
    assert f"--ssh-key {tmp_path / 'nope'}: no such file" in text and f"--known-hosts {tmp_path} is a directory" in text
    untouched(ssh_workspace)


# -- the checks themselves (what `credentials` and blocks.register.set_credentials run) ------------------


@pytest.fixture
def catalog(ssh_workspace) -> SitesCatalog:
    return SitesCatalog.load(ssh_workspace / "deployments" / "sites.yaml")


def pem_rsa() -> str:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()).decode()


def test_usable_credentials_pass(catalog, host_key):
    from blocks.register import credential_problems

    onprem, cloud = catalog.get("onprem-dc1"), catalog.get("cloud-eu")
    hashed = "".join(f"{paramiko.HostKeys.hash_host(name)} {host_key}\n" for name in ("[127.0.0.1]:2222",
                                                                                       "gpu2.example.com"))
    for key in (openssh(ed25519.Ed25519PrivateKey.generate()), pem_rsa(),
                openssh(ec.generate_private_key(ec.SECP256R1())), openssh(ed25519.Ed25519PrivateKey.generate())
                .replace("\n", "\r\n")):
        assert credential_problems(onprem, ssh_private_key=key) == []
    assert credential_problems(onprem, ssh_known_hosts=known_hosts(host_key, "[127.0.0.1]:2222", "gpu2.example.com")
                               ) == []
    assert credential_problems(onprem, ssh_known_hosts="# pinned\n" + hashed) == []
    assert credential_problems(cloud, aws_access_key_id=KEY_ID, aws_secret_access_key="wJalrXUtnFEMI/K7MDENG") == []


def test_a_site_that_starts_instances_takes_an_ssh_key_and_aws_keys_but_no_known_hosts(catalog, host_key):
    from blocks.register import credential_problems

    instances = {"region": "eu-west-1", "image_id": "ami-12c6146b", "instance_type": "c5.large",
                 "username": "train", "host_key": host_key}
    local = {"kind": "local", "path": ".hybridtrain/stores/cloud-eu"}  # AWS keys are for the EC2 API here
    cloud = Site.model_validate({**catalog.get("cloud-eu").model_dump(mode="json"), "store": local,
                                 "instances": instances})
    key = openssh(ed25519.Ed25519PrivateKey.generate())
    assert credential_problems(cloud, ssh_private_key=key, aws_access_key_id=KEY_ID,
                               aws_secret_access_key="secret") == []
    [problem] = credential_problems(cloud, ssh_known_hosts=known_hosts(host_key, "gpu1"))
    assert problem.path == "ssh_known_hosts" and "instances.host_key" in problem.message


def test_unusable_credentials_are_named_by_field_and_never_echoed(catalog, host_key):
    from blocks.register import credential_problems

    onprem, cloud = catalog.get("onprem-dc1"), catalog.get("cloud-eu")
    secret_junk = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXN0dWZm\n-----END OPENSSH PRIVATE KEY-----\n"
    cases = [
        (onprem, "ssh_private_key", secret_junk, "not a private key"),
        (onprem, "ssh_private_key", public_line(ed25519.Ed25519PrivateKey.generate()), "public key"),
        (onprem, "ssh_private_key", openssh(rsa.generate_private_key(public_exponent=65537, key_size=2048), b"pw"),
         "passphrase"),
        (onprem, "ssh_known_hosts", "# nothing but a comment\n", "no host key lines"),
        (onprem, "ssh_known_hosts", "@revoked * " + host_key + "\n", "line 1"),
        (cloud, "ssh_private_key", openssh(ed25519.Ed25519PrivateKey.generate()), "no SSH hosts"),
        (cloud, "ssh_known_hosts", known_hosts(host_key, "gpu1"), "no SSH hosts"),
        (onprem, "aws_access_key_id", KEY_ID, "uses no AWS credentials"),
        (cloud, "aws_access_key_id", "AKIA EXAMPLE", "one word"),
        (cloud, "aws_access_key_id", " ", "is empty"),
        (cloud, "aws_secret_access_key", "", "is empty"),
        (cloud, "aws_secret_access_key", "first\nsecond", "more than the key"),
    ]
    for site, field, value, needle in cases:
        [problem] = credential_problems(site, **{field: value})
        assert (problem.path, needle in problem.message) == (field, True), (field, needle, problem.message)
        assert "c2VjcmV0" not in problem.message and "second" not in problem.message
    # A field whose file could not be read (None) is still checked for fitting the site.
    [problem] = credential_problems(cloud, ssh_private_key=None)
    assert "no SSH hosts" in problem.message
    assert credential_problems(onprem, ssh_private_key=None) == []
