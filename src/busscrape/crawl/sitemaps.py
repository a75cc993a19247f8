"""Sitemap seeds (``--sitemaps``): ultimate-sitemap-parser reads index files, gzip, plain-text and
robots-declared sitemaps; every request it makes goes through ``net.checked`` (the policy asked
on every redirect hop, the connection made to the address it checked): a URL it refuses is as
unreachable as a 404 to the parser.

The parser is synchronous, so it runs in a thread; its web client hands each fetch to the
caller's loop, where the checked session lives.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from http import HTTPStatus
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
from busscrape.errors import BusscrapeError
from busscrape.net import checked
from busscrape.net.policy import NetworkPolicy

MAX_SITEMAP_URLS = 100_000  # seeds taken from one crawl's sitemaps
MAX_SITEMAP_BYTES = 100 * 1024 * 1024  # one sitemap file, when the parser sets no limit
FETCH_TIMEOUT = 60.0


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

    def __init__(self, http: aiohttp.ClientSession, policy: NetworkPolicy, loop: asyncio.AbstractEventLoop) -> None:
        self._http, self._policy, self._loop = http, policy, loop
        self._max = MAX_SITEMAP_BYTES

    def set_max_response_data_length(self, max_response_data_length: int | None) -> None:
        self._max = max_response_data_length or MAX_SITEMAP_BYTES

    def get(self, url: str) -> AbstractWebClientResponse:
        work = checked.fetch(self._http, self._policy, url, self._max)
        try:
            got = asyncio.run_coroutine_threadsafe(work, self._loop).result(FETCH_TIMEOUT + 5)
        except BusscrapeError as exc:
            return _Failed(f"refused by the network policy: {exc}", retryable=False)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return _Failed(f"{url}: {exc or type(exc).__name__}", retryable=isinstance(exc, TimeoutError))
        if 200 <= got.status < 300:
            return _Fetched(got)
        return _Failed(f"{got.status} {got.reason}", retryable=got.status in RETRYABLE_HTTP_STATUS_CODES)


async def sitemap_urls(seeds: tuple[str, ...] | list[str], policy: NetworkPolicy,
                       since: datetime | None = None) -> list[str]:
    """The page URLs of the sitemaps of every seed's site (robots-declared and ``/sitemap.xml``),
    those modified at or after ``since`` when given (pages without a ``lastmod`` are kept)."""
    loop = asyncio.get_running_loop()
    http = checked.session(policy, timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT),
                           headers={"User-Agent": USER_AGENT})

    def read(homepage: str) -> list[str]:
        client = _CheckedClient(http, policy, loop)
        # The robots-declared sitemaps and /sitemap.xml only: the parser's own guesses (a dozen
        # more paths, /admin/config/search/xmlsitemap …) are requests no site asked for.
        tree = sitemap_tree_for_homepage(homepage, web_client=client, use_known_paths=False)
        trees = [tree]
        known = urljoin(strip_url_to_homepage(homepage), "/sitemap.xml")
        if known not in {sitemap.url for sitemap in tree.all_sitemaps()}:
            guessed = SitemapFetcher(known, recursion_level=0, web_client=client, quiet_404=True).sitemap()
            if not isinstance(guessed, InvalidSitemap):
                trees.append(guessed)
        out = []
        for page in (page for tree in trees for page in tree.all_pages()):
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
    async with http:
        for home in dict.fromkeys(seeds):
            urls.extend(await asyncio.to_thread(read, home))
    return list(dict.fromkeys(urls))[:MAX_SITEMAP_URLS]
