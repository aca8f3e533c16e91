"""Served-stack fixtures: a workspace as `make up` serves it, and the stack itself (PostgreSQL, S3, MLflow, Prefect, workers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fixtures.workspaces import ROOT

#: The served server's scheduler looks for due deployments every 2 s (default 60 s), so tests are short.
FAST_SCHEDULER = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
                  "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1"}
STACK_TIMEOUT_S = 900


def served_workspace(control_interval_s: int | None = None) -> Path:
    """A workspace with sample data and the project's flows, in a directory PostgreSQL's user may enter.

    ``control_interval_s`` shortens the burst controller's and the recovery's schedules (2 and 5 min
    in deployments/prefect.yaml) so that a test sees them fire.
    """
    from tests.fixtures.workspaces import build_workspace

    base = Path(tempfile.mkdtemp(prefix="hybridtrain-stack-"))
    base.chmod(0o755)  # pytest's tmp dirs are 0700: PostgreSQL's own user could not enter them
    root = build_workspace(base / "ws", rows=2000)
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    if control_interval_s:
        path = root / "deployments" / "prefect.yaml"
        text = path.read_text()
        data = yaml.safe_load(text)
        data["definitions"]["schedules"]["burst"]["interval"] = control_interval_s
        for dep in data["deployments"]:
            for sched in dep.get("schedules") or []:
                if sched.get("slug") == "recover-runs-every-5-min":
                    sched["interval"] = control_interval_s
        # Anchors are expanded by the load; the file stays valid for `prefect deploy` without them.
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def stack_cli(root: Path, *args: str, check: bool = True, timeout: float = STACK_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {**os.environ, **FAST_SCHEDULER, "HYBRIDTRAIN_HOME": str(root)}
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_HOME", None)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "stack.py"), *args, "--home", str(root)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        logs = root / ".hybridtrain" / "stack" / "logs"
        tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
        raise AssertionError(f"stack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}{tails}")
    return proc


def hybridtrain_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    from hybridtrain.service.stack import Stack

    env = {**os.environ, **Stack.load(root).client_env()}
    env.pop("PREFECT_HOME", None)
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args, "--home", str(root)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=root)


@pytest.fixture(scope="module")
def served(request) -> Iterator[Path]:
    """`make up` on a fresh workspace: the control flows every 10 s, runs started cold (killable by pid)."""
    root = served_workspace(control_interval_s=10)
    try:
        stack_cli(root, "up", "--warm-spares", "0", "--no-doctor")  # the first test runs the doctor itself
        yield root
    finally:
        stack_cli(root, "down", check=False)
        shutil.rmtree(root.parent, ignore_errors=True)
