"""The ``run`` and ``crawl`` commands driven from Python (``busscrape.client``), with every rule of
their flags as the command line has it.

The Python API parses its keyword arguments as the command's own flags and invokes the command
while ``EMBEDDED`` is set. Then what would print a usage error and exit 2 raises
``ConfigurationError`` with the same message (``refuse``), and the command, once it has built its
settings and run options, hands them over (``hand_over`` raises ``Handoff``) instead of running
them: the API runs them itself, in the caller's event loop.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

from busscrape.errors import ConfigurationError

if TYPE_CHECKING:
    from busscrape.ops.runner import RunOptions
    from busscrape.settings import Settings

EMBEDDED: ContextVar[bool] = ContextVar("busscrape_embedded", default=False)


class Handoff(Exception):
    """The settings and options a command built, for the API to run."""

    def __init__(self, settings: Settings, options: RunOptions) -> None:
        super().__init__("handoff")
        self.settings = settings
        self.options = options


def active() -> bool:
    return EMBEDDED.get()


def hand_over(settings: Settings, options: RunOptions) -> None:
    """In the API, stop the command here with what it built; on the command line, nothing."""
    if EMBEDDED.get():
        raise Handoff(settings, options)


def refuse(message: str) -> None:
    """In the API, a usage error is ``ConfigurationError`` (on the command line the caller prints
    it and exits 2)."""
    if EMBEDDED.get():
        raise ConfigurationError(message)
