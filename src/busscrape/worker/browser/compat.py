"""Where Playwright's type hints say less than its API does, in one place.

Playwright types ``Page.on`` with one overload per event name, each a string literal: a listener
whose event is held in a variable (the recorders hand theirs over as ``(event, handler)`` pairs, to
be removed when the task leaves the tab) matches none of them, though the call is the same. And
``BrowserContext.storage_state()`` returns a ``TypedDict``, which a type checker will not let stand
for the JSON object a stored session keeps (``worker.sessions.Stored.state``), though it is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from playwright.async_api import BrowserContext, Page


def listen(page: Page, event: str, handler: Callable[..., Any]) -> None:
    """``page.on(event, handler)`` for an event named at run time."""
    cast(Any, page).on(event, handler)


async def storage_state(context: BrowserContext) -> dict[str, Any]:
    """The context's cookies and local storage, as the JSON object Playwright sends."""
    return cast(dict[str, Any], await context.storage_state())
