"""The ``busscrape`` command line: thin wrappers that parse flags, build settings and run a service.

Each command group lives in its own module and registers itself on ``app``; ``main`` is the
console-script entry point. Exit codes are documented in ``busscrape --help`` and docs/exit-codes.md.
"""

from __future__ import annotations

from busscrape.cli.app import app, main

# Importing the command modules registers their commands.
from busscrape.cli import streams as _streams  # noqa: F401  isort: skip
from busscrape.cli import dispatch as _dispatch  # noqa: F401  isort: skip
from busscrape.cli import ingester as _ingester  # noqa: F401  isort: skip
from busscrape.cli import worker as _worker  # noqa: F401  isort: skip
from busscrape.cli import run as _run  # noqa: F401  isort: skip
from busscrape.cli import crawl as _crawl  # noqa: F401  isort: skip
from busscrape.cli import demo as _demo  # noqa: F401  isort: skip
from busscrape.cli import status as _status  # noqa: F401  isort: skip
from busscrape.cli import dlq as _dlq  # noqa: F401  isort: skip
from busscrape.cli import task as _task  # noqa: F401  isort: skip
from busscrape.cli import search as _search  # noqa: F401  isort: skip
from busscrape.cli import api as _api  # noqa: F401  isort: skip
from busscrape.cli import config as _config  # noqa: F401  isort: skip
from busscrape.cli import extractors as _extractors  # noqa: F401  isort: skip
from busscrape.cli import wacz as _wacz  # noqa: F401  isort: skip
from busscrape.cli import sessions as _sessions  # noqa: F401  isort: skip

__all__ = ["app", "main"]
