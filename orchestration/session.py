"""Session: this process pointed at a workspace — its Prefect server, MLflow store and state — and the workspace made ready.

Every entry point that runs flows opens one first (``hybridtrain run``, ``init``, ``demo``,
``sweep``; from Python, ``open_session()`` before calling a flow), so a fresh clone needs no
separate ``hybridtrain init``. Opening is idempotent; each step does only what is missing:

0. **Check.** The workspace is a directory holding a valid sites catalog (``check_workspace``), before
   anything is created or started: a wrong home leaves no ``.hybridtrain/``, no database, no server.
1. **Environment.** When Prefect is not configured (no ``PREFECT_API_URL``, no ``PREFECT_HOME``),
   ``PREFECT_HOME`` is the workspace's ``.hybridtrain/prefect`` (created first), so ``make ui``
   shows the runs. Prefect reads its settings once, when it is imported; they are read again here,
   so the order of imports does not matter.
2. **Embedded server.** With no API URL, Prefect starts a temporary server in a subprocess. The
   session starts it itself, tied to this process: the server gets SIGTERM when the process that
   started it dies — by SIGKILL too (Linux ``PR_SET_PDEATHSIG``), so a killed ``hybridtrain run``
   leaves no server behind. It runs in a process group of its own, so a terminal's Ctrl-C (SIGINT
   to the whole foreground group) reaches only this process, which reports the interrupted runs,
   gives back their leases, and stops the server on its way out (at any exit: normal, an error,
   Ctrl-C). Its output goes to ``server.log`` in ``PREFECT_HOME``; one that exits while starting
   fails the session at once, in one line naming that log. Its app is Prefect's with the garbage
   collector off the event loop (``orchestration.embedded_server``).
3. **Workspace.** ``.hybridtrain/``, the DVC repo and its remotes from the sites catalog.
4. **Blocks.** Site blocks, the release signing key and the pseudonym key on that server (keys
   are created once, never overwritten).
5. **Stale runs.** Runs a killed session left RUNNING are marked CRASHED, their MLflow runs KILLED
   (``orchestration.stale_runs``). Runs started in this session carry its owner tag
   (``owned_runs()``) and send a flow-run heartbeat every 30 s.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import prefect.context
import prefect.server.api.server as prefect_server
from prefect import tags
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, get_current_settings

from hybridtrain.cli.main import init_workspace
from hybridtrain.cli.options import OptionError, checked_workspace
from hybridtrain.errors import HybridtrainError
from hybridtrain.workspace import Workspace
from orchestration import stale_runs

PR_SET_PDEATHSIG = 1
#: Environment every session sets unless already set (telemetry off, hybridtrain's logs in Prefect's).
DEFAULTS = {
    "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain",
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(stale_runs.HEARTBEAT_S),
    "DVC_NO_ANALYTICS": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def check_workspace(home: Path | str | None) -> Workspace:
    """Step 0: the workspace at ``home`` is an existing directory with a sites catalog
    (``cli.federated.checked_workspace``), its state directories are not files and its catalog is valid;
    ``OptionError``/``SpecError`` naming the path and the fix otherwise. Creates nothing."""
    ws = checked_workspace(Path(home) if home is not None else None)
    for d in (ws.state_dir, ws.prefect_home):
        if d.exists() and not d.is_dir():
            raise OptionError(str(d), "is a file, where hybridtrain keeps the workspace's state in a directory; move "
                                      "the file away")
    ws.load_sites()
    return ws


def apply_environment(ws: Workspace) -> None:
    """Step 1: the workspace's Prefect settings (when Prefect is unconfigured) in the environment, read by Prefect."""
    env = ws.prefect_env()
    if env:
        Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    for k, v in {**env, **DEFAULTS}.items():
        os.environ.setdefault(k, v)
    prefect.context.refresh_global_settings_context()


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when ``parent``'s starting thread ends (async-signal-safe calls only).

    Leaving the parent's process group is ``Popen(process_group=0)``'s part, done before this runs:
    the tie to the parent is by its death, not by the signals its group gets."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child

    def preexec() -> None:  # runs in the child between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


#: The app factory Prefect's temporary server runs, and ours in its place (``orchestration.embedded_server``).
PREFECT_APP = "prefect.server.api.server:create_app"
EMBEDDED_APP = "orchestration.embedded_server:create_app"


class EmbeddedServerFailed(HybridtrainError):
    """The embedded Prefect server exited, or did not answer, while it started; its log says why."""


#: How many times a server whose port was taken while it started is started again on another port.
MAX_PORT_RETRIES = 5
#: The embedded server's output, in ``PREFECT_HOME`` (appended to: several sessions may share a workspace).
SERVER_LOG = "server.log"


def server_log() -> Path:
    return Path(get_current_settings().home) / SERVER_LOG


