"""Site health against real servers: an sshd and a moto S3 endpoint stopped and started again."""

from __future__ import annotations

import pytest

from hybridtrain.remote.site_health import check_site, probe_ssh, probe_store
from hybridtrain.specs.sites import LocalStore, S3Store, Site
from tests.fixtures.processes import start_sshd, stop_sshd

TIMEOUT_S = 2.0


def site(name: str, store, hosts=()) -> Site:
    return Site(name=name, kind="onprem", region="eu", jurisdiction="EU", price_per_gpu_hour=1.0, work_pool="onprem",
                store=store, hosts=tuple(hosts))


def test_sshd_stopped_makes_the_site_unhealthy_and_back_again_healthy(tmp_path):
    proc, server = start_sshd(tmp_path / "sshd")
    s = site("onprem-x", LocalStore(path=str(tmp_path / "store")), hosts=(server.host,))
    try:
        up = check_site(s, tmp_path, private_key=server.private_key, known_hosts=server.known_hosts,
                        workers_online=1, timeout_s=TIMEOUT_S)
        assert up.healthy and [c.ok for c in up.checks] == [True, True, True]
        assert up.checks[0].detail == "logged in and ran `true`"

        stop_sshd(proc)
        down = check_site(s, tmp_path, private_key=server.private_key, known_hosts=server.known_hosts,
                          workers_online=1, timeout_s=TIMEOUT_S)
        assert not down.healthy and [c.ok for c in down.checks] == [False, True, True]
        ssh = down.checks[0]
        assert ssh.name == f"ssh {server.host.username}@[127.0.0.1]:{server.host.port}"
        assert "SiteUnavailable" in ssh.detail and "cannot connect" in ssh.detail and ssh.seconds < TIMEOUT_S * 2
        assert down.reason.startswith(ssh.name + ": ")

        proc, again = start_sshd(tmp_path / "sshd", port=server.host.port)  # the same host, back
        back = check_site(s, tmp_path, private_key=again.private_key, known_hosts=again.known_hosts,
                          workers_online=1, timeout_s=TIMEOUT_S)
        assert back.healthy
    finally:
        if proc.poll() is None:
            stop_sshd(proc)


def test_a_host_key_or_user_key_problem_is_unhealthy_with_that_reason(sshd):
    changed = probe_ssh(sshd.host, sshd.private_key, sshd.other_host_key_line, timeout_s=TIMEOUT_S)
    assert not changed.ok and "HostKeyRejected" in changed.detail and "does not match" in changed.detail
    unpinned = probe_ssh(sshd.host, sshd.private_key, "", timeout_s=TIMEOUT_S)
    assert not unpinned.ok and "not in known_hosts" in unpinned.detail
    refused = probe_ssh(sshd.host, sshd.other_private_key, sshd.known_hosts, timeout_s=TIMEOUT_S)
    assert not refused.ok and "AuthRefused" in refused.detail and "refused key authentication" in refused.detail
    garbled = probe_ssh(sshd.host, "not a key", sshd.known_hosts, timeout_s=TIMEOUT_S)
    assert not garbled.ok and "SpecError" in garbled.detail
    assert probe_ssh(sshd.host, sshd.private_key, sshd.known_hosts, timeout_s=TIMEOUT_S).ok


@pytest.fixture
def flaky_s3(s3):
    from tests.fixtures.s3_server import MotoS3Server

    server = MotoS3Server()
    server.start()
    yield server
    server.close()


def test_s3_stopped_makes_the_store_unhealthy_and_back_again_healthy(s3, flaky_s3, tmp_path):
    store = S3Store(bucket=s3.bucket, prefix="site", endpoint_url=flaky_s3.url, access_key_id="testing",
                    secret_access_key="testing")
    s = site("cloud-x", store)
    up = check_site(s, tmp_path, timeout_s=TIMEOUT_S)
    assert up.healthy and up.checks[0].name == f"store s3://{s3.bucket}/site"
    assert up.checks[0].detail == "bucket answered"

    flaky_s3.stop()
    down = check_site(s, tmp_path, timeout_s=TIMEOUT_S)
    check = down.checks[0]
    assert not down.healthy and "SiteUnavailable" in check.detail and flaky_s3.url in check.detail
    assert check.seconds < TIMEOUT_S * 2

    flaky_s3.start()
    assert check_site(s, tmp_path, timeout_s=TIMEOUT_S).healthy


def test_a_missing_bucket_is_unhealthy_and_says_which(s3, tmp_path):
    from hybridtrain.remote.site_health import site_store

    gone = site("cloud-x", s3.store(bucket="no-such-bucket-here"))
    check = probe_store(site_store(gone, tmp_path, timeout_s=TIMEOUT_S), timeout_s=TIMEOUT_S)
    assert not check.ok and "no-such-bucket-here" in check.detail and "does not exist" in check.detail
