"""The one shape of every extension point (``sync.strategy.name``, ``model.name``, ``data.name``):
a :class:`Registry` of names a config field may take.

Imports nothing heavy, so a config is checked against the registries before torch loads; each
package keeps its own registry and depends on no other for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def import_path(path: str, key: str) -> Any:
    """What ``"package.module:attr"`` names, imported now; ``ValueError`` naming ``key``."""
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{key}: cannot import {path!r} ({type(e).__name__}: {e})") from e


class Registry(Generic[T]):
    """The values of the config field ``key`` (``sync.strategy.name``), each naming a ``what``
    (``algorithm``), in the order registered.

    With ``by_path``, a value ``"package.module:attr"`` that is not registered names a user's
    own extension and :meth:`get` returns ``by_path(value)``. A renamed value fails naming
    the new one.
    """

    def __init__(self, key: str, what: str, by_path: Callable[[str], T] | None = None) -> None:
        self.key = key
        self.what = what
        self._by_path = by_path
        self._entries: dict[str, T] = {}
        self._renamed: dict[str, str] = {}

    def register(self, name: str, entry: T) -> T:
        """Makes ``name`` a value of :attr:`key`; returns ``entry`` (usable as a decorator's
        body)."""
        if name in self._entries or name in self._renamed:
            raise ValueError(f"{self.key}: {self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def rename(self, old: str, new: str) -> None:
        """Makes the retired value ``old`` fail with an error naming ``new``."""
        self._renamed[old] = new

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry of ``name``; ``ValueError`` naming :attr:`key`, the known values and,
        for a renamed one, its new name."""
        if name in self._entries:
            return self._entries[name]
        if self._by_path is not None and ":" in name:
            return self._by_path(name)
        if name in self._renamed:
            raise ValueError(f"{self.key}: {name!r} was renamed; use {self._renamed[name]!r}")
        hint = ", or an import path 'package.module:attr'" if self._by_path else ""
        raise ValueError(f"{self.key}: unknown {self.what} {name!r}; known: {self.names()}"
                         f"{hint}")
