"""ServedStack: what a user's browser talks to — a served Prefect (UI, API, services), an MLflow server,
a process worker, and a deployed workspace — each on a free loopback port, each stopped afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from hybridtrain.drill.loopback import free_port
from hybridtrain.drill.processes import stop_with_children

START_TIMEOUT_S = 180.0
CHROMIUM = "/usr/bin/chromium"
#: Flags for Debian's Chromium in a container: no sandbox (root), nothing that phones home.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INSTALL_HINT = ("Chromium is missing at /usr/bin/chromium: run `scripts/setup-system.sh` (the project's system set-up, "
                "which runs `apt-get install -y chromium`), or `apt-get install -y chromium` yourself")


def get_json(url: str, body: dict | None = None, timeout: float = 10.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log when it exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@dataclass
class ServedStack:
    """Servers and a worker for one workspace; ``env`` is what a user's shell would export."""

    base: Path
    workspace: Path
    prefect_port: int = field(default_factory=free_port)
    mlflow_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}"

    @property
    def api(self) -> str:
        return f"{self.ui}/api"

    @property
    def mlflow(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PREFECT_HOME": str(self.base / "prefect-home"), "PREFECT_API_URL": self.api,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HYBRIDTRAIN_HOME": str(self.workspace),
                "HYBRIDTRAIN_MLFLOW_TRACKING_URI": self.mlflow, "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain",
                "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
                "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}

    def _start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.base / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, cwd=self.workspace, env=env or self.env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def start_servers(self) -> None:
        """Prefect (services on: scheduler, late runs, ...) and MLflow, started side by side."""
        bindir = Path(sys.executable).parent
        env = {**self.env, "PREFECT_API_DATABASE_CONNECTION_URL":
               f"sqlite+aiosqlite:///{self.base / 'prefect.db'}"}
        env.pop("PREFECT_API_URL")  # the server itself serves it
        env["PREFECT_UI_API_URL"] = self.api  # what the UI in the browser calls (default: port 4200)
        # SQLite under a loaded machine: wait for the write lock rather than answer 503 after 10 s.
        env["PREFECT_SERVER_DATABASE_TIMEOUT"] = "60"
        env["PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT"] = "30"
        env["PREFECT_API_LOG_RETRYABLE_ERRORS"] = "true"  # a 503's cause goes to the server log
        prefect, prefect_log = self._start("prefect-server", [
            str(bindir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.prefect_port)], env)
        mlflow, mlflow_log = self._start("mlflow-server", [
            str(bindir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.mlflow_port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.base / 'mlflow.db'}",
            "--artifacts-destination", str(self.base / "mlflow-artifacts")])
        wait_ready(f"{self.api}/health", prefect, prefect_log)
        wait_ready(f"{self.mlflow}/health", mlflow, mlflow_log)

    def deploy(self) -> str:
        """``hybridtrain deploy`` as a user runs it: pools, blocks, every deployment of prefect.yaml."""
        proc = subprocess.run([str(Path(sys.executable).parent / "hybridtrain"), "deploy", "--home",
                               str(self.workspace)], cwd=self.workspace, env=self.env, capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"hybridtrain deploy failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        return proc.stdout

    def start_worker(self, pool: str) -> None:
        proc, log = self._start(f"worker-{pool}", [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            workers = get_json(f"{self.api}/work_pools/{pool}/workers/filter", {})
            if any(w.get("status") == "ONLINE" for w in workers):
                return
            time.sleep(0.5)
        raise RuntimeError(f"worker of pool {pool} did not come online:\n{log.read_text()[-3000:]}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.base.glob("*.log")))

    def stop(self) -> None:
        stop_with_children(*self.procs)
        for proc in self.procs:  # each was started in its own session: end what its children left behind
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, None when they can."""
    if not Path(CHROMIUM).is_file() and not shutil.which("chromium"):
        return INSTALL_HINT
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: `make venv` installs the pinned set (requirements/lock.txt)"
    return None
