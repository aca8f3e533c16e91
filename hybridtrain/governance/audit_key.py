"""AuditKey: the Ed25519 key that signs the audit log's head, kept apart from the log it vouches for.

The log lives in ``.hybridtrain/audit/``; its signing key is a PEM file elsewhere —
``HYBRIDTRAIN_AUDIT_KEY_FILE`` when set (a mounted secret, another host's share), else
``.hybridtrain/keys/audit-signing.pem`` (mode 0600 in a 0700 directory) — and its public half
``audit-signing.pub.pem`` beside it is what ``hybridtrain audit verify`` checks the head against.
Someone who can rewrite the log and its head file but cannot read this key can no longer make a
rewritten chain verify: the head they write is unsigned or signed by another key.

The key is made by the first record a writer of the workspace appends (never at import time,
never by a writer that appends nothing — a refused ``rollback`` makes no key), so every writer
of one workspace — the flow's stages, ``hybridtrain rollback`` / ``retire`` — signs with the
same key. Its existence is therefore also evidence: a workspace with an audit key has written
records, and ``hybridtrain audit verify`` fails if its log and head are gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hybridtrain.errors import Problem, SpecError
from hybridtrain.governance.audit_log import AuditLog, path_problem
from hybridtrain.governance.signing_key import SigningKey, VerifyKey

ENV_KEY_FILE = "HYBRIDTRAIN_AUDIT_KEY_FILE"
DEFAULT_KEY = Path(".hybridtrain") / "keys" / "audit-signing.pem"


def key_path(root: Path | str) -> Path:
    """Where the workspace's audit signing key is (``HYBRIDTRAIN_AUDIT_KEY_FILE`` or the default)."""
    configured = os.environ.get(ENV_KEY_FILE)
    return Path(configured) if configured else Path(root) / DEFAULT_KEY


def public_key_path(root: Path | str) -> Path:
    """The public half: ``<key file without .pem>.pub.pem``."""
    private = key_path(root)
    return private.with_name(private.name.removesuffix(".pem") + ".pub.pem")


def signing_key(root: Path | str, *, create: bool = True) -> SigningKey | None:
    """The workspace's audit signing key, created (0600) on first use unless ``create`` is false (then None while
    it does not exist); ``SpecError`` if the file is unusable or cannot be created."""
    path = key_path(root)
    if not path.exists() and not path.is_symlink():
        if not create:
            return None
        key = SigningKey.generate()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        except OSError as exc:
            raise _unusable(path, f"it cannot be created ({exc.strerror}: {exc.filename})") from None
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(key.to_pem())
                fh.flush()
                os.fsync(fh.fileno())
            public_key_path(root).write_bytes(key.public.to_pem())
            return key
    deadline = time.monotonic() + 5.0
    try:
        while path.is_file() and path.stat().st_size == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # another process created it an instant ago and is still writing it
        return SigningKey.from_pem(path.read_bytes())
    except IsADirectoryError:
        raise _unusable(path, "it is a directory; it should be the PEM private key file") from None
    except (OSError, ValueError) as exc:
        raise _unusable(path, str(exc)) from None


def _unusable(path: Path, why: str) -> SpecError:
    return SpecError(ENV_KEY_FILE, [Problem(str(path), f"the audit signing key cannot be used: {why}")])


def verify_key(root: Path | str) -> VerifyKey | None:
    """The public key heads of this workspace's log must be signed by; None while the file does not exist
    (before the first append — or after someone deleted it: see ``has_key``)."""
    path = public_key_path(root)
    if not path.exists():
        return None
    try:
        return VerifyKey.from_pem(path.read_bytes())
    except IsADirectoryError:
        raise SpecError("audit public key", [Problem(str(path), "a directory; it should be the PEM public key file "
                                                                "(audit-signing.pub.pem)")]) from None
    except (OSError, ValueError) as exc:
        raise SpecError("audit public key", [Problem(str(path), str(exc))]) from None


def has_key(root: Path | str) -> bool:
    """True when either half of the workspace's audit key exists: records were written to its log."""
    return any(p.exists() or p.is_symlink() for p in (key_path(root), public_key_path(root)))


class WorkspaceAuditKey:
    """The workspace's audit signing key as a ``SigningKeySource``: read when it exists, made on the first append."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._key: SigningKey | None = None

    def get(self, *, create: bool) -> SigningKey | None:
        if self._key is None:
            self._key = signing_key(self.root, create=create)
        return self._key

    def describe(self) -> str:
        return f"audit signing key {key_path(self.root)}"

    def creation_problem(self) -> str | None:
        return (path_problem(key_path(self.root), directory=False)
                or path_problem(public_key_path(self.root), directory=False))


def workspace_log(root: Path | str) -> AuditLog:
    """The workspace's audit log, its head signed with the workspace's audit key (made by the first append)."""
    return AuditLog.in_workspace(root, signing_key=WorkspaceAuditKey(root))
