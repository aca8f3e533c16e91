"""Warm pool: a daemon beside a process worker that keeps N pre-imported spare processes to start flow runs in.

A process worker starts every flow run as ``python -m prefect.engine``: a new interpreter that
imports Prefect (~2 s), loads the flow and imports the project before the flow's first line —
about 4 s between Submitting and Running (Prefect issue #21944). With this daemon running and the
pool's ``command`` job variable set to ``python -m workers.warm_client``, the worker still starts,
supervises and cancels a child process as always, but that child hands the run to a spare that
has imported everything already (``workers.warm_spare``). Each spare serves exactly one run and
exits; the daemon starts its replacement at once, so no state passes from run to run.

Run it beside the worker, as the same user, with the same Prefect settings::

    export HYBRIDTRAIN_WARM_SOCKET=$HOME/.hybridtrain/run/onprem.sock
    python -m workers.warm_pool --spares 2 --preload flows.training,flows.data &
    prefect worker start --pool onprem            # the flow runs' clients inherit the socket path

``make worker`` does this for each pool. On an on-prem gateway, run both as services of the
worker's user with one shared environment file (``PREFECT_API_URL``, the other ``PREFECT_*``
settings, ``HYBRIDTRAIN_WARM_SOCKET=/run/hybridtrain-onprem/warm.sock``), e.g. with systemd::

    # hybridtrain-warm-onprem.service
    [Service]
    User=trainer
    EnvironmentFile=/etc/hybridtrain/onprem.env
    RuntimeDirectory=hybridtrain-onprem
    RuntimeDirectoryMode=0700
    WorkingDirectory=/srv/hybridtrain
    ExecStart=/srv/hybridtrain/.venv/bin/python -m workers.warm_pool --spares 4
    KillMode=mixed
    TimeoutStopSec=600

    # hybridtrain-worker-onprem.service
    [Unit]
    Wants=hybridtrain-warm-onprem.service
    After=hybridtrain-warm-onprem.service
    [Service]
    User=trainer
    EnvironmentFile=/etc/hybridtrain/onprem.env
    WorkingDirectory=/srv/hybridtrain
    ExecStart=/srv/hybridtrain/.venv/bin/prefect worker start --pool onprem

and set the pool's ``command`` to that interpreter (``/srv/hybridtrain/.venv/bin/python -m
workers.warm_client``; ``deployments/prefect.yaml`` writes the deploying machine's). ``--spares``:
the pool's concurrency limit. ``KillMode=mixed``: stopping the unit sends SIGTERM to the daemon
only, which lets running flow runs finish (up to ``TimeoutStopSec``) instead of every spare
getting SIGTERM at once. Restart the daemon (or send it SIGHUP) after upgrading packages; edited
project files are noticed by the spares themselves.

Rules the daemon relies on:

* **Settings.** Prefect reads ``PREFECT_*`` settings and configures logging when it is imported.
  Spares import it with the daemon's environment, then rebuild settings from each run's
  environment (``prefect.context.refresh_global_settings_context``) and re-run
  ``prefect.logging.configuration.setup_logging`` when the logging inputs differ
  (``workers.warm_spare``). Plugins, decorator options in preloaded modules and variables native
  libraries read when loaded still come from the daemon's environment: start it with the worker's
  environment and vary runs only through job-variable ``env``. Note that the process worker
  builds a run's environment as: its own environment, then the job variables' ``env``, then its
  explicitly set Prefect settings (``prefect.runner._starter_engine.EngineCommandStarter.start``)
  — a setting the worker has overrides the same variable in job ``env``, cold or warm.
* **Security.** The socket is created ``0600`` in a directory that must be ours and ``0700``
  (created so if missing); connections from another uid are refused (``SO_PEERCRED``), and so are
  runs whose client runs another Python environment than the daemon's.
* **Spares.** ``--spares`` should match the worker's concurrent runs (the pool's concurrency limit);
  a request finding no ready spare waits up to ``--wait-for-spare`` for one still importing, then
  is declined and the client starts a cold engine. A spare that cannot start (broken preload is
  *not* such a case: it is logged and skipped) backs off exponentially up to 30 s.
* **Signals.** From the client: SIGTERM/SIGINT/SIGHUP are passed to the spare. If the client
  disappears (the worker killed it with SIGKILL) the spare gets SIGKILL when it had already been
  sent SIGTERM, else SIGTERM and SIGKILL ``--kill-grace`` seconds later. Spares get SIGTERM when
  the daemon dies (``PR_SET_PDEATHSIG``); Prefect's engine then marks the run Crashed.
* **Shutdown.** SIGTERM/SIGINT: stop accepting, retire idle spares, let running flow runs finish;
  a second SIGTERM/SIGINT terminates them. SIGHUP: replace idle spares with fresh ones.

Linux only (``SO_PEERCRED``, ``SCM_RIGHTS``, ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.warm_protocol import (
    CLIENT_ACCEPT_TIMEOUT_S,
    SOCKET_ENV,
    ChannelClosed,
    EventReader,
    WarmLaunchError,
    check_socket_path,
    default_socket_path,
    ensure_private_dir,
    peer_uid,
    recv_request,
    send_event,
    send_request,
)

DEFAULT_PRELOAD = "flows.training,flows.data"
FORWARDABLE = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
REQUEST_READ_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 30.0
log = logging.getLogger("hybridtrain.warm_pool")


@dataclass
class Client:
    """One connected warm client: its run request until a spare takes it, then its control link."""

    conn: socket.socket
    reader: EventReader
    request: dict[str, Any]
    fds: list[int]
    deadline: float
    spare: Spare | None = None

    @property
    def flow_run_id(self) -> str:
        return str(self.request.get("flow_run_id"))

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def gone(self) -> bool:
        """True when the client closed its end (e.g. it gave up and fell back)."""
        try:
            return self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


@dataclass
class Spare:
    """One spare process and the daemon's end of its control channel."""

    slot: int
    proc: subprocess.Popen
    ctl: socket.socket
    reader: EventReader
    state: str = "starting"  # starting -> ready -> busy
    client: Client | None = None
    term_sent: bool = False
    kill_at: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _same_python(python: object) -> bool:
    """Same environment (prefix) and version as this daemon's; ``python`` and ``python3`` of one
    virtualenv are the same."""
    return (isinstance(python, dict) and python.get("prefix") == sys.prefix
            and python.get("version") == sys.version)


