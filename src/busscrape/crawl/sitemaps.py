"""Sitemap seeds (``--sitemaps``): ultimate-sitemap-parser reads index files, gzip, plain-text and
robots-declared sitemaps; every request it makes, redirects included, passes the network policy
first (a URL it refuses is as unreachable as a 404 to the parser).

The parser is synchronous, so it runs in a thread; the policy (a coroutine: it resolves names)
is asked on the caller's loop.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import requests
from usp.tree import sitemap_tree_for_homepage
from usp.web_client.requests_client import RequestsWebClient

from busscrape.errors import BusscrapeError
from busscrape.net.policy import NetworkPolicy

MAX_SITEMAP_URLS = 100_000  # seeds taken from one crawl's sitemaps


class _CheckedSession(requests.Session):
    """A session that asks the network policy before every request it sends (each redirect hop too)."""

    def __init__(self, policy: NetworkPolicy, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.trust_env = False  # no proxy from the environment: the policy is the way out
        self._policy, self._loop = policy, loop

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        try:
            asyncio.run_coroutine_threadsafe(self._policy.check_url(request.url or ""), self._loop).result(30)
        except BusscrapeError as exc:
            raise requests.exceptions.InvalidURL(f"refused by the network policy: {exc}") from None
        return super().send(request, **kwargs)


async def sitemap_urls(seeds: tuple[str, ...] | list[str], policy: NetworkPolicy,
                       since: datetime | None = None) -> list[str]:
    """The page URLs of the sitemaps of every seed's site (robots-declared and the known paths),
    those modified at or after ``since`` when given (pages without a ``lastmod`` are kept)."""
    loop = asyncio.get_running_loop()

    def read(homepage: str) -> list[str]:
        tree = sitemap_tree_for_homepage(homepage, web_client=RequestsWebClient(session=_CheckedSession(policy, loop)))
        out = []
        for page in tree.all_pages():
            modified = page.last_modified
            if since is not None and modified is not None:
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=since.tzinfo)
                if modified < since:
                    continue
            out.append(page.url)
            if len(out) >= MAX_SITEMAP_URLS:
                break
        return out

    urls: list[str] = []
    for home in dict.fromkeys(seeds):
        urls.extend(await asyncio.to_thread(read, home))
    return list(dict.fromkeys(urls))[:MAX_SITEMAP_URLS]
