"""The stack's layout as plain values, and `hybridtrain doctor` against parts that are not there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hybridtrain.drill.loopback import free_port
from hybridtrain.errors import SpecError
from hybridtrain.service.stack import Stack, logging_config, split_limit

PORTS = {"prefect": 14200, "mlflow": 15000, "postgres": 15432, "s3": 19000, "redis": 16379}


def test_a_stack_is_kept_with_its_ports_and_password_for_the_next_up(tmp_path):
    stack = Stack.create(tmp_path, PORTS, is_root=True, pg_bin="/usr/lib/postgresql/15/bin")
    path = stack.save()
    assert path == tmp_path.resolve() / ".hybridtrain" / "stack" / "stack.json" and path.stat().st_mode & 0o777 == 0o600
    again = Stack.load(tmp_path)
    assert again == stack and again.pg_os_user == "postgres" and len(again.db_password) >= 20
    assert len(again.redis_password) >= 20 and again.redis_password != again.db_password
    assert Stack.create(tmp_path, PORTS, is_root=False, pg_bin="/x").pg_os_user is None
    assert again.prefect_server_env()["PREFECT_API_DATABASE_CONNECTION_URL"] == (
        f"postgresql+asyncpg://hybridtrain:{again.db_password}@127.0.0.1:15432/prefect")
    assert again.db_url("mlflow") in again.mlflow_cmd() and "s3://hybridtrain-mlflow/mlflow" in again.mlflow_cmd()
    # The API and the services are separate processes that talk through Redis (password-protected, loopback).
    server = again.prefect_server_env()
    assert server["PREFECT_SERVER_EVENTS_MESSAGING_BROKER"] == "prefect_redis.messaging"
    assert server["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"] == "prefect_redis.lease_storage"
    assert server["PREFECT_REDIS_MESSAGING_URL"] == server["PREFECT_SERVER_DOCKET_URL"] == (
        f"redis://default:{again.redis_password}@127.0.0.1:16379/0")
    assert again.prefect_server_cmd()[-3:] == ["--no-services", "--workers", "2"]
    assert again.prefect_services_cmd()[-3:] == ["server", "services", "start"]
    conf = again.redis_conf().splitlines()
    assert "bind 127.0.0.1" in conf and f"requirepass {again.redis_password}" in conf and "appendonly yes" in conf
    env = again.worker_env("onprem")
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:14200/api" and env["PREFECT_WORKER_QUERY_SECONDS"] == "1"
    slower = again.model_copy(update={"site_query_seconds": 3.0})  # the site pools poll apart from control
    assert slower.worker_env("cloud")["PREFECT_WORKER_QUERY_SECONDS"] == "3"
    assert slower.worker_env("control")["PREFECT_WORKER_QUERY_SECONDS"] == "1"  # the control runs' schedule lag
    assert env["HYBRIDTRAIN_MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15000"
    assert env["HYBRIDTRAIN_TRAIN_LEASE_S"] == "300"  # a starved host still renews the training lease in time
    warm = again.warm_cmds()  # site pools' spares import the lifecycle ahead, the control pool's its own flows
    assert warm["warm-onprem"][-2:] == ["--preload", "flows.lifecycle,flows.training,flows.data"]
    assert warm["warm-control"][-2:] == ["--preload", "flows.burst,flows.recovery"]
    assert sorted(again.worker_cmds()) == ["worker-cloud-1", "worker-cloud-2", "worker-control-1", "worker-onprem-1",
                                          "worker-onprem-2"]  # the control flows' pool has its own worker


@pytest.mark.parametrize("limit,workers", [(8, 2), (9, 2), (7, 3), (1, 2), (2, 2), (3, 5)])
def test_a_pools_run_limit_is_split_over_its_workers_without_exceeding_it(limit, workers):
    shares = split_limit(limit, workers)
    assert sum(shares) == limit and all(s >= 1 for s in shares) and max(shares) - min(shares) <= 1
    assert len(shares) == min(limit, workers)  # fewer slots than workers: one worker per slot
    assert split_limit(None, workers) == [None] * workers  # no limit (the control pool): no share


def test_each_worker_of_a_limited_pool_gets_its_share_as_limit(tmp_path):
    stack = Stack.create(tmp_path, PORTS, is_root=False, pg_bin="/x")
    cmds = stack.worker_cmds({"onprem": 9, "cloud": 1, "control": None})

    def limit(name):
        cmd = cmds[name]
        return int(cmd[cmd.index("--limit") + 1]) if "--limit" in cmd else None

    assert sorted(cmds) == ["worker-cloud-1", "worker-control-1", "worker-onprem-1", "worker-onprem-2"]
    assert [limit("worker-onprem-1"), limit("worker-onprem-2"), limit("worker-cloud-1")] == [5, 4, 1]
    assert limit("worker-control-1") is None


def test_site_pools_start_at_a_lower_cpu_priority_than_the_control_pool(tmp_path):
    stack = Stack.create(tmp_path, PORTS, is_root=False, pg_bin="/x")
    assert [stack.nice_of(p) for p in stack.worker_pools] == [10] * len(stack.pools) + [0]
    equal = Stack.create(tmp_path, PORTS, is_root=False, pg_bin="/x", site_nice=0)
    assert {equal.nice_of(p) for p in equal.worker_pools} == {0}


def test_a_broken_stack_file_is_one_line_naming_it(tmp_path):
    Stack.file(tmp_path).parent.mkdir(parents=True)
    Stack.file(tmp_path).write_text('{"root": "/x", "bogus": 1}')
    with pytest.raises(SpecError) as caught:
        Stack.load(tmp_path)
    assert str(Stack.file(tmp_path)) in str(caught.value) and "delete the file" in str(caught.value)


def test_warm_sockets_move_to_tmp_when_the_path_is_too_long_for_a_socket(tmp_path):
    deep = tmp_path / ("d" * 80)
    stack = Stack.create(deep, PORTS, is_root=False, pg_bin="/x")
    sock = stack.warm_socket("onprem")
    assert len(str(sock)) <= 100 and sock.name == "onprem.sock" and sock.parent != stack.warm_socket("cloud").parent.parent
    short = Stack.create(Path("/srv/ws"), PORTS, is_root=False, pg_bin="/x").warm_socket("cloud")
    assert short == Path("/srv/ws/.hybridtrain/stack/warm/cloud.sock")


def test_the_server_logging_config_keeps_every_service_run_in_its_own_file(tmp_path):
    config = yaml.safe_load(logging_config(tmp_path / "services.log"))
    assert config["handlers"]["services_file"]["filename"] == str(tmp_path / "services.log")
    assert config["loggers"]["docket"]["level"] == "INFO"
    assert config["handlers"]["console_warnings"]["level"] == "WARNING"
    assert "console" in config["handlers"] and "prefect.server" in config["loggers"]  # Prefect's own config kept


def doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([sys.executable, "-m", "orchestration.cli", "doctor", "--home", str(tmp_path), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_doctor_names_a_prefect_server_that_is_not_there(tmp_path):
    port = free_port()
    proc = doctor(tmp_path, "--api", f"http://127.0.0.1:{port}/api")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0].startswith(f"PROBLEM prefect api: not reachable at http://127.0.0.1:{port}/api")
    assert "Traceback" not in proc.stderr


def test_doctor_without_a_stack_or_an_api_says_what_to_start(tmp_path):
    proc = doctor(tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "make up" in proc.stderr and "--api" in proc.stderr


def test_a_stack_saved_before_redis_loads_and_the_doctor_asks_for_an_up(tmp_path):
    import json

    from hybridtrain.service.doctor import check_redis

    stack = Stack.create(tmp_path, {k: v for k, v in PORTS.items() if k != "redis"}, is_root=False, pg_bin="/x")
    data = json.loads(stack.model_dump_json())
    for key in ("redis_port", "redis_password", "api_workers"):
        data.pop(key)
    Stack.file(tmp_path).parent.mkdir(parents=True)
    Stack.file(tmp_path).write_text(json.dumps(data))
    old = Stack.load(tmp_path)
    assert old.redis_port is None and old.prefect_port == PORTS["prefect"]
    finding = check_redis(old)
    assert not finding.ok and "run `make up`" in finding.detail


@pytest.fixture(scope="module")
def stack_script():
    import importlib.util

    from tests.fixtures.workspaces import ROOT

    spec = importlib.util.spec_from_file_location("stack_script_layout", ROOT / "scripts" / "stack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_site_pools_run_on_the_site_cpus_and_what_they_start_inherits_them(tmp_path, stack_script):
    usable = sorted(os.sched_getaffinity(0))
    assert len(usable) >= 2, "the test pins to a CPU subset"
    stack = Stack.create(tmp_path, PORTS, is_root=False, pg_bin="/x", site_cpus=usable[-1:])
    assert [stack.cpus_of(p) for p in stack.worker_pools] == [usable[-1:]] * len(stack.pools) + [None]
    # A worker stand-in that starts a run stand-in, which reports where it may run.
    child = "import os; print(sorted(os.sched_getaffinity(0)))"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    pool = stack.pools[0]
    proc = stack_script.spawn(stack, "probe", [sys.executable, "-c", parent], {}, stack.nice_of(pool),
                              stack.cpus_of(pool))
    assert proc.wait(timeout=60) == 0
    assert (stack.logs / "probe.log").read_text().strip() == str(usable[-1:])
    unpinned = stack_script.spawn(stack, "probe-control", [sys.executable, "-c", child], {}, 0,
                                  stack.cpus_of(stack.control_pool))
    assert unpinned.wait(timeout=60) == 0
    assert (stack.logs / "probe-control.log").read_text().strip() == str(usable)


def test_a_site_cpu_list_is_checked_against_the_host(stack_script):
    import argparse

    usable = sorted(os.sched_getaffinity(0))
    shown = ",".join(map(str, usable))
    assert stack_script.cpu_list(str(usable[-1])) == [usable[-1]]
    assert stack_script.cpu_list("all") == []
    for text, says in [("x", "is not a CPU list"), (str(max(usable) + 1), f"does not have: pick from {shown}"),
                       (f"{usable[0]}-{usable[-1]}", "leaves the control plane none of its own"), ("1-", "not a CPU list")]:
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            stack_script.cpu_list(text)


def test_up_with_cpus_the_host_lacks_is_one_line_before_anything_starts(tmp_path):
    from tests.fixtures.workspaces import ROOT

    bad = str(max(os.sched_getaffinity(0)) + 1)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "stack.py"), "up", "--site-cpus", bad, "--home",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--site-cpus" in errors[0] and "does not have" in errors[0], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / ".hybridtrain").exists()