def _describe(python: object) -> str:
    if isinstance(python, dict):
        return f"runs {python.get('executable')} ({python.get('prefix')})"
    return "did not say which interpreter it runs (an older client?)"


class WarmPool:
    """The daemon: listens on a Unix socket and keeps ``spares`` ready spare processes."""

    def __init__(self, socket_path: Path, *, spares: int = 2, preload: list[str] | None = None,
                 wait_for_spare_s: float = 10.0, kill_grace_s: float = 10.0) -> None:
        if spares < 1:
            raise WarmLaunchError("--spares must be at least 1")
        if not 0 <= wait_for_spare_s <= CLIENT_ACCEPT_TIMEOUT_S / 2:
            raise WarmLaunchError(f"--wait-for-spare must be between 0 and {CLIENT_ACCEPT_TIMEOUT_S / 2:g} s: "
                                  f"clients start a cold engine after {CLIENT_ACCEPT_TIMEOUT_S:g} s without an answer")
        self.socket_path = socket_path
        self.target = spares
        self.preload = preload or []
        self.wait_for_spare_s = wait_for_spare_s
        self.kill_grace_s = kill_grace_s
        self.spares: list[Spare] = []
        self.pending: list[Client] = []
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.stopping = 0
        self.failures = 0
        self.next_spawn_at = 0.0
        self.next_slot = 0
        self.served = 0
        self._signals: list[int] = []

    # ------------------------------------------------------------------ set-up
    def bind(self) -> None:
        check_socket_path(self.socket_path)
        ensure_private_dir(self.socket_path.parent)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(self.socket_path))
            except OSError:
                self.socket_path.unlink()  # left behind by a daemon that died
            else:
                raise WarmLaunchError(f"a warm-pool daemon already listens on {self.socket_path}: stop it or "
                                      f"choose another --socket")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, ("listener", None))

    def _install_signals(self) -> socket.socket:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, lambda signum, _frame: self._signals.append(signum))
        self.sel.register(wake_r, selectors.EVENT_READ, ("wakeup", None))
        self._wake = (wake_r, wake_w)
        return wake_r

    # ------------------------------------------------------------------ spares
    def _spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        cmd = [sys.executable, "-m", "workers.warm_spare", "--ctl-fd", str(child.fileno()),
               "--daemon-pid", str(os.getpid()), "--preload", ",".join(self.preload), "--slot", str(slot)]
        try:
            proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # only signals we forward reach it
        except OSError:
            parent.close()
            raise
        finally:
            child.close()
        spare = Spare(slot=slot, proc=proc, ctl=parent, reader=EventReader(parent))
        self.spares.append(spare)
        self.sel.register(parent, selectors.EVENT_READ, ("spare", spare))

    def _fill(self) -> None:
        if self.stopping or time.monotonic() < self.next_spawn_at:
            return
        while sum(s.state in ("starting", "ready") for s in self.spares) < self.target:
            self._spawn()

    def _retire_idle(self, why: str) -> None:
        for spare in self.spares:
            if spare.state in ("starting", "ready"):
                log.info("retiring spare pid %s (%s)", spare.proc.pid, why)
                spare.state = "retired"
                self._unregister(spare.ctl)
                spare.ctl.close()  # a ready spare exits on end of stream; a starting one on its first read
                self._signal(spare, signal.SIGTERM)

    def _signal(self, spare: Spare, sig: int) -> None:
        try:
            os.kill(spare.proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGTERM:
            spare.term_sent = True

    def _unregister(self, sock: socket.socket) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _on_spare_readable(self, spare: Spare) -> None:
        try:
            alive = spare.reader.feed()
        except OSError:
            alive = False
        while (event := spare.reader.pending()) is not None:
            if event.get("event") == "ready" and spare.state == "starting":
                spare.state = "ready"
                spare.info = event
                self.failures = 0
                for failure in event.get("preload_failed", []):
                    log.warning("spare pid %s could not preload %s (runs import it themselves)",
                                spare.proc.pid, failure)
                log.info("spare pid %s ready (imports took %.2f s); %d ready", spare.proc.pid,
                         event.get("import_s", 0.0), sum(s.state == "ready" for s in self.spares))
            elif event.get("event") == "stale":
                log.warning("%s changed since the spares imported it: replacing idle spares", event.get("path"))
                self._retire_idle("project code changed")
        if not alive:
            self._unregister(spare.ctl)  # busy spares close their end on purpose; exits are seen by poll

    def _reap(self) -> None:
        for spare in list(self.spares):
            rc = spare.proc.poll()
            if rc is None:
                continue
            self.spares.remove(spare)
            self._unregister(spare.ctl)
            spare.ctl.close()
            if spare.client is not None:
                client = spare.client
                log.info("flow run %s in spare pid %s exited with %s", client.flow_run_id, spare.proc.pid, rc)
                try:
                    send_event(client.conn, {"event": "exited", "returncode": rc})
                except OSError:
                    pass
                self._unregister(client.conn)
                client.conn.close()
            elif spare.state == "starting":
                self.failures += 1
                delay = min(MAX_BACKOFF_S, 2.0 ** self.failures)
                self.next_spawn_at = time.monotonic() + delay
                log.error("spare pid %s exited with %s before it was ready (see its output above); next "
                          "attempt in %.0f s", spare.proc.pid, rc, delay)
            elif spare.state == "ready":
                log.warning("idle spare pid %s exited with %s; replacing it", spare.proc.pid, rc)

    # ------------------------------------------------------------------ clients
    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        pid, uid = peer_uid(conn)
        if uid != os.getuid():
            log.warning("refused a connection from pid %s running as uid %s (only uid %s may submit runs)",
                        pid, uid, os.getuid())
            conn.close()
            return
        conn.setblocking(True)
        conn.settimeout(REQUEST_READ_TIMEOUT_S)
        try:
            request, fds = recv_request(conn)
        except ChannelClosed:  # a probe that only checked whether someone listens
            conn.close()
            return
        except (OSError, ValueError, WarmLaunchError) as exc:
            log.warning("bad request from pid %s: %s", pid, exc)
            self._reply(conn, {"event": "rejected", "reason": f"bad request: {exc}"})
            conn.close()
            return
        if request.get("op") == "status":
            for fd in fds:
                os.close(fd)
            self._reply(conn, self.status())
            conn.close()
            return
        conn.settimeout(None)
        client = Client(conn=conn, reader=EventReader(conn), request=request, fds=fds,
                        deadline=time.monotonic() + self.wait_for_spare_s)
        if self.stopping:
            self._decline(client, "the warm-pool daemon is shutting down")
        elif not _same_python(request.get("python")):
            self._decline(client, f"the daemon's spares run {sys.executable} ({sys.prefix}), the run's command "
                                  f"{_describe(request.get('python'))}: start the daemon with the pool's interpreter")
        elif not any(s.state in ("starting", "ready") for s in self.spares) and self.failures:
            self._decline(client, f"no spare can start ({self.failures} failed in a row; see the daemon's log)")
        else:
            self.pending.append(client)

    def _reply(self, conn: socket.socket, event: dict[str, Any]) -> None:
        try:
            send_event(conn, event)
        except OSError:
            pass

    def _decline(self, client: Client, reason: str) -> None:
        log.info("declined flow run %s: %s", client.flow_run_id, reason)
        self._reply(client.conn, {"event": "rejected", "reason": reason})
        client.close_fds()
        client.conn.close()

    def _dispatch(self) -> None:
        now = time.monotonic()
        while self.pending:
            client = self.pending[0]
            if client.gone():
                self.pending.pop(0)
                client.close_fds()
                client.conn.close()
                continue
            spare = next((s for s in self.spares if s.state == "ready" and s.proc.poll() is None), None)
            if spare is None:
                if now >= client.deadline:
                    self.pending.pop(0)
                    self._decline(client, f"no spare became ready within {self.wait_for_spare_s:g} s "
                                          f"(raise --spares or --wait-for-spare)")
                    continue
                return
            self.pending.pop(0)
            self._start(client, spare)

    def _start(self, client: Client, spare: Spare) -> None:
        # "accepted" goes out before the hand-over: a client that saw it never falls back, so a run
        # is never started twice; one that did not see it knows nothing was started.
        try:
            send_event(client.conn, {"event": "accepted", "spare_pid": spare.proc.pid})
        except OSError:
            client.close_fds()
            client.conn.close()
            return
        spare.state = "busy"
        spare.client = client
        client.spare = spare
        try:
            send_request(spare.ctl, client.request, client.fds)
        except OSError as exc:
            log.error("could not hand flow run %s to spare pid %s: %s", client.flow_run_id, spare.proc.pid, exc)
            self._signal(spare, signal.SIGKILL)  # reaped below; the client gets its exit status
        client.close_fds()  # the worker's pipes must close when the spare and client are done
        self.sel.register(client.conn, selectors.EVENT_READ, ("client", client))
        self.served += 1
        log.info("flow run %s -> spare pid %s (slot %s)", client.flow_run_id, spare.proc.pid, spare.slot)
        self._fill()

    def _on_client_readable(self, client: Client) -> None:
        spare = client.spare
        try:
            alive = client.reader.feed()
        except OSError:
            alive = False
        while (event := client.reader.pending()) is not None:
            sig = event.get("signal")
            if spare is not None and isinstance(sig, int) and sig in FORWARDABLE:
                log.info("forwarding signal %s to spare pid %s (flow run %s)", sig, spare.proc.pid,
                         client.flow_run_id)
                self._signal(spare, sig)
        if alive:
            return
        self._unregister(client.conn)
        if spare is not None and spare.proc.poll() is None:
            if spare.term_sent:
                log.info("client of flow run %s is gone after SIGTERM: killing spare pid %s",
                         client.flow_run_id, spare.proc.pid)
                self._signal(spare, signal.SIGKILL)
            else:
                log.info("client of flow run %s is gone: terminating spare pid %s", client.flow_run_id,
                         spare.proc.pid)
                self._signal(spare, signal.SIGTERM)
                spare.kill_at = time.monotonic() + self.kill_grace_s

    def _escalate(self) -> None:
        now = time.monotonic()
        for spare in self.spares:
            if spare.kill_at is not None and now >= spare.kill_at and spare.proc.poll() is None:
                log.warning("spare pid %s ignored SIGTERM for %.0f s: SIGKILL", spare.proc.pid, self.kill_grace_s)
                self._signal(spare, signal.SIGKILL)
                spare.kill_at = None

    def status(self) -> dict[str, Any]:
        return {"event": "status", "pid": os.getpid(), "socket": str(self.socket_path), "target": self.target,
                "served": self.served, "preload": self.preload, "stopping": bool(self.stopping),
                "spares": [{"pid": s.proc.pid, "slot": s.slot, "state": s.state,
                            "flow_run_id": s.client.flow_run_id if s.client else None,
                            "client_pid": s.client.request.get("client_pid") if s.client else None,
                            "ready_info": s.info} for s in self.spares]}

    # ------------------------------------------------------------------ loop
    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGHUP:
            self._retire_idle("SIGHUP")
        elif sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping += 1
            if self.stopping == 1:
                log.info("stopping: no new runs; waiting for %d running flow run(s) (signal again to "
                         "terminate them)", sum(s.state == "busy" for s in self.spares))
                self._close_listener()
                for client in self.pending:
                    self._decline(client, "the warm-pool daemon is shutting down")
                self.pending.clear()
                self._retire_idle("shutting down")
            else:
                for spare in self.spares:
                    if spare.state == "busy" and not spare.term_sent:
                        self._signal(spare, signal.SIGTERM)
                        spare.kill_at = time.monotonic() + self.kill_grace_s

    def _close_listener(self) -> None:
        if self.listener is not None:
            self._unregister(self.listener)
            self.listener.close()
            self.listener = None
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass

    def serve(self) -> None:
        """Run until stopped and every running flow run has finished."""
        wake_r = self._install_signals()
        self.bind()
        self._fill()
        log.info("warm pool on %s: %d spare(s), preload %s, python %s", self.socket_path, self.target,
                 ",".join(self.preload) or "-", sys.executable)
        try:
            while not (self.stopping and not self.spares):
                timeout = 1.0
                if self.pending:
                    timeout = max(0.0, min(timeout, min(c.deadline for c in self.pending) - time.monotonic()))
                for key, _ in self.sel.select(timeout):
                    kind, obj = key.data
                    if kind == "listener":
                        self._accept()
                    elif kind == "wakeup":
                        try:
                            while wake_r.recv(512):
                                pass
                        except BlockingIOError:
                            pass
                    elif kind == "spare":
                        self._on_spare_readable(obj)
                    elif kind == "client":
                        self._on_client_readable(obj)
                signals, self._signals = self._signals, []
                for sig in signals:
                    self._on_signal(sig)
                self._reap()
                self._escalate()
                self._fill()
                self._dispatch()
        finally:
            self._close_listener()
            for spare in self.spares:
                self._signal(spare, signal.SIGKILL)
                spare.proc.wait()
        log.info("warm pool on %s stopped after %d run(s)", self.socket_path, self.served)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.warm_pool", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", type=Path, default=None,
                    help=f"Unix socket path (default ${SOCKET_ENV}, else {default_socket_path()})")
    ap.add_argument("--spares", type=int, default=2, help="ready spare processes to keep (default 2)")
    ap.add_argument("--preload", default=DEFAULT_PRELOAD,
                    help=f"comma-separated modules each spare imports ahead (default {DEFAULT_PRELOAD})")
    ap.add_argument("--wait-for-spare", type=float, default=10.0,
                    help="seconds a run may wait for a spare that is still importing (default 10)")
    ap.add_argument("--kill-grace", type=float, default=10.0,
                    help="seconds between SIGTERM and SIGKILL for a spare whose client vanished (default 10)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s warm-pool[%(process)d] %(levelname)s %(message)s")
    path = args.socket or default_socket_path()
    try:
        pool = WarmPool(path.absolute(), spares=args.spares, preload=[m for m in args.preload.split(",") if m],
                        wait_for_spare_s=args.wait_for_spare, kill_grace_s=args.kill_grace)
        pool.serve()
    except WarmLaunchError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
