"""nats-py without aiohttp until a WebSocket connection asks for it.

nats-py's ``nats/aio/transport.py`` imports aiohttp and multidict when it is imported, for its
WebSocket transport (``ws://`` server URLs): ~0.1 s of CPU (aiohttp builds two SSL contexts at
import), paid by every busscrape process that talks to NATS, though most only ever connect
over TCP. In the cold start of ``busscrape run`` three such processes start beside Chromium on
two cores, so that tenth of a second is paid two or three times over on the first page's path.

``install()``, run by ``import busscrape``, makes that one module import a stand-in for each of
the two, which imports the real package on first use: a WebSocket connection works as before,
and a process that never opens one never loads aiohttp for nats-py. Nothing else sees the
stand-ins: they are what ``import`` gives that module's own code (its namespace gets an
``__import__`` of its own), not entries of ``sys.modules``, so no other import, in any thread,
is affected. A process that imported aiohttp before nats-py gets the real one there too.
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

TRANSPORT = "nats.aio.transport"
ON_FIRST_USE = ("aiohttp", "multidict")


class _OnFirstUse:
    """Stands for a package until an attribute of it is read, then is a window onto it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


def _import_deferring(name: str, globals: Mapping[str, object] | None = None,
                      locals: Mapping[str, object] | None = None, fromlist: Sequence[str] = (),
                      level: int = 0) -> Any:
    if level == 0 and name in ON_FIRST_USE and not fromlist and name not in sys.modules:
        return _OnFirstUse(name)
    return builtins.__import__(name, globals, locals, fromlist, level)


class _TransportLoader:
    """The transport module's own loader, run with the deferring ``__import__``."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import_deferring}
        self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename …: the file loader's
        return getattr(self._loader, name)


class _TransportFinder:
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != TRANSPORT:
            return None
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = cast("Loader", _TransportLoader(spec.loader))
        return spec


def install() -> None:
    """Defer nats-py's aiohttp, unless its transport module is loaded already (idempotent)."""
    if TRANSPORT not in sys.modules and not any(isinstance(f, _TransportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransportFinder())
