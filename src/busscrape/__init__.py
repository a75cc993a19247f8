"""busscrape — an event-driven browser-scraping bus over NATS JetStream.

Reading order: settings → errors → subjects → messages (+ steps) → topology/streams → bus →
services (dispatcher, worker, ingester) → cli.
"""

from __future__ import annotations

__version__ = "0.1.0"

from busscrape.errors import BusscrapeError, ConfigurationError, MessageDecodeError, PermanentError, RetryableError
from busscrape.model.messages import ArtifactRef, DeadLetter, ScrapeResult, ScrapeTask, decode, encode
from busscrape.settings import Settings

__all__ = [
    "ArtifactRef",
    "BusscrapeError",
    "ConfigurationError",
    "DeadLetter",
    "MessageDecodeError",
    "PermanentError",
    "RetryableError",
    "ScrapeResult",
    "ScrapeTask",
    "Settings",
    "__version__",
    "decode",
    "encode",
]
