"""The ``busscrape`` command line: thin wrappers that parse flags, build settings and run a service.

Each command group lives in its own module and registers itself on ``app``; ``main`` is the
console-script entry point. Exit codes are documented in ``busscrape --help`` and the README.
"""

from __future__ import annotations

from .app import app, main

# Importing the command modules registers their commands.
from . import streams as _streams  # noqa: F401  isort: skip
from . import dispatch as _dispatch  # noqa: F401  isort: skip
from . import ingester as _ingester  # noqa: F401  isort: skip
from . import worker as _worker  # noqa: F401  isort: skip
from . import run as _run  # noqa: F401  isort: skip
from . import demo as _demo  # noqa: F401  isort: skip
from . import status as _status  # noqa: F401  isort: skip
from . import dlq as _dlq  # noqa: F401  isort: skip
from . import task as _task  # noqa: F401  isort: skip
from . import search as _search  # noqa: F401  isort: skip
from . import api as _api  # noqa: F401  isort: skip

__all__ = ["app", "main"]