class TetheredServer(SubprocessASGIServer):
    """Prefect's temporary server, started so that it gets SIGTERM when the thread that started it ends.

    Prefect builds the server's command and environment itself; its ``subprocess.Popen`` gets, here,
    a process group of its own (a terminal's Ctrl-C is for this process, not its server), a
    ``preexec_fn`` tying it to this process, no terminal input, and ``SERVER_LOG`` for its output; the
    command runs ``orchestration.embedded_server``'s app (Prefect's, with the garbage collector off the
    event loop: see there). Start it from the main thread: Linux ties the signal to the starting thread.
    """

    def start(self, timeout: int | None = None) -> None:
        """Prefect's ``start()``, failing at once (``EmbeddedServerFailed``, one line) when the server exits
        while it starts, where Prefect would poll its health until the start timeout (180 s here) and then
        raise a ``RuntimeError``. An exit with uvicorn's status 3 while its port is taken (another process took it
        in between) starts it again on another port, as Prefect does for any 3, up to ``MAX_PORT_RETRIES`` times.
        The server is stopped at this process's exit (``atexit``), as Prefect's is, and at once when it fails."""
        if self.running:
            return
        if self.port is None:
            self.port = self.find_available_port()
        limit = timeout or PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        prefect_server.subprocess_server_logger.info(f"Starting temporary server on {self.address}")
        self.running = True
        try:
            self.server_process = self._run_uvicorn_command()
            atexit.register(self.stop)
            deadline = time.monotonic() + limit
            with httpx.Client() as client:
                restarts = 0
                while True:
                    code = self.server_process.poll()
                    # uvicorn's 3 is any failed start; only one whose port was taken in between is worth another port
                    if code == 3 and restarts < MAX_PORT_RETRIES and not self.is_port_available(self.port):
                        restarts += 1
                        self.port = self.find_available_port()
                        self.server_process = self._run_uvicorn_command()
                        continue
                    if code is not None:
                        raise EmbeddedServerFailed(f"the embedded Prefect server exited (code {code}) while starting; "
                                                   f"see {server_log()}")
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{self.api_url}/health").status_code == 200:
                            return
                    if time.monotonic() >= deadline:
                        raise EmbeddedServerFailed(f"the embedded Prefect server did not answer within {limit:.0f} s "
                                                   f"of its start; see {server_log()}")
                    time.sleep(0.1)
        except BaseException:
            self.stop()  # a server that is not answering, not left to this process's exit
            raise

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        real = prefect_server.subprocess
        calls: list[object] = []

        def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
            calls.append(args)
            command = list(kwargs.pop("args") if "args" in kwargs else args[0])
            args = args[1:] if args else ()
            if PREFECT_APP not in command:
                raise RuntimeError(f"Prefect no longer starts its temporary server with {PREFECT_APP}: "
                                   "orchestration/session.py needs another way to use orchestration.embedded_server")
            command = [EMBEDDED_APP if a == PREFECT_APP else a for a in command]
            log = server_log()
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                out.write(f"--- embedded Prefect server on {self.address}, started by pid {os.getpid()} at "
                          f"{datetime.now(UTC).isoformat(timespec='seconds')}\n".encode())
                out.flush()
                kwargs = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT, **kwargs}
                return subprocess.Popen(command, *args, process_group=0,
                                        preexec_fn=_die_with(os.getpid()), **kwargs)  # noqa: PLW1509 (prctl only)

        prefect_server.subprocess = SimpleNamespace(**{**vars(subprocess), "Popen": popen})  # type: ignore[assignment]
        try:
            proc = super()._run_uvicorn_command()
        finally:
            prefect_server.subprocess = real
        if not calls:
            raise RuntimeError("Prefect no longer starts its temporary server with subprocess.Popen: "
                               "orchestration/session.py needs another way to tie it to this process")
        return proc


def start_embedded_server() -> SubprocessASGIServer | None:
    """Step 2: with no ``PREFECT_API_URL``, start (or reuse) the temporary server tied to this process."""
    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    current = SubprocessASGIServer._instances.get(None)
    if current is not None and current.running:
        return current  # Prefect's own, started earlier in this process: keep it
    if threading.current_thread() is not threading.main_thread():
        return None  # the death signal would follow this thread; let Prefect start its own when needed
    SubprocessASGIServer._instances.pop(None, None)
    server = TetheredServer()  # registers itself as the instance Prefect's get_client() uses
    server.start()
    return server


def init_prefect(ws: Workspace) -> bool:
    """Step 4: site blocks, release key, pseudonym key; True when the pseudonym key was created now."""
    from blocks.register import ensure_pseudonym_key, ensure_release_key, register_sites

    register_sites(ws.load_sites())
    ensure_release_key(ws.release_key_block, ws.release_public_key)
    return ensure_pseudonym_key(ws.pseudonym_key_block)


@dataclass(frozen=True)
class Session:
    """What opening did: the workspace, whether the pseudonym key is new, and the stale runs it marked."""

    ws: Workspace
    key_created: bool
    crashed: list[dict[str, str]]


def open_session(home: Path | str | None = None, *, reap: bool = True) -> Session:
    """Point this process at the workspace ``home`` (default: ``HYBRIDTRAIN_HOME``, else the current directory)
    and make it ready: steps 0-5 above. Call it before the first flow; calling it again is cheap."""
    ws = check_workspace(home)
    apply_environment(ws)
    start_embedded_server()
    init_workspace(ws)
    created = init_prefect(ws)
    crashed = stale_runs.reap_stale_runs(ws) if reap else []
    return Session(ws, created, crashed)


@contextlib.contextmanager
def owned_runs() -> Iterator[None]:
    """Runs started inside carry this process's owner tag, so a later session can tell when it died."""
    with tags(stale_runs.owner_tag()):
        yield
