"""AuditKey: the Ed25519 key that signs the audit log's head, kept apart from the log it vouches for.

The log lives in ``.hybridtrain/audit/``; its signing key is a PEM file elsewhere —
``HYBRIDTRAIN_AUDIT_KEY_FILE`` when set (a mounted secret, another host's share), else
``.hybridtrain/keys/audit-signing.pem`` (mode 0600 in a 0700 directory) — and its public half
``audit-signing.pub.pem`` beside it is what ``hybridtrain audit verify`` checks the head against.
Someone who can rewrite the log and its head file but cannot read this key can no longer make a
rewritten chain verify: the head they write is unsigned or signed by another key.

The key is made when a writer first opens a workspace's log (never at import time), so every writer
of one workspace — the flow's stages, ``hybridtrain rollback`` / ``retire`` — signs with the
same key.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hybridtrain.errors import Problem, SpecError
from hybridtrain.governance.audit_log import AuditLog
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


def signing_key(root: Path | str) -> SigningKey:
    """The workspace's audit signing key, created (0600) on first use; ``SpecError`` if the file is unusable."""
    path = key_path(root)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = SigningKey.generate()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(key.to_pem())
                fh.flush()
                os.fsync(fh.fileno())
            public_key_path(root).write_bytes(key.public.to_pem())
            return key
    deadline = time.monotonic() + 5.0
    while path.stat().st_size == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # another process created it an instant ago and is still writing it
    try:
        return SigningKey.from_pem(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SpecError(ENV_KEY_FILE, [Problem(str(path), f"the audit signing key cannot be used: {exc}")]) from None


def verify_key(root: Path | str) -> VerifyKey | None:
    """The public key heads of this workspace's log must be signed by; None before the first append."""
    path = public_key_path(root)
    if not path.is_file():
        return None
    try:
        return VerifyKey.from_pem(path.read_bytes())
    except ValueError as exc:
        raise SpecError("audit public key", [Problem(str(path), str(exc))]) from None


def workspace_log(root: Path | str) -> AuditLog:
    """The workspace's audit log, its head signed with the workspace's audit key."""
    return AuditLog.in_workspace(root, signing_key=signing_key(root))
