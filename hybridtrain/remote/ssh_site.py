"""SshSite: an on-prem host reached over SSH (paramiko) — run commands, move files, start and follow detached jobs.

Trust and authentication come only from the site block: the host key must be pinned in its
``ssh_known_hosts`` text (``RejectPolicy``, never trust on first use; hosts on other ports than
22 are keyed ``[host]:port``) and the only key offered is its ``ssh_private_key`` (no agent, no
``~/.ssh``). Every network step has a timeout; nothing waits forever.

A job lives in ``<workdir>/jobs/<job_id>/`` on the host::

    run.sh      wrapper: records its pid, runs the command, writes its exit status
    pid         process id (and process group) of the wrapper
    log         the command's stdout and stderr
    exit_code   written (atomically) when the command has ended

``launch`` starts the wrapper with ``setsid nohup`` and no PTY, so it belongs to no SSH session:
a dropped connection does not touch it. ``stream`` tails ``log`` by byte offset and passes
complete lines on; when the connection drops it reconnects with bounded backoff, re-attaches
by job id and continues at the same offset, so no line is lost or repeated. Example: a job
prints lines 1-40, the connection drops, ``stream`` reconnects two seconds later while the job
is at line 75, delivers 41-75, keeps following and returns the exit status from ``exit_code``.

Errors: unreachable, refused or timed-out connections are ``SiteUnavailable`` (try another
site); an unpinned or changed host key is ``HostKeyRejected`` and a refused key ``AuthRefused``
(never retried: a person fixes the site block); a job that ends non-zero is ``RemoteJobFailed``
with its exit status and the last lines of its log.

Longer than most modules on purpose: one class over one paramiko connection — commands, atomic transfers, detached jobs and re-attaching to them — so every call shares the same timeouts, retry and host-key policy.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import re
import secrets
import shlex
import socket
import stat
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey
from pydantic import SecretStr

from hybridtrain.errors import (
    AuthRefused,
    HostKeyRejected,
    Problem,
    RemoteJobFailed,
    SiteUnavailable,
    SpecError,
    TransientError,
)
from hybridtrain.specs.sites import SshHost

log = logging.getLogger(__name__)

KEY_FIELD = "ssh_private_key"
KNOWN_HOSTS_FIELD = "ssh_known_hosts"
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TAIL_LINES = 40
READ_CHUNK = 1 << 20
# Exit status of coreutils `timeout` when it had to stop the command.
TIMED_OUT = 124


@dataclass(frozen=True)
class Timeouts:
    """How long each step may take, in seconds."""

    connect: float = 10.0  # TCP connect, SSH banner, authentication, opening a channel
    command: float = 60.0  # one short command or one SFTP operation
    reconnect: float = 60.0  # how long stream() keeps trying to get a dropped connection back


@dataclass(frozen=True)
class SshCredentials:
    """What a site block holds to reach its hosts: the private key and the pinned host keys."""

    private_key: SecretStr
    known_hosts: str


@dataclass(frozen=True)
class RemoteJob:
    """A job started by ``SshSite.launch``: its id, the host, its directory there and its process group."""

    job_id: str
    host: str
    dir: str
    pid: int

    @property
    def log(self) -> str:
        return f"{self.dir}/log"

    @property
    def exit_file(self) -> str:
        return f"{self.dir}/exit_code"


@dataclass
class _Cursor:
    """How far into a job's log the lines have been passed on, in bytes."""

    offset: int = 0


