"""Stale runs: when a RUNNING flow run outside a pool is judged dead (orchestration.stale_runs), without a server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from orchestration.stale_runs import Owner, owner_tag, stale_reason

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_owner_tag_names_this_process_and_it_is_alive():
    owner = Owner.of(["other", owner_tag()])
    assert owner is not None and owner.pid == os.getpid() and owner.host == socket.gethostname()
    assert owner.alive() is True
    assert Owner.of(["hybridtrain:owner:garbage"]) is None and Owner.of(None) is None


def test_a_dead_owner_is_stale_at_once_whatever_the_heartbeat():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = owner_tag(child.pid)
    child.wait()
    owner = Owner.of([tag])
    assert owner is not None and owner.alive() is False
    reason = stale_reason(owner, False, NOW, True, NOW, 90)
    assert reason is not None and f"pid {child.pid}" in reason


def test_a_reused_pid_is_not_the_owner():
    owner = Owner(socket.gethostname(), os.getpid(), 1)  # this pid, but a process started in 1970
    assert owner.alive() is False


def test_a_live_owner_is_never_stale_and_another_host_goes_by_heartbeat():
    here = Owner(socket.gethostname(), os.getpid(), 0)
    assert stale_reason(here, True, NOW - timedelta(hours=5), True, NOW, 90) is None
    there = Owner("elsewhere", 1, 0)
    assert stale_reason(there, None, NOW - timedelta(seconds=60), True, NOW, 90) is None
    late = stale_reason(there, None, NOW - timedelta(seconds=91), True, NOW, 90)
    assert late is not None and "no flow-run heartbeat for 91 s (heartbeat timeout 90 s)" in late
    # An owned run that never sent a heartbeat is judged from its start.
    assert "since it started" in stale_reason(there, None, NOW - timedelta(seconds=200), False, NOW, 90)


def test_a_run_with_no_owner_and_no_heartbeat_is_not_judged():
    assert stale_reason(None, None, NOW - timedelta(days=1), False, NOW, 90) is None
    assert stale_reason(None, None, NOW - timedelta(seconds=120), True, NOW, 90) is not None
