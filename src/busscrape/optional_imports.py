"""Optional packages that two libraries import when they are imported, imported on first use.

Two of busscrape's libraries import an optional package at import time for a feature most
busscrape processes never use:

- nats-py's ``nats/aio/transport.py`` imports aiohttp and multidict for its WebSocket transport
  (``ws://`` server URLs): ~0.1 s of CPU (aiohttp builds two SSL contexts at import), in every
  process that talks to NATS, though most only ever connect over TCP;
- structlog's ``structlog/dev.py`` and ``structlog/tracebacks.py`` import rich for the tracebacks
  of its console renderer and the locals of its JSON tracebacks: ~45 ms of CPU in every process
  that logs, though most log no traceback at all.

In the cold start of ``busscrape run`` three such processes start beside Chromium on two cores,
so that CPU is paid two or three times over on the first page's path, and once more by every
command. ``install()``, run by ``import busscrape``, makes those two modules import stand-ins,
which import the real package on first use: a WebSocket connection and a rich traceback work
as before, and a process that never needs them never loads them. Nothing else sees the
stand-ins: they are what ``import`` gives those modules' own code (each module's namespace gets
an ``__import__`` of its own), not entries of ``sys.modules``, so no other import, in any
thread, is affected. A process that imported the package before gets the real one there too,
and a library release that moves the import just loads the package as before.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # importlib.abc imports importlib.resources and tempfile: 10 ms in every command's start
    from importlib.abc import Loader

ON_FIRST_USE: dict[str, frozenset[str]] = {
    "nats.aio.transport": frozenset({"aiohttp", "multidict"}),
    "structlog.dev": frozenset({"rich", "rich.console", "rich.traceback"}),
    "structlog.tracebacks": frozenset({"rich", "rich.pretty"}),
}
"""The module, and what it imports that it gets on first use instead."""


class _OnFirstUse:
    """Stands for a package (``import rich``, ``import rich.pretty``: the name bound is the
    package's) until an attribute of it is read; then the module named is imported."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._package: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._package is None:  # once: nats-py reads aiohttp's names for every WebSocket frame
            importlib.import_module(self._name)
            self._package = sys.modules[self._name.partition(".")[0]]
        return getattr(self._package, attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


class _NameOnFirstUse:
    """Stands for a name of a module (``from rich.console import Console``) until it is called
    or an attribute of it is read."""

    def __init__(self, module: str, name: str) -> None:
        self._module = module
        self._name = name

    def _real(self) -> Any:
        return getattr(importlib.import_module(self._module), self._name)  # rich's tracebacks: seldom

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._real(), attr)

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}, imported on first use>"


class _NamesOnFirstUse:
    """What ``from MODULE import NAME`` imports: each name a ``_NameOnFirstUse``."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> _NameOnFirstUse:
        return _NameOnFirstUse(self._module, name)


def _deferring(deferred: frozenset[str]) -> Any:
    def import_(name: str, globals: Mapping[str, object] | None = None, locals: Mapping[str, object] | None = None,
                fromlist: Sequence[str] | None = (), level: int = 0) -> Any:
        if level == 0 and name in deferred and name not in sys.modules:
            return _NamesOnFirstUse(name) if fromlist else _OnFirstUse(name)
        return builtins.__import__(name, globals, locals, fromlist or (), level)

    return import_


class _Loader:
    """The module's own loader, run with an ``__import__`` that defers ``deferred``."""

    def __init__(self, loader: Loader, deferred: frozenset[str]) -> None:
        self._loader = loader
        self._deferred = deferred

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _deferring(self._deferred)}
        self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename …: the file loader's
        return getattr(self._loader, name)


class _Finder:
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        deferred = ON_FIRST_USE.get(fullname)
        if deferred is None:
            return None
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = cast("Loader", _Loader(spec.loader, deferred))
        return spec


def install() -> None:
    """Defer those imports for the modules not loaded yet (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