def known_hosts_name(hostname: str, port: int) -> str:
    """How known_hosts names a host: ``host`` on port 22, ``[host]:port`` elsewhere."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def parse_known_hosts(text: str | None) -> list[tuple[str, paramiko.PKey]]:
    """(host pattern, key) pairs of known_hosts text; hashed names are kept as they are.

    Marker lines (``@cert-authority``, ``@revoked``) are refused rather than ignored, since
    ignoring a revocation would trust a key someone meant to distrust.
    """
    pairs: list[tuple[str, paramiko.PKey]] = []
    problems: list[Problem] = []
    for n, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            problems.append(Problem(KNOWN_HOSTS_FIELD, f"marker {line.split()[0]} is not supported; list plain "
                                                       "'host keytype key' lines", line=n))
            continue
        try:
            entry = HostKeyEntry.from_line(line, n)
        except (InvalidHostKey, paramiko.SSHException, ValueError) as exc:
            problems.append(Problem(KNOWN_HOSTS_FIELD, f"cannot read the key: {exc}", line=n))
            continue
        if entry is None:
            problems.append(Problem(KNOWN_HOSTS_FIELD, "not a known_hosts line ('host keytype base64key') or an "
                                                       "unsupported key type", line=n))
            continue
        pairs.extend((name, entry.key) for name in entry.hostnames)
    if problems:
        raise SpecError("site block", problems)
    return pairs


def load_private_key(text: str | SecretStr | None) -> paramiko.PKey:
    """The private key in OpenSSH or PEM form (Ed25519, ECDSA or RSA, unencrypted)."""
    raw = text.get_secret_value() if isinstance(text, SecretStr) else text
    if not raw:
        raise SpecError("site block", [Problem(KEY_FIELD, "no private key is set; store the key whose public half "
                                                          "is in the hosts' authorized_keys")])
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(raw))
        except paramiko.PasswordRequiredException:
            raise SpecError("site block", [Problem(KEY_FIELD, "the private key is encrypted; store an unencrypted "
                                                              "key (the block itself is encrypted at rest)")]) from None
        except (paramiko.SSHException, ValueError, TypeError, IndexError):
            continue
    # Never echo the text: it is a secret even when it is not a valid key.
    raise SpecError("site block", [Problem(KEY_FIELD, "not a readable private key (expected an OpenSSH or PEM "
                                                      "Ed25519, ECDSA or RSA key)")])


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _RejectUnpinned(paramiko.RejectPolicy):
    """RejectPolicy that says what to do: the key must be verified and pinned first."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyRejected(
            hostname,
            f"host key of {hostname} is not in known_hosts; verify it out of band and add it to the site "
            f"block's {KNOWN_HOSTS_FIELD} (the server offered {_fingerprint(key)}); nothing was sent to it",
            changed=False,
        )


def _is_connection_loss(exc: BaseException, alive: bool) -> bool:
    """Whether ``exc`` means the SSH connection is gone (then reconnecting may help)."""
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return not alive
    if isinstance(exc, (EOFError, paramiko.SSHException, ConnectionError, TimeoutError, socket.timeout)):
        return True
    return isinstance(exc, OSError) and not alive


