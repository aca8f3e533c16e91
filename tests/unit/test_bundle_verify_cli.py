"""`hybridtrain bundle verify PATH`: a bundle directory or packed archive, checked against the release public key."""

from __future__ import annotations

import os
import subprocess
import sys

from hybridtrain.errors import BundleRejected
from hybridtrain.governance.signing_key import SigningKey
from tests.fixtures.bundles import make_bundle
from tests.fixtures.workspaces import ROOT

KEY = SigningKey.generate()


def verify(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "orchestration.cli", "bundle", "verify", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_bundle_verify_accepts_an_intact_bundle_and_its_archive_and_names_what_changed(tmp_path):
    bundle = make_bundle(tmp_path / "b", KEY, version="7")
    pub = tmp_path / "release.pub.pem"
    pub.write_bytes(KEY.public.to_pem())
    ok = verify(str(bundle.root), "--public-key", str(pub))
    assert ok.returncode == 0, ok.stderr
    assert "verified" in ok.stdout and "v7" in ok.stdout
    packed = verify(str(bundle.pack(tmp_path / "b.tar")), "--public-key", str(pub))
    assert packed.returncode == 0, packed.stderr

    (bundle.root / "weights" / "model.pt").write_bytes(b"not the weights that were signed")
    bad = verify(str(bundle.root), "--public-key", str(pub))
    assert bad.returncode == BundleRejected.exit_code
    assert "weights/model.pt" in bad.stderr and "Traceback" not in bad.stderr

    other = tmp_path / "other.pub.pem"
    other.write_bytes(SigningKey.generate().public.to_pem())
    intact = make_bundle(tmp_path / "c", KEY, version="8")
    wrong_key = verify(str(intact.root), "--public-key", str(other))
    assert wrong_key.returncode == BundleRejected.exit_code and "Traceback" not in wrong_key.stderr


def test_bundle_verify_of_a_missing_path_is_a_clear_error(tmp_path):
    pub = tmp_path / "release.pub.pem"
    pub.write_bytes(KEY.public.to_pem())
    result = verify(str(tmp_path / "nope"), "--public-key", str(pub))
    assert result.returncode == 2 and "no such bundle" in result.stderr and "Traceback" not in result.stderr
