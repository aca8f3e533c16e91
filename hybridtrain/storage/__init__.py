"""Storage: a site's object store behind one interface — keys to bytes, visible only when complete.

``object_store`` is the interface (``ObjectStore``, ``ObjectInfo``, key rules); ``local`` and ``s3``
are its backends; ``open_store`` below opens the one a site's ``store`` config describes.
"""

from __future__ import annotations

from pathlib import Path

from hybridtrain.specs.sites import LocalStore, S3Store
from hybridtrain.storage.local import LocalObjectStore
from hybridtrain.storage.object_store import ObjectInfo, ObjectStore

__all__ = ["LocalObjectStore", "ObjectInfo", "ObjectStore", "open_store"]


def open_store(
    store: LocalStore | S3Store, root: Path, subdir: str = "", *, site: str | None = None
) -> ObjectStore:
    """The ObjectStore a site's ``store`` config describes, under ``subdir``.

    A ``LocalStore`` path is relative to ``root`` (the workspace) unless absolute; an ``S3Store``
    opens an ``S3ObjectStore`` on its bucket and prefix (boto3 is imported only then). ``site``
    names the site in errors.
    """
    if isinstance(store, S3Store):
        # Imported only for an S3 store: boto3 is heavy, and a directory store never needs it.
        from hybridtrain.storage.s3 import S3ObjectStore  # lazy: heavy (boto3)

        return S3ObjectStore(store, subdir, site=site)
    base = Path(store.path)
    base = base if base.is_absolute() else (Path(root) / base).resolve()
    return LocalObjectStore(base / subdir if subdir else base)
