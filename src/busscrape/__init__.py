"""busscrape — an event-driven browser-scraping bus over NATS JetStream.

The public API: ``busscrape.run`` and ``busscrape.crawl`` (``client``: the ``run`` and ``crawl``
commands from Python, pages as they land), and the parts for anyone wiring their own::

    from busscrape import Bus, Dispatcher, Ingester, Settings, Worker

    settings = Settings()
    async with await Bus.connect(settings, name="mine") as bus:
        async with Dispatcher(bus, settings) as dispatcher:
            summary = await dispatcher.dispatch(["https://example.com/"])

The package reads like the data path (see ``docs/architecture.md``): ``dispatch`` → ``bus`` →
``worker`` → ``artifacts`` → ``ingest`` → ``archive``, with ``model`` (the messages), ``net``
(the network policy), ``deadletters``, ``status``, ``search``, ``api``, ``ops`` (running it),
``telemetry`` and ``cli`` beside them.

Names are imported on first use, so ``import busscrape`` (and ``busscrape --help``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Before anything of busscrape imports nats-py or structlog: what they import for features busscrape
# processes seldom use (WebSockets, rich tracebacks), imported on first use.
from busscrape import optional_imports as _optional_imports

_optional_imports.install()

_EXPORTS = {
    "Bus": "busscrape.bus.connection",
    "Dispatcher": "busscrape.dispatch.dispatcher",
    "DispatchSummary": "busscrape.dispatch.dispatcher",
    "TaskDefaults": "busscrape.dispatch.inputs",
    "Worker": "busscrape.worker.daemon",
    "Ingester": "busscrape.ingest.daemon",
    "Settings": "busscrape.settings",
    "open_storage": "busscrape.archive.storage",
    "ArtifactRef": "busscrape.model.messages",
    "DeadLetter": "busscrape.model.messages",
    "ScrapeResult": "busscrape.model.messages",
    "ScrapeTask": "busscrape.model.messages",
    "TaskOptions": "busscrape.model.messages",
    "decode": "busscrape.model.messages",
    "encode": "busscrape.model.messages",
    "BusscrapeError": "busscrape.errors",
    "ConfigurationError": "busscrape.errors",
    "MessageDecodeError": "busscrape.errors",
    "PermanentError": "busscrape.errors",
    "RetryableError": "busscrape.errors",
    "run": "busscrape.client",
    "Page": "busscrape.dataset.pages",
    "Run": "busscrape.client",
    "Summary": "busscrape.client.summary",
}

__all__ = [
    "ArtifactRef",
    "Bus",
    "BusscrapeError",
    "ConfigurationError",
    "DeadLetter",
    "DispatchSummary",
    "Dispatcher",
    "Ingester",
    "MessageDecodeError",
    "Page",
    "PermanentError",
    "RetryableError",
    "Run",
    "ScrapeResult",
    "ScrapeTask",
    "Settings",
    "Summary",
    "TaskDefaults",
    "TaskOptions",
    "Worker",
    "__version__",
    "crawl",
    "decode",
    "encode",
    "open_storage",
    "run",
]


def __getattr__(name: str) -> Any:
    if name == "crawl":
        # Also the crawling subpackage's name: the package itself is callable (``crawl/__init__``),
        # so ``busscrape.crawl(...)`` works whether or not the subpackage was imported first.
        return importlib.import_module("busscrape.crawl")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'busscrape' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from busscrape.archive.storage import open_storage
    from busscrape.bus.connection import Bus
    from busscrape.client import Run, crawl, run
    from busscrape.client.summary import Summary
    from busscrape.dataset.pages import Page
    from busscrape.dispatch.dispatcher import Dispatcher, DispatchSummary
    from busscrape.dispatch.inputs import TaskDefaults
    from busscrape.errors import BusscrapeError, ConfigurationError, MessageDecodeError, PermanentError, RetryableError
    from busscrape.ingest.daemon import Ingester
    from busscrape.model.messages import ArtifactRef, DeadLetter, ScrapeResult, ScrapeTask, TaskOptions, decode, encode
    from busscrape.settings import Settings
    from busscrape.worker.daemon import Worker
