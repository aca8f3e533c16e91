"""Warm spare: a pre-imported Python process that runs exactly one flow run as ``python -m prefect.engine`` would.

Started by the warm-pool daemon (``python -m workers.warm_spare --ctl-fd N ...``, never by hand).
Life of a spare:

1. import ``prefect``, ``prefect.engine``, ``prefect.flow_engine`` and the modules a run imports
   anyway (``ENGINE_MODULES``), then the ``--preload`` modules (e.g. ``flows.training``); a
   preload that fails is reported and skipped (the run imports it itself and fails there, with
   its traceback in the flow run's logs, exactly as a cold engine would);
2. tell the daemon ``ready`` and block until one request arrives on the control socket;
3. become the process the worker would have started: take the client's stdin/stdout/stderr
   (``dup2``), ``chdir`` to the worker's working directory, replace ``os.environ`` with the run's
   environment, put that cwd and ``PYTHONPATH`` on ``sys.path`` as a fresh ``python -m`` would,
   rebuild Prefect's settings from the new environment and, when its inputs changed, Prefect's
   logging configuration; set ``HYBRIDTRAIN_WARM_SPARE`` (daemon pid, spare pid, when it became
   ready) so a flow can tell it started warm;
4. run ``prefect/engine.py``'s ``__main__`` block itself — ``runpy.run_module("prefect.engine",
   run_name="__main__")`` executes Prefect's own code (``configure_from_env()``,
   ``handle_engine_signals``, ``load_flow_run``, ``flow_run_logger``, ``load_flow``, ``RunMetrics``,
   ``run_flow``, ``_drive_run_flow_result``), nothing is re-implemented;
5. exit with the engine's exit status; the daemon reports it to the client and starts a new spare.

Spares are fresh interpreters the daemon starts (spawned, not forked from a template), so no
thread, lock, random-generator or library state is shared between spares or carried between runs.

What is taken from the daemon's environment (read when Prefect is imported) and what from the run's:

* per run (from the request): every Prefect setting (``refresh_global_settings_context()``
  rebuilds ``Settings`` from the run's environment and profile), logging configuration
  (``setup_logging()`` runs again when the logging settings, ``PREFECT_LOGGING_*`` variables or a
  custom logging file's inputs differ from the daemon's — e.g. ``PREFECT_LOGGING_EXTRA_LOGGERS``
  from job variables), ``os.environ`` for user code, cwd, ``sys.path[0]``, ``PYTHONPATH``,
  ``PYTHONUNBUFFERED``/``PYTHONIOENCODING`` for the std streams, argv;
* at spare start (from the daemon's environment): the interpreter (``sys.executable``) and its
  flags (``sys.flags``, ``-X`` options), ``PYTHONHASHSEED`` and other interpreter-start variables, Prefect plugins
  (``PREFECT_PLUGINS_ENABLED``, run on ``import prefect``), anything a preloaded module computes at
  import time — including ``@task``/``@flow`` options such as retries read from settings when the
  decorator runs — and variables native libraries read when loaded (``OMP_NUM_THREADS``, MKL) if a
  preload imports them. So start the daemon with the worker's Prefect settings and keep per-run
  variation in job-variable ``env``; code edits are caught (see below), package upgrades are not:
  restart the daemon after ``pip install``.

Stale or foreign code: the spare records the modification times of the project modules it imported
(files outside the interpreter's prefixes). If one changed before the request arrived — or the run's
``sys.path`` would import one of those packages from another directory (a different checkout) —
the spare ``exec``s a fresh ``python -m prefect.engine`` in its place (same pid, environment and
pipes; cold, but never old or foreign code), and for changed files tells the daemon, which replaces
its idle spares.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from workers.warm_protocol import SPARE_MARKER_ENV, ChannelClosed, WarmLaunchError, recv_request, send_event

# Modules every flow run imports on its way to the first line of the flow (measured: the modules a
# probe run still imported after these were preloaded were only the flow file itself): importing
# them here takes them off the critical path.
ENGINE_MODULES = (
    "prefect",
    "prefect.engine",
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect._internal.metrics",
    "prefect.client.orchestration",
    "prefect.deployments.steps",
    "prefect.deployments.steps.core",
    "prefect.deployments.steps.pull",
    "prefect.logging.handlers",
    "prefect.results",
    "prefect.runner.storage",
    "prefect.events.clients",
    "prefect.events.worker",
    "prefect.utilities.importtools",
    "anyio._backends._asyncio",
    "anyio.streams.memory",
    "anyio.streams.tls",
    "encodings.idna",
    "rich._emoji_codes",
)
PR_SET_PDEATHSIG = 1


def _die_with_daemon(daemon_pid: int) -> None:
    """SIGTERM this process when the daemon dies: a run nobody reports on must not go on unseen."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != daemon_pid:  # the daemon died before prctl took effect
        sys.exit(0)


