"""SiteHealth: whether a site can take work now — its SSH hosts, store and pool workers answer — with evidence.

Each probe is one short, bounded check that returns a ``HealthCheck`` (name, ok, detail,
seconds) and never raises for the failure it is looking for:

- ``probe_ssh`` — log in to one host with the site block's key and pinned known_hosts and run
  ``true``. Unreachable, timed out, an unknown or changed host key, a refused key: unhealthy,
  with that reason.
- ``probe_store`` — one cheap request to the site's object store (``HEAD`` of the bucket for
  S3; for a directory, that it or the directory it will be created in is there and writable).
- ``probe_workers`` — the pool's worker heartbeat as the caller read it (``workers_online``
  from the Prefect adapter); ``None`` means "not known" and is not checked.

``assess(site, checks)`` folds the results into a ``SiteHealth`` (healthy when every check
passed); ``check_site`` runs the probes a site's config calls for. ``unavailable(healths)``
gives what ``Placement.decide(unavailable=...)`` takes: unhealthy sites and why, so they are
rejected by rule ``site health`` — shown with the reason in the candidates table — until a
later check finds them healthy again.

Example: sshd on ``onprem-dc1``'s gateway is stopped. ``check_site`` → ssh
``gpu@10.0.0.5:22``: "cannot connect ... Connection refused" (0.01 s); store ok; 2 workers
online → unhealthy. The flow passes ``{"onprem-dc1": "ssh gpu@10.0.0.5:22: cannot connect ..."}``
to placement, which picks the next allowed site and lists ``onprem-dc1 (fixed)`` as rejected by
``site health``. An hour later sshd is back, the next check is healthy and the site is eligible.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from hybridtrain.errors import HybridtrainError
from hybridtrain.specs.sites import S3Store, Site, SshHost
from hybridtrain.storage import open_store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import ObjectStore

#: Seconds each probe may take by default.
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HealthCheck:
    """One probe's result: what was checked, whether it passed, what it found, how long it took."""

    name: str
    ok: bool
    detail: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'} ({self.detail}, {self.seconds:.2f} s)"


