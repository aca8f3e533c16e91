"""Release targets (a serving directory, an object store): verify before accepting, publish atomically, keep a current
pointer; the Releaser rolls back everywhere and retires everywhere."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybridtrain.errors import BundleRejected, ReleaseRefused, SpecError
from hybridtrain.governance.bundle import ModelBundle
from hybridtrain.governance.release import (
    TARGET_KINDS,
    BundleArchive,
    DirectoryTarget,
    ObjectStoreTarget,
    Releaser,
    open_targets,
)
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import ReleaseTargetSpec
from hybridtrain.specs.sites import SitesCatalog
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import ObjectInfo
from tests.fixtures.bundles import make_bundle

ROOT = Path(__file__).resolve().parents[2]
KEY = SigningKey.generate()
MODEL = "churn-classifier"


def target(kind: str, tmp_path: Path, key=KEY, name: str | None = None):
    name = name or f"{kind.replace('_', '-')}-1"
    if kind == "directory":
        return DirectoryTarget(name, tmp_path / name, key.public)
    return ObjectStoreTarget(name, LocalObjectStore(tmp_path / name), key.public)


@pytest.fixture
def bundles(tmp_path: Path) -> dict[str, ModelBundle]:
    return {v: make_bundle(tmp_path / "build" / v, KEY, model=MODEL, version=v) for v in ("1", "2", "3")}


def visible_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["directory", "object_store"])
def test_a_target_verifies_stores_and_points_at_a_version(tmp_path, bundles, kind):
    t = target(kind, tmp_path)
    marker = t.accept(bundles["1"])
    assert marker.manifest_sha256 == bundles["1"].manifest_sha256 and marker.key_id == KEY.key_id
    assert t.versions(MODEL) == ["1"] and t.current(MODEL) is None  # held, not yet served
    t.set_current(MODEL, "1")
    assert t.current(MODEL) == "1"
    root = tmp_path / t.name
    assert (root / "versions" / MODEL / "1" / "weights" / "model.pt").read_bytes() == \
        (bundles["1"].root / "weights" / "model.pt").read_bytes()
    assert (root / "released" / MODEL / "1.json").is_file() and (root / "current" / f"{MODEL}.json").is_file()
    ModelBundle(root / "versions" / MODEL / "1").verify(KEY.public)  # a serving system can verify it in place
    fetched = t.fetch(MODEL, "1", tmp_path / "fetched")
    assert fetched.verify(KEY.public).manifest_sha256 == bundles["1"].manifest_sha256
    assert t.accept(bundles["1"]) == marker  # idempotent for the same bundle


@pytest.mark.parametrize("kind", ["directory", "object_store"])
def test_a_tampered_bundle_is_refused_and_nothing_appears(tmp_path, bundles, kind):
    t = target(kind, tmp_path)
    weights = bundles["2"].root / "weights" / "model.pt"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")
    with pytest.raises(BundleRejected) as exc:
        t.accept(bundles["2"])
    assert exc.value.files == ["weights/model.pt"]
    assert t.versions(MODEL) == [] and not (tmp_path / t.name).exists()


@pytest.mark.parametrize("kind", ["directory", "object_store"])
def test_a_target_trusts_only_its_own_key(tmp_path, bundles, kind):
    t = target(kind, tmp_path, key=SigningKey.generate())
    with pytest.raises(BundleRejected, match="but the trusted key is"):
        t.accept(bundles["1"])
    assert t.versions(MODEL) == []


@pytest.mark.parametrize("kind", ["directory", "object_store"])
def test_a_version_is_immutable_once_released(tmp_path, bundles, kind):
    t = target(kind, tmp_path)
    t.accept(bundles["1"])
    rebuilt = make_bundle(tmp_path / "rebuilt", KEY, model=MODEL, version="1", weights=b"other weights")
    with pytest.raises(ReleaseRefused, match="already holds v1 with other content"):
        t.accept(rebuilt)
    with pytest.raises(ReleaseRefused, match="does not hold v7"):
        t.set_current(MODEL, "7")


class FailingStore(LocalObjectStore):
    """A store whose connection drops after ``ok`` uploads."""

    def __init__(self, root: Path, ok: int):
        super().__init__(root)
        self.ok = ok

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        if self.ok == 0:
            raise ConnectionError("connection reset by peer")
        self.ok -= 1
        return super().put_file(key, path)


def test_an_upload_cut_off_midway_is_never_visible_as_a_version(tmp_path, bundles):
    store = FailingStore(tmp_path / "s3", ok=3)
    t = ObjectStoreTarget("cloud", store, KEY.public)
    with pytest.raises(ConnectionError):
        t.accept(bundles["2"])
    assert t.versions(MODEL) == [] and t.current(MODEL) is None  # objects landed, but no marker: not released
    store.ok = 10**6
    t.accept(bundles["2"])  # the retry completes it
    assert t.versions(MODEL) == ["2"]


def test_a_copy_cut_off_midway_leaves_nothing_in_the_serving_directory(tmp_path, bundles, monkeypatch):
    t = target("directory", tmp_path)
    t.accept(bundles["1"])
    before = visible_files(tmp_path / t.name)
    calls = {"n": 0}
    real = shutil.copyfile

    def flaky(src, dst, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(28, "No space left on device")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", flaky)
    with pytest.raises(OSError, match="No space left"):
        t.accept(bundles["2"])
    assert visible_files(tmp_path / t.name) == before and t.versions(MODEL) == ["1"]


def test_publish_rollback_and_retire_across_a_directory_and_an_object_store(tmp_path, bundles):
    onprem, cloud = target("directory", tmp_path), target("object_store", tmp_path)
    archive = BundleArchive(LocalObjectStore(tmp_path / "archive"))
    releaser = Releaser([onprem, cloud], archive)
    releaser.publish(bundles["1"])
    record = releaser.publish(bundles["2"])
    assert record.action == "release" and record.manifest_sha256 == bundles["2"].manifest_sha256
    assert [(h.target, h.current, h.versions) for h in record.targets] == [
        ("directory-1", "2", ["1", "2"]), ("object-store-1", "2", ["1", "2"])]
    assert record.tags()["hybridtrain.release.directory-1"] == f"current at {onprem.url}"
    assert archive.versions(MODEL) == ["1", "2"] and releaser.available_versions(MODEL) == ["1", "2"]

    # The cloud target lost v1 (say, a lifecycle rule deleted it): rollback re-releases it from the archive.
    cloud.remove(MODEL, "1")
    assert cloud.versions(MODEL) == ["2"]
    back = releaser.restore(MODEL, "1")
    assert back.action == "rollback"
    assert [(h.current, h.versions) for h in back.targets] == [("1", ["1", "2"]), ("1", ["1", "2"])]
    ModelBundle(tmp_path / "object-store-1" / "versions" / MODEL / "1").verify(KEY.public)

    with pytest.raises(ReleaseRefused, match="v1 is served as current by directory-1, object-store-1"):
        releaser.retire(MODEL, "1")
    gone = releaser.retire(MODEL, "2")
    assert [(h.current, h.versions) for h in gone.targets] == [("1", ["1"]), ("1", ["1"])]
    assert not (tmp_path / "directory-1" / "versions" / MODEL / "2").exists()
    assert not [o for o in cloud.store.list(f"versions/{MODEL}/2/")]
    assert archive.has(MODEL, "2")  # the retired bundle stays as evidence
    assert gone.tags()["hybridtrain.release.object-store-1"].startswith("absent at ")


def test_a_stage_refused_by_one_target_moves_no_pointer(tmp_path, bundles):
    good, picky = target("directory", tmp_path), target("object_store", tmp_path, key=SigningKey.generate())
    releaser = Releaser([good, picky])
    with pytest.raises(BundleRejected):
        releaser.publish(bundles["1"])
    assert good.current(MODEL) is None and picky.versions(MODEL) == []


def test_restore_without_any_copy_left_is_refused(tmp_path, bundles):
    releaser = Releaser([target("directory", tmp_path)])
    with pytest.raises(ReleaseRefused, match="no signed bundle of v3 is left in the archive or on any target"):
        releaser.restore(MODEL, "3")


def test_targets_open_from_spec_entries_by_kind(tmp_path, bundles):
    sites = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")
    specs = [ReleaseTargetSpec(name="onprem-serving", path="serving"),
             ReleaseTargetSpec(name="edge-1", kind="object_store", site="cloud-eu", prefix="edge/releases")]
    targets = open_targets(specs, root=tmp_path, sites=sites, trusted_key=KEY.public)
    assert [type(t).__name__ for t in targets] == ["DirectoryTarget", "ObjectStoreTarget"]
    Releaser(targets).publish(bundles["1"])
    assert (tmp_path / "serving" / "current" / f"{MODEL}.json").is_file()
    assert (tmp_path / ".hybridtrain" / "stores" / "cloud-eu" / "edge" / "releases" / "released" / MODEL
            / "1.json").is_file()
    assert TARGET_KINDS.names == ["directory", "edge", "object_store"] and TARGET_KINDS.default == "directory"
    with pytest.raises(SpecError, match="unknown release target kind 'ftp'; choose one of: directory \\(default\\), edge, "
                                        "object_store"):
        TARGET_KINDS.get("ftp")


@pytest.mark.parametrize("kind", ["directory", "object_store"])
@pytest.mark.parametrize("tamper", ["weights", "manifest"])
def test_restore_re_verifies_a_held_version_before_serving_it_again(tmp_path, bundles, kind, tamper):
    t = target(kind, tmp_path)
    releaser = Releaser([t])
    releaser.publish(bundles["1"])
    releaser.publish(bundles["2"])
    # v1 is still held (not current) when someone swaps its weights — or the whole manifest — in place.
    if kind == "directory":
        held = tmp_path / t.name / "versions" / MODEL / "1"
        victim = held / ("weights/model.pt" if tamper == "weights" else "manifest.json")
        victim.write_bytes(victim.read_bytes() + b"tampered")
    else:
        key = f"versions/{MODEL}/1/" + ("weights/model.pt" if tamper == "weights" else "manifest.json")
        t.store.put_bytes(key, t.store.get_bytes(key) + b"tampered")
    with pytest.raises(BundleRejected):
        releaser.restore(MODEL, "1")
    assert t.current(MODEL) == "2"  # the pointer did not move to the tampered copy


def test_restore_of_an_intact_held_version_still_works(tmp_path, bundles):
    t = target("directory", tmp_path)
    releaser = Releaser([t])
    releaser.publish(bundles["1"])
    releaser.publish(bundles["2"])
    record = releaser.restore(MODEL, "1")
    assert t.current(MODEL) == "1" and record.manifest_sha256 == bundles["1"].manifest_sha256
