"""Registries: algorithms, environments and loss regularisers are registered by name with a decorator and found by
that name or by an import path ``"package.module:Name"`` (which imports and registers it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def import_object(path: str, what: str = "object") -> Any:
    """Import ``"package.module:name"``; a ValueError names the path and the cause."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"{path!r} is not an import path; write the {what} as 'package.module:name'")
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {what} {path!r}: {exc}") from exc


class Registry(dict[str, T]):
    """Named classes of one kind (a dict). ``discover`` (optional) imports the built-in ones the first time the
    registry is read, so that a lookup never depends on what happened to be imported before."""

    def __init__(self, kind: str, base: type | None = None, discover: Callable[[], None] | None = None):
        super().__init__()
        self.kind, self.base, self._discover = kind, base, discover
        self._discovered = discover is None

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` under ``name``; a different entry already there is an error."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} needs a non-empty string name to be registered, got {name!r}")
        if dict.get(self, name) not in (None, entry):
            raise ValueError(f"{self.kind} {name!r} is already registered by {dict.__getitem__(self, name)!r}")
        dict.__setitem__(self, name, entry)
        return entry

    def lookup(self, name: str) -> T:
        """The entry registered as ``name``, or imported from ``"package.module:Name"``; a ValueError lists the
        known names."""
        if isinstance(name, str) and ":" in name:
            entry = import_object(name, self.kind)
            if self.base is not None and not (isinstance(entry, type) and issubclass(entry, self.base)):
                raise ValueError(f"{name!r} is not a {self.base.__name__} subclass")
            return entry
        self._discover_once()
        if not dict.__contains__(self, name):
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(dict.keys(self)))}, or an "
                             "import path 'package.module:Name'")
        return dict.__getitem__(self, name)

    def _discover_once(self) -> None:
        if not self._discovered:
            self._discovered = True
            self._discover()

    def __getitem__(self, name: str) -> T:
        return self.lookup(name)

    def __contains__(self, name: object) -> bool:
        self._discover_once()
        return dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        self._discover_once()
        return dict.__iter__(self)

    def keys(self):
        self._discover_once()
        return dict.keys(self)

    def values(self):
        self._discover_once()
        return dict.values(self)

    def items(self):
        self._discover_once()
        return dict.items(self)

    def __len__(self) -> int:
        self._discover_once()
        return dict.__len__(self)