def warm(preload: list[str]) -> list[str]:
    """Import the engine and ``preload``; returns one line per preload that failed."""
    for name in ENGINE_MODULES:
        importlib.import_module(name)
    failed = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported to the daemon's log; the run imports it again and fails visibly
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def _prefixes() -> tuple[str, ...]:
    return tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                         sys.base_exec_prefix)})


def project_sources() -> dict[str, int]:
    """Source files of imported modules outside the interpreter's prefixes, with their mtimes."""
    prefixes = _prefixes()
    out: dict[str, int] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        real = os.path.realpath(path)
        if real.startswith(prefixes):
            continue
        try:
            out[real] = os.stat(real).st_mtime_ns
        except OSError:
            continue
    return out


def changed_source(snapshot: dict[str, int]) -> str | None:
    for path, mtime in snapshot.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None


def shadowed_package(snapshot: dict[str, int]) -> str | None:
    """A preloaded project package that this run's ``sys.path`` would import from elsewhere (another
    checkout on ``PYTHONPATH`` or in the working directory), or None."""
    from importlib.machinery import PathFinder

    files = set(snapshot)
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or not path or os.path.realpath(path) not in files:
            continue
        spec = PathFinder.find_spec(name, sys.path)
        if spec is not None and spec.origin and os.path.realpath(spec.origin) != os.path.realpath(path):
            return f"{name} ({os.path.realpath(path)} preloaded, {spec.origin} on this run's path)"
    return None


def _adapt_stdio(env: dict[str, str]) -> None:
    """Give ``sys.stdout``/``sys.stderr`` (now on the worker's pipes) the buffering and encoding a fresh
    interpreter would choose for them, in place, so handlers holding these objects keep working."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding, _, errors = (env.get("PYTHONIOENCODING") or "").partition(":")
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        if not isinstance(stream, io.TextIOWrapper):
            continue
        changes: dict[str, object] = {"line_buffering": unbuffered or fd == 2 or os.isatty(fd),
                                      "write_through": unbuffered}
        if encoding and encoding != stream.encoding:
            changes["encoding"] = encoding
        if errors:
            changes["errors"] = errors
        stream.reconfigure(**changes)


def _pythonpath(env: dict[str, str]) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def become(request: dict, fds: list[int]) -> None:
    """Turn this process into the one the worker would have started for ``request``."""
    env: dict[str, str] = {str(k): str(v) for k, v in request["env"].items()}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _adapt_stdio(env)
    old_pythonpath = _pythonpath(dict(os.environ))
    cwd = request.get("cwd") or os.getcwd()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # sys.path as `python -m prefect.engine` started in `cwd` would have it: cwd, PYTHONPATH, the rest.
    rest = sys.path[1:]
    for entry in old_pythonpath:
        if entry in rest:
            rest.remove(entry)
    sys.path[:] = [os.getcwd(), *_pythonpath(env), *rest]
    sys.argv = [sys.argv[0], *[str(a) for a in request.get("argv", [])]]


def logging_inputs() -> tuple[object, ...]:
    """What Prefect builds its logging configuration from: the logging settings, the levels the
    default ``prefect/logging/logging.yml`` template reads, ``PREFECT_LOGGING_*`` overrides and,
    when a custom logging file exists, every setting (such a file may reference any of them)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    custom = settings.logging.config_path is not None and Path(settings.logging.config_path).exists()
    return (settings.logging, settings.server.logging_level, settings.internal.logging_level,
            sorted((k, v) for k, v in os.environ.items() if k.startswith("PREFECT_LOGGING_")),
            settings if custom else None)