class SshSite:
    """One SSH host of a site: a paramiko connection with pinned host keys and key-only auth.

    ``private_key`` and ``known_hosts`` are the texts of the site block's ``ssh_private_key``
    and ``ssh_known_hosts``. ``site`` names the site in errors (default ``host:port``). Connect
    explicitly, or use it as a context manager; operations connect on first use.
    """

    def __init__(
        self,
        host: SshHost,
        private_key: str | SecretStr | None,
        known_hosts: str | None,
        *,
        site: str | None = None,
        timeouts: Timeouts = Timeouts(),
    ):
        self.host = host
        self.site = site or f"{host.hostname}:{host.port}"
        self.timeouts = timeouts
        self._pkey = load_private_key(private_key)
        self._known = parse_known_hosts(known_hosts)
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._workdir: str | None = None
        #: How many times a dropped connection was re-established (by ``stream``).
        self.reconnects = 0

    # -- connection --------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return f"{self.host.username}@{known_hosts_name(self.host.hostname, self.host.port)}"

    def __enter__(self) -> SshSite:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> SshSite:
        """Open the connection (no-op when open). Raises SiteUnavailable, HostKeyRejected or AuthRefused."""
        if self._alive():
            return self
        self.close()
        h, t = self.host, self.timeouts
        name = known_hosts_name(h.hostname, h.port)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_RejectUnpinned())
        pinned = client.get_host_keys()
        for pattern, key in self._known:
            pinned.add(pattern, key.get_name(), key)
        try:
            client.connect(
                h.hostname, port=h.port, username=h.username, pkey=self._pkey,
                allow_agent=False, look_for_keys=False,
                timeout=t.connect, banner_timeout=t.connect, auth_timeout=t.connect, channel_timeout=t.connect,
            )
            transport = client.get_transport()
            assert transport is not None
            # Keepalives make a silently dead peer surface as an error instead of a stall.
            transport.set_keepalive(max(1, int(t.connect)))
            sftp = client.open_sftp()
            sftp.get_channel().settimeout(t.command)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(
                name,
                f"host key of {name} does not match the one pinned in the site block's {KNOWN_HOSTS_FIELD}: the "
                f"server offered {_fingerprint(exc.key)}, known_hosts has {_fingerprint(exc.expected_key)}. This "
                "can be a man-in-the-middle attack; nothing was sent to the server. If the host was reinstalled, "
                f"verify its new key out of band and replace the line in {KNOWN_HOSTS_FIELD}",
                changed=True,
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthRefused(
                self.label,
                f"{h.username}@{name} refused key authentication ({exc}) with the site block's {KEY_FIELD} "
                f"({_fingerprint(self._pkey)}); add its public key to ~{h.username}/.ssh/authorized_keys on the "
                "host, or fix the username in the site's hosts entry",
            ) from None
        except HostKeyRejected:
            client.close()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise SiteUnavailable(self.site, f"cannot connect to {self.label}: {exc or type(exc).__name__}; check "
                                             "that the host is up and sshd listens on that port") from None
        self._client, self._sftp = client, sftp
        self._workdir = None
        return self

    def close(self) -> None:
        """Close the connection; jobs started by ``launch`` keep running."""
        if self._client is not None:
            self._client.close()
        self._client, self._sftp = None, None

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client is not None else None
        return transport is not None and transport.is_active()

    def _transport(self) -> paramiko.Transport:
        self.connect()
        assert self._client is not None
        transport = self._client.get_transport()
        assert transport is not None
        return transport

    def sftp(self) -> paramiko.SFTPClient:
        self.connect()
        assert self._sftp is not None
        return self._sftp

    @property
    def workdir(self) -> str:
        """The host's working directory as an absolute path (``~`` resolved to the user's home)."""
        if self._workdir is None:
            home = self.sftp().normalize(".")
            wd = self.host.workdir
            if wd == "~" or wd.startswith("~/"):
                wd = posixpath.join(home, wd[2:]) if wd != "~" else home
            elif not wd.startswith("/"):
                wd = posixpath.join(home, wd)
            self._workdir = posixpath.normpath(wd)
        return self._workdir

    def path(self, remote: str) -> str:
        """``remote`` as an absolute path: relative paths are under the working directory."""
        return remote if remote.startswith("/") else posixpath.join(self.workdir, remote)

    # -- commands and files ------------------------------------------------------------------

    def run(self, command: str | Sequence[str], timeout: float | None = None) -> tuple[int, str]:
        """Run a short command; return (exit status, stdout and stderr merged).

        A sequence is quoted argument by argument; a string is a shell command line, so quote
        anything you put into it. The host stops the command at ``timeout`` (default
        ``timeouts.command``) and SiteUnavailable is raised, as it is when the reply does not come.
        """
        limit = float(timeout if timeout is not None else self.timeouts.command)
        text = command if isinstance(command, str) else shlex.join(command)
        wrapped = f"timeout -k 5 {limit:g} sh -c {shlex.quote(text)}"
        deadline = time.monotonic() + limit + self.timeouts.connect
        chan = self._transport().open_session(timeout=self.timeouts.connect)
        chunks: list[bytes] = []
        try:
            chan.set_combine_stderr(True)
            chan.exec_command(wrapped)
            while True:
                chan.settimeout(max(0.01, deadline - time.monotonic()))
                data = chan.recv(65536)
                if not data:
                    break
                chunks.append(data)
            if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise socket.timeout()
            status = chan.exit_status
        except socket.timeout:
            raise SiteUnavailable(self.site, f"{self.label} did not answer `{text}` within {limit:g} s") from None
        finally:
            chan.close()
        output = b"".join(chunks).decode("utf-8", "replace")
        if status == TIMED_OUT:
            raise SiteUnavailable(self.site, f"`{text}` did not finish within {limit:g} s on {self.label} and was "
                                             "stopped (host overloaded or a hung mount?)")
        return status, output

    def _makedirs(self, path: str, mode: int = 0o755) -> None:
        sftp = self.sftp()
        missing = []
        while path not in ("", "/"):
            try:
                sftp.stat(path)
                break
            except FileNotFoundError:
                missing.append(path)
                path = posixpath.dirname(path)
        for p in reversed(missing):
            sftp.mkdir(p, mode)

    def exists(self, remote: str) -> bool:
        try:
            self.sftp().stat(self.path(remote))
        except FileNotFoundError:
            return False
        return True

    def _rmtree(self, path: str) -> None:
        sftp = self.sftp()
        for attr in sftp.listdir_attr(path):
            child = f"{path}/{attr.filename}"
            if stat.S_ISDIR(attr.st_mode or 0):
                self._rmtree(child)
            else:
                sftp.remove(child)
        sftp.rmdir(path)

    def upload_dir(self, local: Path | str, remote: str) -> str:
        """Copy the local directory ``local`` to ``remote`` over SFTP, atomically; returns the remote path.

        Files go into a private (0700) temporary directory next to the target, which is then
        renamed into place, so the host never sees a half-copied bundle; a previous ``remote`` is
        replaced. File modes are kept (a 0600 secrets file stays 0600).
        """
        local = Path(local)
        if not local.is_dir():
            raise NotADirectoryError(f"{local} is not a directory")
        target = self.path(remote).rstrip("/")
        parent, name = posixpath.split(target)
        self._makedirs(parent)
        sftp = self.sftp()
        tmp = f"{parent}/.{name}.tmp-{secrets.token_hex(4)}"
        sftp.mkdir(tmp, 0o700)
        try:
            for folder, dirs, files in os.walk(local):
                dirs.sort()
                rel = Path(folder).relative_to(local).as_posix()
                base = tmp if rel == "." else f"{tmp}/{rel}"
                if rel != ".":
                    sftp.mkdir(base, 0o700)
                for f in sorted(files):
                    src = Path(folder) / f
                    sftp.put(str(src), f"{base}/{f}")
                    sftp.chmod(f"{base}/{f}", stat.S_IMODE(src.stat().st_mode))
            old = None
            if self.exists(target):
                old = f"{parent}/.{name}.old-{secrets.token_hex(4)}"
                sftp.posix_rename(target, old)
            sftp.posix_rename(tmp, target)
        except BaseException:
            if self._alive():
                try:
                    self._rmtree(tmp)
                except OSError as cleanup:  # the original error matters more; leave a note of the leftover
                    log.warning("could not remove %s:%s after a failed upload: %s", self.label, tmp, cleanup)
            raise
        if old is not None:
            self._rmtree(old)
        return target

    def download(self, remote: str, local: Path | str) -> Path:
        """Copy the remote file to ``local`` (written atomically); returns the local path."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{local.name}.tmp-", dir=local.parent)
        os.close(fd)
        src = self.path(remote)
        try:
            self.sftp().get(src, tmp)
            os.replace(tmp, local)
        except FileNotFoundError:
            Path(tmp).unlink(missing_ok=True)
            raise FileNotFoundError(f"{self.label}:{src} does not exist") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return local

    # -- jobs --------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> str:
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"invalid job id {job_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
        return f"{self.workdir}/jobs/{job_id}"

    def launch(self, job_id: str, argv: Sequence[str], workdir: str | None = None,
               env: Mapping[str, str] | None = None) -> RemoteJob:
        """Start ``argv`` on the host as job ``job_id``, detached from this connection.

        The command runs in ``workdir`` (default: the job's directory) with ``env`` added to the
        login environment, under ``setsid nohup`` with no PTY and stdin from /dev/null, so
        closing or losing the connection does not stop it. Its output goes to the job's log;
        its exit status is written to ``exit_code`` when it ends. A job id can be launched once
        (FileExistsError): attach to it, or ``retire`` it first.
        """
        if not argv:
            raise ValueError("give the command to run as a non-empty argv list")
        env = dict(env or {})
        bad = [k for k in env if not ENV_NAME_RE.match(k)]
        if bad:
            raise ValueError(f"invalid environment variable names {bad}")
        d = self.job_dir(job_id)
        self._makedirs(d)
        if self.exists(f"{d}/run.sh"):
            raise FileExistsError(f"job {job_id!r} was already launched on {self.label} ({d}); attach to it, or "
                                  "retire it and launch again")
        q = shlex.quote
        assignments = " ".join(q(f"{k}={v}") for k, v in sorted(env.items()))
        command = " ".join(q(a) for a in argv)
        script = (
            f"# hybridtrain job {job_id}: started detached by SshSite.launch.\n"
            f"exec > {q(d + '/log')} 2>&1 < /dev/null\n"
            # A TERM to the process group stops the command; the wrapper survives to record its status.
            "trap : TERM INT\n"
            f"echo $$ > {q(d + '/pid.tmp')} && mv -f {q(d + '/pid.tmp')} {q(d + '/pid')}\n"
            f"cd {q(workdir or d)} && env {assignments} {command}\n"
            "status=$?\n"
            f"echo $status > {q(d + '/exit_code.tmp')} && mv -f {q(d + '/exit_code.tmp')} {q(d + '/exit_code')}\n"
        )
        with self.sftp().open(f"{d}/run.sh", "w") as fh:
            fh.write(script)
        # The wrapper writes its pid first thing; wait for it here (bounded) so the job is identifiable.
        status, out = self.run(
            f"cd {q(d)} && (setsid nohup sh run.sh > /dev/null 2>&1 < /dev/null &) ; i=0; "
            "while [ ! -s pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; cat pid"
        )
        try:
            pid = int(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteJobFailed(job_id, self.label, None, self.tail_text(f"{d}/log"),
                                  hint=f"it did not start (launcher said: {out.strip() or status})") from None
        log.info("launched job %s on %s (pid %d): %s", job_id, self.label, pid, command)
        return RemoteJob(job_id, self.label, d, pid)

    def find(self, job_id: str) -> RemoteJob | None:
        """The job launched under ``job_id`` (running or finished), or None if there is none."""
        d = self.job_dir(job_id)
        try:
            with self.sftp().open(f"{d}/pid", "r") as fh:
                pid = int(fh.read().decode().strip())
        except FileNotFoundError:
            return None
        return RemoteJob(job_id, self.label, d, pid)

    def attach(self, job_id: str) -> RemoteJob:
        """The job launched under ``job_id`` — e.g. after a reconnect. FileNotFoundError if there is none."""
        job = self.find(job_id)
        if job is None:
            raise FileNotFoundError(f"no job {job_id!r} on {self.label} (looked in {self.job_dir(job_id)})")
        return job

    def _exit_status(self, job: RemoteJob) -> int | None:
        try:
            with self.sftp().open(job.exit_file, "r") as fh:
                return int(fh.read().decode().strip())
        except FileNotFoundError:
            return None

    def _process_alive(self, job: RemoteJob) -> bool:
        try:
            self.sftp().stat(f"/proc/{job.pid}")
        except FileNotFoundError:
            return False
        return True

    def poll(self, job: RemoteJob) -> int | None:
        """The job's exit status, or None while it runs. RemoteJobFailed when it vanished without one."""
        status = self._exit_status(job)
        if status is None and not self._process_alive(job):
            status = self._exit_status(job)  # it may have ended between the two looks
            if status is None:
                raise RemoteJobFailed(job.job_id, self.label, None, self.tail_text(job.log))
        return status

    def retire(self, job: RemoteJob) -> str:
        """Move a finished job's directory aside (``<dir>.retired-<n>``) so its id can be launched again."""
        if self._exit_status(job) is None and self._process_alive(job):
            raise FileExistsError(f"job {job.job_id!r} is still running on {self.label}; cancel it first")
        aside = f"{job.dir}.retired-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
        self.sftp().posix_rename(job.dir, aside)
        return aside

    def tail_text(self, remote: str, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of a remote file ('' when it does not exist)."""
        _, out = self.run(f"tail -n {int(lines)} {shlex.quote(remote)} 2>/dev/null; true")
        return out

    def _read_lines(self, job: RemoteJob, cursor: _Cursor, on_line: Callable[[str], None], tail: deque[str],
                    final: bool) -> None:
        """Pass on the complete lines after ``cursor.offset`` (and a last unterminated one when
        ``final``). The cursor moves past each line as it is handed over, so when the connection
        drops half-way the next call starts exactly after the last line passed on."""
        sftp = self.sftp()
        try:
            size = sftp.stat(job.log).st_size or 0
        except FileNotFoundError:
            return
        if size <= cursor.offset:
            return
        with sftp.open(job.log, "rb") as fh:
            while cursor.offset < size:
                fh.seek(cursor.offset)
                data = fh.read(min(READ_CHUNK, size - cursor.offset))
                if not data:
                    break
                end = data.rfind(b"\n") + 1
                if end == 0:
                    if not final and len(data) < READ_CHUNK:
                        break  # an unfinished line: wait for its end
                    end = len(data)  # the job is over (or one huge line): pass on what there is
                chunk = data[:end]
                pieces = chunk.split(b"\n")
                if chunk.endswith(b"\n"):
                    pieces.pop()  # the empty remainder after the last newline
                for i, piece in enumerate(pieces):
                    terminated = i < len(pieces) - 1 or chunk.endswith(b"\n")
                    cursor.offset += len(piece) + (1 if terminated else 0)
                    line = piece.decode("utf-8", "replace").rstrip("\r")
                    tail.append(line)
                    on_line(line)

    def stream(self, job: RemoteJob, on_line: Callable[[str], None], poll_interval: float = 0.5,
               timeout: float = 3600.0, *, offset: int = 0, check: bool = True) -> int:
        """Follow the job's log from byte ``offset`` until it ends; return its exit status.

        Each complete line goes to ``on_line`` exactly once, in order. A dropped connection is
        re-established with backoff (for up to ``timeouts.reconnect`` seconds) and the job
        re-attached by id; the log continues at the same byte offset. With ``check`` a non-zero
        status raises RemoteJobFailed carrying the status and the last lines of the log.

        Raises TransientError when the job still runs after ``timeout`` seconds (it keeps running:
        attach to it later, or cancel it), and SiteUnavailable when the connection cannot be
        re-established (the job is unaffected).
        """
        deadline = time.monotonic() + timeout
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        cursor = _Cursor(offset)
        reattach = False
        while True:
            if time.monotonic() > deadline:
                raise TransientError(
                    f"job {job.job_id!r} on {self.label} is still running after {timeout:g} s; it was left "
                    f"running: attach to it by its id to follow it, or cancel it"
                )
            try:
                if self._client is not None and not self._alive():
                    raise ConnectionResetError("the connection was closed")
                if reattach:
                    job = self.attach(job.job_id)
                    reattach = False
                status = self._exit_status(job)
                alive = status is None and self._process_alive(job)
                if status is None and not alive:
                    status = self._exit_status(job)  # it may have ended between the two looks
                done = status is not None or not alive
                self._read_lines(job, cursor, on_line, tail, final=done)
            except (OSError, EOFError, paramiko.SSHException, SiteUnavailable) as exc:
                if not isinstance(exc, SiteUnavailable) and not _is_connection_loss(exc, self._alive()):
                    raise
                log.warning("lost the connection to %s while following job %s (%s); reconnecting",
                            self.label, job.job_id, exc or type(exc).__name__)
                self._reconnect(job, deadline)
                reattach = True
                continue
            if done:
                if status is None:
                    raise RemoteJobFailed(job.job_id, self.label, None, "\n".join(tail))
                if check and status != 0:
                    raise RemoteJobFailed(job.job_id, self.label, status, "\n".join(tail))
                return status
            time.sleep(max(0.0, min(poll_interval, deadline - time.monotonic())))

    def _reconnect(self, job: RemoteJob, deadline: float) -> None:
        """Reconnect with exponential backoff (0.5 s doubling to 8 s) within ``timeouts.reconnect``."""
        self.close()
        give_up = min(deadline, time.monotonic() + self.timeouts.reconnect)
        delay = 0.5
        while True:
            try:
                self.connect()
            except SiteUnavailable as exc:
                if time.monotonic() + delay > give_up:
                    raise SiteUnavailable(
                        self.site, f"lost the connection to {self.label} while following job {job.job_id!r} and "
                                   f"could not get it back ({exc.reason}); the job keeps running there: attach to "
                                   "it by its id later"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 8.0)
                continue
            self.reconnects += 1
            log.info("reconnected to %s; re-attaching job %s", self.label, job.job_id)
            return

    def cancel(self, job: RemoteJob, grace: float = 10.0) -> int:
        """Stop the job: SIGTERM to its process group, SIGKILL after ``grace`` seconds. Returns its exit status."""
        q = shlex.quote
        self.run(f"kill -TERM -{int(job.pid)} 2>/dev/null; true")
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            status = self._exit_status(job)
            if status is not None:
                return status
            time.sleep(0.2)
        # The wrapper dies with the group: record the status it cannot write any more.
        tmp = q(job.exit_file + ".tmp")
        self.run(f"kill -KILL -{int(job.pid)} 2>/dev/null; [ -e {q(job.exit_file)} ] || "
                 f"{{ echo 137 > {tmp} && mv -f {tmp} {q(job.exit_file)}; }}")
        status = self._exit_status(job)
        return 137 if status is None else status
