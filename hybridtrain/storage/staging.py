"""Staging: temporary files and directories beside their target, named by their writer, and the ones a killed writer left.

A file is written whole or not at all by writing a temporary beside it and renaming it into place;
a ``kill`` or ``kill -9`` between the two leaves the temporary behind (Python does not unwind on
SIGTERM), and at 10 million rows that is gigabytes nobody removes. So a staged name carries its
writer — ``.tmp-<host>-<pid>-<random>`` (after an optional ``tag``) — and every new write first removes
the entries this host's dead writers left in the same directory. Another host's entries (a shared
filesystem) and a live process's are never touched; a reused pid only keeps a leftover a little longer.

Example: ``data generate`` killed mid-write leaves ``data/raw/.tmp-gpu1-4711-k2j9.csv``; the next
``data generate`` on gpu1 finds pid 4711 gone and removes it before writing its own.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

PREFIX = ".tmp-"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _prefix(tag: str) -> str:
    return f"{tag}{PREFIX}{_host()}-{os.getpid()}-"


def sweep(directory: Path, tag: str = "") -> list[Path]:
    """Remove the staged entries of ``directory`` (files or directories named ``<tag>.tmp-<this host>-<pid>-…``)
    whose writer is no longer running; returns what was removed. Never raises for what it cannot remove."""
    pattern = re.compile(rf"^{re.escape(tag + PREFIX + _host())}-(\d+)-")
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except OSError:
            pass
    return removed


def staged_file(directory: Path, *, suffix: str = "", tag: str = "") -> tuple[int, Path]:
    """A new temporary file in ``directory`` (``os.open`` descriptor and path), after sweeping dead writers' ones."""
    sweep(directory, tag)
    fd, name = tempfile.mkstemp(dir=directory, prefix=_prefix(tag), suffix=suffix)
    return fd, Path(name)


def staged_dir(directory: Path, *, tag: str = "") -> Path:
    """A new temporary directory in ``directory``, after sweeping dead writers' ones."""
    sweep(directory, tag)
    return Path(tempfile.mkdtemp(dir=directory, prefix=_prefix(tag)))