def configure_prefect(logging_before: tuple[object, ...], previous_extra: list[str]) -> None:
    """Prefect settings and logging from the run's environment (they were read from the daemon's at import)."""
    import logging

    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import setup_logging

    refresh_global_settings_context()
    if logging_inputs() == logging_before:
        return  # setup_logging would rebuild the very same configuration (~0.15 s saved)
    # setup_logging copies the `prefect.extra` handlers onto each extra logger; drop the copies made
    # at import so a logger listed in both environments does not ship every record twice.
    extra_handlers = list(logging.getLogger("prefect.extra").handlers)
    for name in previous_extra:
        for handler in extra_handlers:
            logging.getLogger(name).removeHandler(handler)
    setup_logging(incremental=False)


def run_engine() -> None:
    """``python -m prefect.engine``: execute Prefect's own ``__main__`` block in this process."""
    # A fresh `python -m prefect.engine` has no `prefect.engine` module besides `__main__`; drop the
    # warm-up import so runpy neither warns nor leaves two engine modules that differ from that.
    sys.modules.pop("prefect.engine", None)
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m workers.warm_spare")
    ap.add_argument("--ctl-fd", type=int, required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--preload", default="")
    ap.add_argument("--slot", type=int, default=0)
    args = ap.parse_args()
    _die_with_daemon(args.daemon_pid)
    ctl = socket.socket(fileno=args.ctl_fd)
    ctl.set_inheritable(False)  # flow code's subprocesses must not hold the daemon's channel

    started = time.time()
    failed = warm([m for m in args.preload.split(",") if m])
    snapshot = project_sources()
    ready_at = time.time()
    send_event(ctl, {"event": "ready", "pid": os.getpid(), "import_s": round(ready_at - started, 3),
                     "preload_failed": failed})
    try:
        request, fds = recv_request(ctl)
    except (ChannelClosed, ConnectionError):  # the daemon retired this spare or shut down
        sys.exit(0)
    except (OSError, ValueError, WarmLaunchError):
        traceback.print_exc()
        sys.exit(1)
    stale = changed_source(snapshot)
    if stale:
        try:
            send_event(ctl, {"event": "stale", "path": stale})
        except OSError:
            pass
    ctl.close()
    from prefect.settings import PREFECT_LOGGING_EXTRA_LOGGERS

    logging_before, previous_extra = logging_inputs(), list(PREFECT_LOGGING_EXTRA_LOGGERS.value())
    become(request, fds)
    shadowed = None if stale else shadowed_package(snapshot)
    if stale or shadowed:
        why = (f"{stale} changed after this spare imported it (the daemon is replacing its spares)" if stale
               else f"this run imports {shadowed}")
        print(f"warm launcher: {why}; running a fresh `python -m prefect.engine` instead", file=sys.stderr,
              flush=True)
        os.execv(sys.executable, [sys.executable, "-m", "prefect.engine", *sys.argv[1:]])
    os.environ[SPARE_MARKER_ENV] = json.dumps({"daemon_pid": args.daemon_pid, "spare_pid": os.getpid(),
                                               "slot": args.slot, "ready_at": ready_at,
                                               "request_at": time.time()})
    configure_prefect(logging_before, previous_extra)
    run_engine()


if __name__ == "__main__":
    main()
