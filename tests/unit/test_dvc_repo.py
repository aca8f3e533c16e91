"""DVC adapter on a real repo with local remotes: versions, counted pushes, pulls by pointer, tier rule."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from hybridtrain.datasets.dvc_repo import DvcRepo
from hybridtrain.datasets.transfer import DataMover
from hybridtrain.errors import DataError, SpecError
from hybridtrain.specs.sites import SitesCatalog

ROOT = Path(__file__).resolve().parents[2]
SITES = SitesCatalog.load(ROOT / "deployments" / "sites.yaml")


@pytest.fixture
def repo(tmp_path: Path) -> DvcRepo:
    ws = tmp_path / "ws"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return DvcRepo.ensure(ws, {"onprem-dc1": str(tmp_path / "onprem"), "cloud-eu": str(tmp_path / "cloud")},
                          default_remote="onprem-dc1")


def write_parts(d: Path, n: int = 4, size: int = 10_000, change: int | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        fill = b"y" if i == change else b"x"
        (d / f"part-{i}.bin").write_bytes(bytes([i]) + fill * (size - 1))


def test_add_records_hash_size_and_files(repo):
    write_parts(repo.root / "data" / "approved" / "job")
    v = repo.add("data/approved/job", "approved", "onprem-dc1")
    assert v.md5.endswith(".dir") and len(v.md5) == 36
    assert v.nfiles == 4 and v.size == 40_000
    assert repo.version("data/approved/job", "approved", "onprem-dc1") == v
    assert repo.is_present(v)


def test_push_counts_bytes_and_moves_only_changed_files(repo):
    d = repo.root / "data" / "approved" / "job"
    write_parts(d)
    v1 = repo.add("data/approved/job", "approved", "onprem-dc1")
    first = repo.push(v1, "cloud-eu")
    assert first.files == 5  # four parts and the .dir manifest
    assert 40_000 <= first.bytes < 41_000
    again = repo.push(v1, "cloud-eu")
    assert again.files == 0 and again.bytes == 0
    write_parts(d, change=2)
    v2 = repo.add("data/approved/job", "approved", "onprem-dc1")
    second = repo.push(v2, "cloud-eu")
    assert second.files == 2  # the changed part and the new manifest
    assert 10_000 <= second.bytes < 11_000


def test_push_reports_files_and_bytes_as_they_arrive(repo):
    write_parts(repo.root / "data" / "approved" / "job", n=6)
    v = repo.add("data/approved/job", "approved", "onprem-dc1")
    seen: list[tuple[int, int, int, int]] = []
    result = repo.push(v, "cloud-eu", on_progress=lambda *a: seen.append(a))
    assert seen[0] == (0, 7, 0, result.bytes)  # six parts and the manifest, nothing moved yet
    assert seen[-1] == (7, 7, result.bytes, result.bytes)
    moved = [b for _, _, b, _ in seen]
    assert moved == sorted(moved) and len(set(moved)) >= 7  # at least a step per object
    assert repo.missing_on(v, "cloud-eu") == (0, 0)  # and it really is there


def test_pull_by_pointer_into_a_site_copy(repo, tmp_path):
    write_parts(repo.root / "data" / "approved" / "job")
    v = repo.add("data/approved/job", "approved", "onprem-dc1")
    repo.push(v, "cloud-eu")
    site = DvcRepo.ensure(tmp_path / "site", {"cloud-eu": str(tmp_path / "cloud")}, "cloud-eu", scm=False)
    path = site.pull_pointer(v.at("cloud-eu"), "cloud-eu")
    assert sorted(p.name for p in path.iterdir()) == [f"part-{i}.bin" for i in range(4)]
    assert (path / "part-1.bin").read_bytes() == (repo.root / "data/approved/job/part-1.bin").read_bytes()


def test_pull_of_a_version_the_remote_lacks_is_a_clear_error(repo, tmp_path):
    write_parts(repo.root / "data" / "approved" / "job")
    v = repo.add("data/approved/job", "approved", "onprem-dc1")  # never pushed to cloud
    site = DvcRepo.ensure(tmp_path / "site", {"cloud-eu": str(tmp_path / "cloud")}, "cloud-eu", scm=False)
    with pytest.raises(DataError) as exc:
        site.pull_pointer(v, "cloud-eu")
    assert "could not be fetched from remote cloud-eu" in str(exc.value)


def test_checkout_restores_an_older_version_by_hash(repo):
    d = repo.root / "data" / "curated" / "job"
    write_parts(d)
    v1 = repo.add("data/curated/job", "curated", "onprem-dc1")
    write_parts(d, change=0)
    v2 = repo.add("data/curated/job", "curated", "onprem-dc1")
    assert v1.md5 != v2.md5
    repo.checkout(v1)
    assert repo.version("data/curated/job", "curated", "onprem-dc1").md5 == v1.md5
    assert (d / "part-0.bin").read_bytes()[1:2] == b"x"


def test_only_approved_data_may_leave_its_site(repo):
    write_parts(repo.root / "data" / "curated" / "job")
    v = repo.add("data/curated/job", "curated", "onprem-dc1")
    with pytest.raises(SpecError) as exc:
        DataMover(repo).sync_dataset(v, SITES.get("onprem-dc1"), SITES.get("cloud-eu"))
    assert "curated data may not leave site onprem-dc1" in str(exc.value)
    assert not (repo.root.parent / "cloud").exists()


def test_sync_record_prices_egress_at_the_source(repo):
    write_parts(repo.root / "data" / "approved" / "job", size=250_000)
    v = repo.add("data/approved/job", "approved", "onprem-dc1")
    cloud, onprem = SITES.get("cloud-eu"), SITES.get("onprem-dc1")
    moved, rec = DataMover(repo).sync_dataset(v, onprem, cloud)
    assert moved.site == "cloud-eu" and moved.md5 == v.md5
    assert rec.source == "onprem-dc1" and rec.destination == "cloud-eu" and rec.files == 5
    assert rec.cost_usd == pytest.approx(rec.bytes / 1e9 * onprem.egress_per_gb)


def test_concurrent_operations_on_one_checkout_are_serialized(repo):
    for name in ("a", "b", "c"):
        write_parts(repo.root / "data" / "approved" / name, n=2)
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            DvcRepo(repo.root).add(f"data/approved/{name}", "approved", "onprem-dc1")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n,)) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert all((repo.root / f"data/approved/{n}.dvc").is_file() for n in ("a", "b", "c"))


def _ensure_at(root: str, remote: str, barrier, errors) -> None:
    barrier.wait(timeout=60)
    try:
        repo = DvcRepo.ensure(root, {"cloud-eu": remote}, default_remote="cloud-eu", scm=False)
        with repo._repo() as r:  # open it as a stage would: state database, config, lock
            assert r.config["core"]["remote"] == "cloud-eu"
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        errors.put(f"{type(exc).__name__}: {exc}")


def test_runs_setting_up_one_site_copy_at_once_all_get_it(tmp_path):
    """Concurrent runs' first use of a site's working copy: one initialises it, none undoes another's."""
    import multiprocessing

    # spawn, not fork: a fork of this multi-threaded test process (Prefect's and pytest's threads) can
    # inherit a lock held by another thread and hang, as it did once in CI.
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        root = tmp_path / f"site-{attempt}"
        barrier, errors = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_ensure_at, args=(str(root), str(tmp_path / "remote"), barrier, errors))
                 for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        found = []
        while not errors.empty():
            found.append(errors.get())
        assert found == [] and [p.exitcode for p in procs] == [0, 0, 0, 0]
        assert (root / ".dvc" / "config.local").is_file()
