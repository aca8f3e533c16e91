"""PluginRegistry: implementations chosen by the name used in YAML, with a declared default.

One registry per pluggable concept (promotion gates, release target kinds): implementations
register under their YAML name; ``get(None)`` gives the default; an unknown name is refused
with the valid ones listed::

    TARGET_KINDS = PluginRegistry("release target kind", default="directory")

    @TARGET_KINDS.register("directory")
    class DirectoryTarget: ...

    TARGET_KINDS.get("s4")  # SpecError: unknown release target kind 's4'; choose one of: directory (default), object_store
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from hybridtrain.errors import Problem, SpecError

T = TypeVar("T")


class PluginRegistry(Generic[T]):
    """Named implementations of one concept, in registration order."""

    def __init__(self, what: str, default: str | None = None):
        self.what = what
        self.default = default
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    @property
    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def unknown_message(self, name: str) -> str:
        valid = ", ".join(f"{n} (default)" if n == self.default else n for n in self._items)
        return f"unknown {self.what} {name!r}; choose one of: {valid}"

    def get(self, name: str | None = None) -> T:
        """The implementation registered as ``name`` (``None``: the default); ``SpecError`` when unknown."""
        key = name if name is not None else self.default
        if key is None:
            raise ValueError(f"{self.what} has no default; give a name")
        if key not in self._items:
            raise SpecError(self.what, [Problem(self.what.replace(" ", "_"), self.unknown_message(key))])
        return self._items[key]
