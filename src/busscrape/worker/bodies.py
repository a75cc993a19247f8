"""One fetch of each response body for every recorder of a page.

The HAR (with ``har_content: embed``) and the WARC both keep response bodies. Each fetch is a CDP
round trip (``Network.getResponseBody``) and a copy of the body out of the browser, on the page's
critical path while it settles; fetched once per recorder, a page with both paid it twice (#39).
A body is held here only until every recorder that wants it is done with it.
"""

from __future__ import annotations

import asyncio

from playwright.async_api import Response


class ResponseBodies:
    """The bodies of one page's responses, fetched once for ``readers`` recorders."""

    def __init__(self, readers: int) -> None:
        self.readers = readers
        self.fetched = 0
        """Bodies fetched from the browser (for the tests: one per response, however many read it)."""
        self._fetches: dict[Response, asyncio.Future[bytes]] = {}
        self._done: dict[Response, int] = {}

    async def read(self, response: Response) -> bytes:
        """The body, fetched by the first reader that asks; the others wait for the same fetch."""
        if self.readers == 1:
            self.fetched += 1
            return await response.body()
        fetch = self._fetches.get(response)
        if fetch is None:
            self.fetched += 1
            fetch = self._fetches[response] = asyncio.ensure_future(response.body())
        # One reader cancelled (its recorder detached) must not cancel the fetch another awaits.
        return await asyncio.shield(fetch)

    def done(self, response: Response) -> None:
        """A recorder is finished with this response, whether it read the body or not; the last one
        lets it go (a body no recorder still wants is not held for the rest of the page)."""
        count = self._done.get(response, 0) + 1
        if count < self.readers:
            self._done[response] = count
            return
        self._done.pop(response, None)
        fetch = self._fetches.pop(response, None)
        if fetch is not None and not fetch.done():
            fetch.add_done_callback(_consume)


def _consume(fetch: asyncio.Future[bytes]) -> None:
    # A fetch nobody awaits any more still ends; its error must not be logged as "never retrieved".
    if not fetch.cancelled():
        fetch.exception()
