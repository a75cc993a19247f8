"""Sitemap seeds (``--sitemaps``): ultimate-sitemap-parser reads index files, gzip, plain-text and
robots-declared sitemaps; every request it makes goes through ``net.checked`` (the policy asked
on every redirect hop, the connection made to the address it checked): a URL it refuses is as
unreachable as a 404 to the parser.

The parser is synchronous, so it runs in a thread; its web client hands each fetch to the
caller's loop, where the checked session lives.

What a crawl's sitemaps may cost is bounded (``dispatch.sitemap_max_urls``, ``_max_files``,
``_max_bytes`` per file) and what the bounds cut is said (``SitemapSeeds.record``, kept in the
crawl's seed record): a crawl seeded from 3,000 of a site's 300,000 URLs says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import urljoin

import aiohttp
from usp.fetch_parse import SitemapFetcher
from usp.helpers import strip_url_to_homepage
from usp.objects.sitemap import InvalidSitemap
from usp.tree import sitemap_tree_for_homepage
from usp.web_client.abstract_client import (
    RETRYABLE_HTTP_STATUS_CODES,
    AbstractWebClient,
    AbstractWebClientResponse,
    AbstractWebClientSuccessResponse,
    WebClientErrorResponse,
)

from busscrape.crawl.robots import USER_AGENT
from busscrape.errors import BusscrapeError, said
from busscrape.net import checked
from busscrape.net.policy import NetworkPolicy

FETCH_TIMEOUT = 60.0
MAX_NAMED = 20  # truncated files named in the record (the count holds them all)


@dataclass(frozen=True)
class SitemapLimits:
    urls: int = 100_000
    files: int = 1000
    bytes: int = 50 * 1024 * 1024


@dataclass
class SitemapSeeds:
    """The URLs a crawl's sitemaps gave, and what the limits cut."""

    urls: list[str] = field(default_factory=list)
    files: int = 0
    """Sitemap files fetched."""
    urls_cut: int = 0
    files_cut: int = 0
    truncated: list[str] = field(default_factory=list)
    """Files read only up to ``SitemapLimits.bytes`` (the first ``MAX_NAMED``)."""
    truncated_count: int = 0

    def record(self) -> dict[str, Any]:
        """What the crawl's seed record says of its sitemaps."""
        return {"urls": len(self.urls), "files": self.files,
                "cut": {"urls": self.urls_cut, "files": self.files_cut, "truncated": self.truncated_count},
                "truncated": self.truncated}


class _Fetched(AbstractWebClientSuccessResponse):
    def __init__(self, got: checked.Fetched) -> None:
        self._got = got
        self._headers = {k.lower(): v for k, v in got.headers.items()}

    def status_code(self) -> int:
        return self._got.status

    def status_message(self) -> str:
        return self._got.reason or HTTPStatus(self._got.status).phrase

    def header(self, case_insensitive_name: str) -> str | None:
        return self._headers.get(case_insensitive_name.lower())

    def raw_data(self) -> bytes:
        return self._got.body

    def url(self) -> str:
        return self._got.url


class _Failed(WebClientErrorResponse):
    pass


class _CheckedClient(AbstractWebClient):
    """The parser's web client: each GET is ``checked.fetch`` on the caller's loop."""

    def __init__(self, http: aiohttp.ClientSession, policy: NetworkPolicy, loop: asyncio.AbstractEventLoop,
                 limits: SitemapLimits, seeds: SitemapSeeds) -> None:
        self._http, self._policy, self._loop = http, policy, loop
        self._limits, self._seeds = limits, seeds
        self._max = limits.bytes

    def set_max_response_data_length(self, max_response_data_length: int | None) -> None:
        self._max = min(max_response_data_length or self._limits.bytes, self._limits.bytes)

    def get(self, url: str) -> AbstractWebClientResponse:
        seeds = self._seeds
        if seeds.files >= self._limits.files:
            seeds.files_cut += 1
            return _Failed(f"not read: over dispatch.sitemap_max_files ({self._limits.files})", retryable=False)
        seeds.files += 1
        work = checked.fetch(self._http, self._policy, url, self._max)
        try:
            got = asyncio.run_coroutine_threadsafe(work, self._loop).result(FETCH_TIMEOUT + 5)
        except BusscrapeError as exc:
            return _Failed(f"refused by the network policy: {exc}", retryable=False)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return _Failed(f"{url}: {said(exc)}", retryable=isinstance(exc, TimeoutError))
        if 200 <= got.status < 300:
            if len(got.body) >= self._max:
                seeds.truncated_count += 1
                if len(seeds.truncated) < MAX_NAMED:
                    seeds.truncated.append(url)
            return _Fetched(got)
        return _Failed(f"{got.status} {got.reason}", retryable=got.status in RETRYABLE_HTTP_STATUS_CODES)


async def sitemap_urls(seeds: tuple[str, ...] | list[str], policy: NetworkPolicy,
                       since: datetime | None = None, limits: SitemapLimits | None = None) -> SitemapSeeds:
    """The page URLs of the sitemaps of every seed's site (robots-declared and ``/sitemap.xml``),
    those modified at or after ``since`` when given (pages without a ``lastmod`` are kept),
    within ``limits``."""
    limits = limits or SitemapLimits()
    loop = asyncio.get_running_loop()
    http = checked.session(policy, timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT),
                           headers={"User-Agent": USER_AGENT})
    found = SitemapSeeds()
    taken: dict[str, None] = {}

    def read(homepage: str) -> None:
        client = _CheckedClient(http, policy, loop, limits, found)
        # The robots-declared sitemaps and /sitemap.xml only: the parser's own guesses (a dozen
        # more paths, /admin/config/search/xmlsitemap …) are requests no site asked for.
        tree = sitemap_tree_for_homepage(homepage, web_client=client, use_known_paths=False)
        trees = [tree]
        known = urljoin(strip_url_to_homepage(homepage), "/sitemap.xml")
        if known not in {sitemap.url for sitemap in tree.all_sitemaps()}:
            guessed = SitemapFetcher(known, recursion_level=0, web_client=client, quiet_404=True).sitemap()
            if not isinstance(guessed, InvalidSitemap):
                trees.append(guessed)
        for page in (page for tree in trees for page in tree.all_pages()):
            modified = page.last_modified
            if since is not None and modified is not None:
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=since.tzinfo)
                if modified < since:
                    continue
            if page.url in taken:
                continue
            if len(taken) >= limits.urls:
                found.urls_cut += 1  # counted, not kept: the parser has them in memory already
                continue
            taken[page.url] = None

    async with http:
        for home in dict.fromkeys(seeds):
            await asyncio.to_thread(read, home)
    found.urls = list(taken)
    return found