@dataclass(frozen=True)
class SiteHealth:
    """A site's health at ``checked_at``: healthy when every check passed."""

    site: str
    healthy: bool
    checks: tuple[HealthCheck, ...]
    checked_at: datetime

    @property
    def failed(self) -> tuple[HealthCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def reason(self) -> str:
        """Why the site is unhealthy ('' when it is healthy): each failed check and what it found."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.failed)

    def to_rows(self) -> list[dict[str, str]]:
        """Rows for a table artifact: one per check."""
        return [{"site": self.site, "check": c.name, "ok": "yes" if c.ok else "no", "detail": c.detail,
                 "seconds": f"{c.seconds:.2f}", "checked_at": self.checked_at.isoformat()} for c in self.checks]


def assess(site: str, checks: Iterable[HealthCheck | None], *, checked_at: datetime | None = None) -> SiteHealth:
    """Fold probe results (``None``: not checked) into the site's health: healthy iff all passed."""
    done = tuple(c for c in checks if c is not None)
    return SiteHealth(site=site, healthy=all(c.ok for c in done), checks=done,
                      checked_at=checked_at or datetime.now(UTC))


def unavailable(healths: Iterable[SiteHealth]) -> dict[str, str]:
    """Unhealthy sites and the reason, for ``Placement.decide(unavailable=...)``."""
    return {h.site: h.reason for h in healths if not h.healthy}


# -- probes -------------------------------------------------------------------------------------


def probe(name: str, check: Callable[[], str], timeout_s: float = PROBE_TIMEOUT_S) -> HealthCheck:
    """Run ``check`` (returns a detail on success, raises on failure) with a hard time limit.

    It runs in a daemon thread, so even a call stuck in the kernel (a hung NFS mount) costs at
    most ``timeout_s`` here. Errors a probe exists to find — a ``HybridtrainError`` (unreachable,
    refused, misconfigured) or an ``OSError`` — make the check fail with their message; anything
    else is a bug and is raised.
    """
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["detail"] = check()
        except (HybridtrainError, OSError, EOFError) as exc:
            outcome["failure"] = f"{type(exc).__name__}: {exc}".strip()
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["bug"] = exc
        finally:
            done.set()

    started = time.perf_counter()
    threading.Thread(target=run, name=f"probe {name}", daemon=True).start()
    finished = done.wait(timeout_s)
    seconds = time.perf_counter() - started
    if not finished:
        return HealthCheck(name, False, f"no answer within {timeout_s:g} s", seconds)
    if "bug" in outcome:
        raise outcome["bug"]  # type: ignore[misc]
    if "failure" in outcome:
        return HealthCheck(name, False, str(outcome["failure"]), seconds)
    return HealthCheck(name, True, str(outcome.get("detail", "ok")), seconds)


def probe_ssh(
    host: SshHost,
    private_key: str | SecretStr | None,
    known_hosts: str | None,
    *,
    site: str | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> HealthCheck:
    """Log in to ``host`` (pinned host key, the block's key) and run ``true``."""
    import paramiko  # lazy: heavy (paramiko)

    from hybridtrain.remote.ssh_site import SshSite, Timeouts, known_hosts_name  # lazy: heavy (paramiko)

    name = f"ssh {host.username}@{known_hosts_name(host.hostname, host.port)}"
    # Each step gets the whole budget; probe() bounds the sum.
    steps = Timeouts(connect=timeout_s, command=timeout_s, reconnect=timeout_s)

    def check() -> str:
        try:
            with SshSite(host, private_key, known_hosts, site=site, timeouts=steps) as remote:
                status, out = remote.run("true", timeout=timeout_s)
        except (paramiko.SSHException, EOFError) as exc:  # the session broke after connecting
            raise ConnectionError(f"the SSH session failed: {exc or type(exc).__name__}") from None
        if status != 0:
            raise ConnectionError(f"`true` exited with {status}: {out.strip()[:200]}")
        return "logged in and ran `true`"

    # A little over the budget: the SSH steps time out on their own first and say why.
    return probe(name, check, timeout_s * 2 + 1)


def probe_store(store: ObjectStore, *, timeout_s: float = PROBE_TIMEOUT_S, name: str | None = None) -> HealthCheck:
    """One cheap request to ``store``: the bucket's HEAD for S3 (``check()``), the directory for a local store."""
    label = name or f"store {store.url}"

    def check() -> str:
        if isinstance(store, LocalObjectStore):
            return _local_store_detail(store.root)
        head = getattr(store, "check", None)
        if callable(head):
            head()
            return "bucket answered"
        store.exists(".hybridtrain-health")
        return "store answered"

    return probe(label, check, timeout_s)


def _local_store_detail(root: Path) -> str:
    if root.is_dir():
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(f"directory {root} is not writable by this user")
        return f"directory {root} is writable"
    if root.exists():
        raise NotADirectoryError(f"{root} is not a directory")
    parent = next(p for p in root.parents if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise FileNotFoundError(f"{root} does not exist and cannot be created in {parent}")
    return f"directory {root} will be created in {parent}"


def probe_workers(pool: str, workers_online: int | None) -> HealthCheck | None:
    """The pool's worker heartbeat as the caller observed it; None (not checked) when unknown."""
    if workers_online is None:
        return None
    if workers_online < 0:
        raise ValueError(f"workers_online must be >= 0, got {workers_online}")
    if workers_online == 0:
        return HealthCheck(f"workers of pool {pool}", False,
                           "no worker has sent a heartbeat recently; start one for the pool", 0.0)
    return HealthCheck(f"workers of pool {pool}", True, f"{workers_online} online", 0.0)


def site_store(site: Site, root: Path, *, timeout_s: float = PROBE_TIMEOUT_S) -> ObjectStore:
    """The site's store opened for probing: an S3 store gets short timeouts and no retries."""
    if isinstance(site.store, S3Store):
        from hybridtrain.storage.s3 import S3ObjectStore, S3Options  # lazy: heavy (boto3)

        fast = S3Options(connect_timeout_s=timeout_s, read_timeout_s=timeout_s, request_attempts=1, attempts=1)
        return S3ObjectStore(site.store, site=site.name, options=fast)
    return open_store(site.store, root, site=site.name)


def check_site(
    site: Site,
    root: Path,
    *,
    private_key: str | SecretStr | None = None,
    known_hosts: str | None = None,
    workers_online: int | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> SiteHealth:
    """Probe every SSH host of ``site`` (when the block's key is given), its store, and its workers.

    ``root`` is the workspace root (a local store's relative path is relative to it). A site
    with hosts but no key given is not SSH-checked — say so by passing the key.
    """
    checks: list[HealthCheck | None] = []
    if private_key is not None:
        checks += [probe_ssh(h, private_key, known_hosts, site=site.name, timeout_s=timeout_s) for h in site.hosts]
    checks.append(probe_store(site_store(site, root, timeout_s=timeout_s), timeout_s=timeout_s,
                              name=f"store {site.store_url(root)}"))
    checks.append(probe_workers(site.work_pool, workers_online))
    return assess(site.name, checks)
