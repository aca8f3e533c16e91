"""Flows the warm-launcher tests deploy: each reports how and where it was started."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger

PRELOADED = "flows.training"  # the tests start the daemon with --preload flows.training; these flows never import it


def process_started_at() -> float:
    """When this process started (epoch seconds, ~10 ms precision), from /proc: a spare started
    before its flow run existed; a process the worker started for the run, after."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


@flow(name="warm-probe", log_prints=True)
def warm_probe(out: str, token: str) -> str:
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process_started_at": process_started_at(),
        "flow_started_at": time.time(),
        "preloaded_module_present": PRELOADED in sys.modules,
        "spare_marker": os.environ.get("HYBRIDTRAIN_WARM_SPARE"),
        "cwd": os.getcwd(),
        "job_env": os.environ.get("WARM_TEST_JOB_ENV"),
        "extra_loggers": os.environ.get("PREFECT_LOGGING_EXTRA_LOGGERS"),
    }
    Path(out).write_text(json.dumps(report))
    print(f"print-{token}")  # log_prints: becomes a flow-run log record
    get_run_logger().info("logger-%s", token)
    # Extra loggers: one only the run's environment lists, one both the daemon's and the run's list.
    logging.getLogger("warm_probe_extra").warning("extra-%s", token)
    logging.getLogger("hybridtrain.warm_test").warning("both-%s", token)
    os.write(1, f"stdout-{token}\n".encode())  # straight to fd 1: reaches the worker only via stream_output
    os.write(2, f"stderr-{token}\n".encode())
    return token


@flow(name="warm-fail")
def warm_fail() -> None:
    raise ValueError("deliberate failure in a warm spare")


@flow(name="warm-exit")
def warm_exit(code: int) -> None:
    sys.stdout.flush()
    if code < 0:
        os.kill(os.getpid(), -code)
        time.sleep(30)
    os._exit(code)


@flow(name="warm-sleep")
def warm_sleep(pid_file: str, seconds: float = 120.0) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
