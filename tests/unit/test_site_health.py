"""Site health without servers: bounded probes, local stores, worker heartbeats, aggregation."""

from __future__ import annotations

import threading
import time

import pytest

from hybridtrain.errors import SiteUnavailable
from hybridtrain.remote.site_health import assess, check_site, probe, probe_store, probe_workers, unavailable
from hybridtrain.specs.sites import LocalStore, Site
from hybridtrain.storage.local import LocalObjectStore


def local_site(path, name="onprem-dc1") -> Site:
    return Site(name=name, kind="onprem", region="eu", jurisdiction="EU", price_per_gpu_hour=1.0, work_pool="onprem",
                store=LocalStore(path=str(path)))


def test_a_probe_that_does_not_answer_fails_within_its_timeout():
    release = threading.Event()
    started = time.monotonic()
    check = probe("store nfs://stuck", lambda: str(release.wait(30)), timeout_s=0.2)
    assert time.monotonic() - started < 5
    release.set()  # let the abandoned thread finish
    assert not check.ok and check.detail == "no answer within 0.2 s" and check.seconds >= 0.2


def test_a_probe_reports_the_error_it_exists_to_find_and_raises_bugs():
    def unreachable() -> str:
        raise SiteUnavailable("cloud-eu", "S3 endpoint http://x did not answer")

    check = probe("store s3://b", unreachable)
    assert not check.ok and "SiteUnavailable" in check.detail and "did not answer" in check.detail
    ok = probe("thing", lambda: "fine")
    assert ok.ok and ok.detail == "fine" and str(ok).startswith("thing: ok (fine")

    def bug() -> str:
        raise KeyError("typo")

    with pytest.raises(KeyError):
        probe("thing", bug)


def test_local_store_probe(tmp_path):
    assert probe_store(LocalObjectStore(tmp_path)).ok
    later = probe_store(LocalObjectStore(tmp_path / "objects" / "not-yet"))
    assert later.ok and "will be created" in later.detail
    (tmp_path / "file").write_text("x")
    clash = probe_store(LocalObjectStore(tmp_path / "file"))
    assert not clash.ok and "not a directory" in clash.detail


def test_worker_heartbeat():
    assert probe_workers("onprem", None) is None  # not known: not checked
    none = probe_workers("onprem", 0)
    assert not none.ok and "no worker" in none.detail and none.name == "workers of pool onprem"
    assert probe_workers("onprem", 3).detail == "3 online"
    with pytest.raises(ValueError):
        probe_workers("onprem", -1)


def test_check_site_folds_every_probe(tmp_path):
    healthy = check_site(local_site(tmp_path / "store"), tmp_path, workers_online=2)
    assert healthy.healthy and [c.name.split()[0] for c in healthy.checks] == ["store", "workers"]
    assert healthy.checked_at.tzinfo is not None
    idle = check_site(local_site(tmp_path / "store"), tmp_path, workers_online=0)
    assert not idle.healthy and idle.reason.startswith("workers of pool onprem: no worker")
    assert unavailable([healthy, idle]) == {"onprem-dc1": idle.reason}
    assert [r["check"] for r in idle.to_rows()] == [c.name for c in idle.checks]
    assert assess("x", []).healthy  # nothing checked, nothing failed
