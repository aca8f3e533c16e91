"""Edge release target: only the signed edge export lands on the device, verified with the bundle's own signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridtrain.errors import BundleRejected, ReleaseRefused
from hybridtrain.governance.bundle import BundleDataset, ModelBundle
from hybridtrain.governance.edge_package import package_problems
from hybridtrain.governance.release import TARGET_KINDS, DirectoryTarget, EdgeTarget, Releaser
from hybridtrain.governance.signing_key import SigningKey
from tests.fixtures.bundles import make_bundle

KEY = SigningKey.generate()
MODEL = "churn-classifier"


def model_files(root: Path) -> Path:
    edge = root / "artifacts" / "edge"
    edge.mkdir(parents=True)
    (root / "MLmodel").write_text("flavors: {}\n")
    (root / "artifacts" / "network.pt").write_bytes(b"full network" * 100)
    (edge / "network.ts").write_bytes(b"torchscript" * 50)
    (edge / "featurizer.json").write_text('{"format": 1}')
    (edge / "score.py").write_text("print('scores')\n")
    return root


def edge_bundle(tmp_path: Path, version: str = "1") -> ModelBundle:
    return ModelBundle.build(
        tmp_path / "bundles" / version, model=MODEL, version=version, weights=model_files(tmp_path / f"m{version}"),
        spec={}, datasets=[BundleDataset(tier="raw", path="data/raw", md5="1" * 32)], evaluation={}, lineage={},
        checkpoint_sha256=None, signing_key=KEY, environment={})


def test_edge_is_a_registered_kind_that_keeps_only_the_export(tmp_path):
    assert TARGET_KINDS.get("edge") is EdgeTarget
    t = EdgeTarget("edge-1", tmp_path / "device", KEY.public)
    t.accept(edge_bundle(tmp_path))
    t.set_current(MODEL, "1")
    root = tmp_path / "device" / "versions" / MODEL / "1"
    held = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert held == ["manifest.json", "signature.json", "weights/artifacts/edge/featurizer.json",
                    "weights/artifacts/edge/network.ts", "weights/artifacts/edge/score.py"]
    assert package_problems(root, KEY.public) == []


def test_a_changed_or_added_file_or_another_key_fails_the_package(tmp_path):
    t = EdgeTarget("edge-1", tmp_path / "device", KEY.public)
    t.accept(edge_bundle(tmp_path))
    root = tmp_path / "device" / "versions" / MODEL / "1"
    (root / "weights/artifacts/edge/network.ts").write_bytes(b"evil")
    (root / "weights/artifacts/edge/extra.py").write_text("x")
    found = {p.path: p.message for p in package_problems(root, KEY.public)}
    assert "changed since signing" in found["weights/artifacts/edge/network.ts"]
    assert "added" in found["weights/artifacts/edge/extra.py"]
    other = SigningKey.generate()
    assert any("trusted key" in p.message for p in package_problems(root, other.public))


def test_a_tampered_bundle_is_refused_and_one_without_export_is_refused(tmp_path):
    t = EdgeTarget("edge-1", tmp_path / "device", KEY.public)
    b = edge_bundle(tmp_path)
    (b.root / "weights/artifacts/edge/score.py").write_text("import os; os.system('x')\n")
    with pytest.raises(BundleRejected, match="score.py"):
        t.accept(b)
    with pytest.raises(ReleaseRefused, match="no edge export"):
        t.accept(make_bundle(tmp_path / "plain", KEY, model=MODEL, version="2"))
    assert t.versions(MODEL) == []


def test_rollback_takes_bundles_from_full_targets_never_from_an_edge_target(tmp_path):
    edge = EdgeTarget("edge-1", tmp_path / "device", KEY.public)
    a = DirectoryTarget("onprem-a", tmp_path / "a", KEY.public)
    b = DirectoryTarget("onprem-b", tmp_path / "b", KEY.public)
    releaser = Releaser([edge, a, b])  # no archive: a rollback re-releases from a target
    releaser.publish(edge_bundle(tmp_path, "1"))
    releaser.publish(edge_bundle(tmp_path, "2"))
    b.remove(MODEL, "1")
    record = releaser.restore(MODEL, "1")
    assert {h.target: h.current for h in record.targets} == {"edge-1": "1", "onprem-a": "1", "onprem-b": "1"}
    ModelBundle(tmp_path / "b" / "versions" / MODEL / "1").verify(KEY.public)  # the full bundle, from onprem-a
    with pytest.raises(ReleaseRefused, match="only the edge export"):
        edge.fetch(MODEL, "1", tmp_path / "x")
