"""ModelBundle: signed and verified; any changed, added or removed byte or file is refused naming the file."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from hybridtrain.errors import BundleRejected
from hybridtrain.governance.bundle import (
    EVIDENCE_FILES,
    MANIFEST,
    SIGNATURE,
    ModelBundle,
    environment_info,
    file_sha256,
)
from hybridtrain.governance.signing_key import SigningKey, VerifyKey
from tests.fixtures.bundles import CHECKPOINT_SHA, DATASETS, make_bundle

KEY = SigningKey.generate()


@pytest.fixture
def bundle(tmp_path: Path) -> ModelBundle:
    return make_bundle(tmp_path / "bundle", KEY, version="7")


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_built_bundle_holds_the_evidence_and_verifies(bundle):
    assert bundle.verify(KEY.public) is bundle
    assert (bundle.model, bundle.version, bundle.key_id) == ("churn-classifier", "7", KEY.key_id)
    files = bundle.files()
    assert files[-2:] == [MANIFEST, SIGNATURE] and "weights/model.pt" in files
    assert set(EVIDENCE_FILES) <= set(files)
    manifest = bundle.manifest
    assert set(manifest.files) == set(files) - {MANIFEST, SIGNATURE}
    for rel, entry in manifest.files.items():
        assert entry.sha256 == file_sha256(bundle.root / rel) and entry.size == (bundle.root / rel).stat().st_size
    assert {t: d.md5 for t, d in bundle.datasets().items()} == DATASETS
    assert {d.tier for d in bundle.datasets().values()} == {"raw", "curated", "approved"}
    assert bundle.checkpoint_sha256 == CHECKPOINT_SHA
    assert bundle.evaluation()["metrics"]["auc"] == 0.8
    signature = json.loads((bundle.root / SIGNATURE).read_text())
    assert signature["algorithm"] == "ed25519" and signature["signed"] == MANIFEST


def test_a_directory_of_model_files_becomes_the_weights(tmp_path):
    model_dir = tmp_path / "mlflow-model"
    (model_dir / "data").mkdir(parents=True)
    (model_dir / "MLmodel").write_text("flavors: {}\n")
    (model_dir / "data" / "model.pth").write_bytes(b"\x00" * 100)
    bundle = ModelBundle.build(tmp_path / "b", model="m", version="1", weights=model_dir, spec={},
                               datasets=[], evaluation={}, lineage={}, checkpoint_sha256=None, signing_key=KEY)
    assert {"weights/MLmodel", "weights/data/model.pth"} <= set(bundle.files())
    bundle.verify(KEY.public)


def test_the_environment_lists_python_and_installed_packages():
    env = environment_info()
    assert env["python"].count(".") == 2
    assert {"cryptography", "pydantic", "mlflow"} <= set(env["packages"])
    env["packages"].clear()  # each call gets its own copy: a caller's edit does not leak into the next bundle
    assert "mlflow" in environment_info()["packages"]


@pytest.mark.parametrize("rel", ["weights/model.pt", *EVIDENCE_FILES, MANIFEST, SIGNATURE])
def test_one_flipped_byte_in_any_file_is_refused_naming_the_file(bundle, rel):
    flip_one_byte(bundle.root / rel)
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert rel in str(exc.value)
    assert "was refused" in str(exc.value) and "sign it again" in str(exc.value)
    if rel not in (MANIFEST, SIGNATURE):
        assert exc.value.files == [rel]
        assert "content changed since signing" in str(exc.value)


def test_an_added_file_is_refused(bundle):
    (bundle.root / "weights" / "extra.bin").write_bytes(b"smuggled")
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert exc.value.files == ["weights/extra.bin"] and "added: not in the signed manifest" in str(exc.value)


def test_a_removed_file_is_refused(bundle):
    (bundle.root / "datasets.json").unlink()
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert exc.value.files == ["datasets.json"] and "missing" in str(exc.value)


def test_a_symlink_is_refused_even_to_identical_bytes(bundle, tmp_path):
    target = tmp_path / "copy.pt"
    target.write_bytes((bundle.root / "weights" / "model.pt").read_bytes())
    (bundle.root / "weights" / "model.pt").unlink()
    os.symlink(target, bundle.root / "weights" / "model.pt")
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert exc.value.files == ["weights/model.pt"] and "symbolic link" in str(exc.value)


def test_a_bundle_signed_by_another_key_is_refused(tmp_path):
    other = SigningKey.generate()
    bundle = make_bundle(tmp_path / "b", other)
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert f"signed by key {other.key_id}, but the trusted key is {KEY.key_id}" in str(exc.value)


def test_a_re_signed_manifest_under_the_same_key_id_is_refused(bundle):
    # An attacker edits a weight, updates the manifest and keeps the old signature: the manifest no longer matches.
    (bundle.root / "weights" / "model.pt").write_bytes(b"evil")
    manifest = json.loads((bundle.root / MANIFEST).read_text())
    manifest["files"]["weights/model.pt"] = {"sha256": file_sha256(bundle.root / "weights" / "model.pt"), "size": 4}
    (bundle.root / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    with pytest.raises(BundleRejected) as exc:
        bundle.verify(KEY.public)
    assert exc.value.files == [MANIFEST] and "signature" in str(exc.value)


def test_pack_and_unpack_round_trip_and_tampering_in_transit_is_caught(bundle, tmp_path):
    archive = bundle.pack(tmp_path / "b.tar")
    again = bundle.pack(tmp_path / "again.tar")
    assert archive.read_bytes() == again.read_bytes()  # deterministic: same bundle, same archive bytes
    copy = ModelBundle.unpack(archive, tmp_path / "unpacked")
    copy.verify(KEY.public)
    assert copy.manifest_sha256 == bundle.manifest_sha256
    data = bytearray(archive.read_bytes())
    offset = data.find(b"weights of churn-classifier")
    data[offset] ^= 0x01
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    with pytest.raises(BundleRejected) as exc:
        ModelBundle.unpack(tmp_path / "bad.tar", tmp_path / "bad").verify(KEY.public)
    assert exc.value.files == ["weights/model.pt"]


def test_unpack_refuses_members_outside_the_bundle(tmp_path):
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
        link = tarfile.TarInfo("weights/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(BundleRejected) as exc:
        ModelBundle.unpack(path, tmp_path / "out")
    assert exc.value.files == ["../escape.txt", "weights/link"]
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "out").exists()


def test_a_bundle_is_written_once(bundle):
    with pytest.raises(FileExistsError):
        make_bundle(bundle.root, KEY)
    assert not [p for p in bundle.root.parent.iterdir() if p.name.startswith(".tmp-")]


def test_keys_round_trip_through_pem_and_never_show_the_private_half():
    pem = KEY.to_pem()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    again = SigningKey.from_pem(pem)
    assert again.key_id == KEY.key_id and again.public == KEY.public
    assert VerifyKey.from_pem(KEY.public.to_pem()).key_id == KEY.key_id
    assert KEY.key_id.startswith("ed25519:") and len(KEY.key_id) == len("ed25519:") + 32
    assert "hidden" in repr(KEY) and pem.decode() not in repr(KEY)
    locked = KEY.to_pem(password=b"pw")
    assert SigningKey.from_pem(locked, password=b"pw").key_id == KEY.key_id
    with pytest.raises(ValueError, match="not a usable PEM private key"):
        SigningKey.from_pem(b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ValueError, match="not a PEM public key"):
        VerifyKey.from_pem("garbage")
