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
   leaves no server behind. (Prefect stops its server only at a normal exit.) Its app is Prefect's
   with the garbage collector off the event loop (``orchestration.embedded_server``).
3. **Workspace.** ``.hybridtrain/``, the DVC repo and its remotes from the sites catalog.
4. **Blocks.** Site blocks, the release signing key and the pseudonym key on that server (keys
   are created once, never overwritten).
5. **Stale runs.** Runs a killed session left RUNNING are marked CRASHED, their MLflow runs KILLED
   (``orchestration.stale_runs``). Runs started in this session carry its owner tag
   (``owned_runs()``) and send a flow-run heartbeat every 30 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import prefect.context
import prefect.server.api.server as prefect_server
from prefect import tags
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from hybridtrain.cli.federated import OptionError, checked_workspace
from hybridtrain.cli.main import init_workspace
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
    """A ``preexec_fn``: the child gets SIGTERM when ``parent``'s starting thread ends (async-signal-safe calls only)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child

    def preexec() -> None:  # runs in the child between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


#: The app factory Prefect's temporary server runs, and ours in its place (``orchestration.embedded_server``).
PREFECT_APP = "prefect.server.api.server:create_app"
EMBEDDED_APP = "orchestration.embedded_server:create_app"


class TetheredServer(SubprocessASGIServer):
    """Prefect's temporary server, started so that it gets SIGTERM when the thread that started it ends.

    Prefect builds the server's command and environment itself; its ``subprocess.Popen`` gets a
    ``preexec_fn`` here, and the command runs ``orchestration.embedded_server``'s app (Prefect's, with
    the garbage collector off the event loop: see there). Start it from the main thread: Linux ties
    the signal to the starting thread.
    """

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
            return subprocess.Popen(command, *args, preexec_fn=_die_with(os.getpid()), **kwargs)  # noqa: PLW1509 (prctl only)

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
