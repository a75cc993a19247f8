"""robots.txt: fetched once per origin per crawl through the network policy (``net.checked``: the
connection goes to the address the policy checked), cached fleet-wide in CRAWLS, read with
Protego (Google's rules: wildcards, longest match, Allow over Disallow on ties). Within a process
the asks of one (crawl, origin) share one load: seeding 3,000 sitemap URLs of one site asks once
(each asking on its own fetched robots.txt 3,000 times at once, and timed them all out).

As Google documents it: a 2xx body is the rules; a 4xx (no robots.txt) allows everything; a 5xx,
a timeout or a refused connection means "try again later" (``RobotsUnavailable``, retryable:
the page whose links need it is retried, nothing is queued meanwhile). A cached copy older than
``ROBOTS_TTL`` is fetched again. ``Crawl-delay`` is handed to the worker's per-host pacing
(``Worker._obey_crawl_delay`` → ``HostRules.raise_delay``, fleet-wide through ``fleet_gate``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from protego import Protego

from busscrape.crawl.state import CrawlState
from busscrape.errors import PolicyBlocked, RetryableError, said
from busscrape.lru import Lru
from busscrape.net import checked
from busscrape.net.policy import NetworkPolicy

ROBOTS_TTL = 24 * 3600.0  # seconds a fetched robots.txt is used (Google caches it up to a day)
FETCH_TIMEOUT = 10.0
MAX_BYTES = 500 * 1024  # Google reads the first 500 KiB
CACHE_SIZE = 1024  # parsed robots.txt (crawl, origin) one process keeps; the rest are read again from CRAWLS


class RobotsUnavailable(RetryableError):
    """robots.txt answered 5xx or not at all: try the page's links again later."""

    reason = "robots_unavailable"


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.lower()}"


USER_AGENT = "busscrape"
"""What busscrape's own requests (robots.txt, sitemaps) say they are."""


def _key(origin: str) -> str:
    return hashlib.sha256(origin.encode()).hexdigest()[:24]


def _fit(record: dict[str, Any], room: int) -> dict[str, Any]:
    """The record with its body cut to fit a CRAWLS value (``cut``: characters left out). 500 KiB
    of text may grow sixfold as JSON (a control byte is ``\\u0001``): the rules are read as far
    as they fit, as Google reads the first 500 KiB, and the record says so."""
    body = record["body"]
    size = len(orjson.dumps(record))
    while size > room and body:
        body = body[: max(0, len(body) * room // size - 64)]
        size = len(orjson.dumps({**record, "body": body, "cut": len(record["body"]) - len(body)}))
    if len(body) == len(record["body"]):
        return record
    return {**record, "body": body, "cut": len(record["body"]) - len(body)}


class Robots:
    """The robots.txt rules of every origin a crawl meets."""

    def __init__(self, state: CrawlState, policy: NetworkPolicy, user_agent: str = USER_AGENT, *,
                 cache_size: int = CACHE_SIZE) -> None:
        self.state = state
        self.policy = policy
        self.user_agent = user_agent
        self._parsed: Lru[tuple[str, str], tuple[float, Protego]] = Lru(cache_size)
        self._loading: dict[tuple[str, str], asyncio.Future[Protego]] = {}
        """The loads under way, by (crawl, origin): every ask meanwhile awaits the same one."""

    async def rules(self, crawl_id: str, url: str) -> Protego:
        key = (crawl_id, origin_of(url))
        cached = self._parsed.get(key)
        if cached is not None and time.time() - cached[0] < ROBOTS_TTL:
            return cached[1]
        loading = self._loading.get(key)
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(self._load(*key))
            loading.add_done_callback(lambda done: self._loading.pop(key, None))
            loading.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved: not logged
        # Shielded: one asker given up (its task cancelled) does not cancel the others' load.
        return await asyncio.shield(loading)

    async def _load(self, crawl_id: str, origin: str) -> Protego:
        """The rules from CRAWLS, or fetched (and stored there) when not there or too old."""
        now = time.time()
        record = await self.state.robots(crawl_id, _key(origin))
        if record is None or now - record["fetched_at"] >= ROBOTS_TTL:
            record = _fit({"origin": origin, "fetched_at": now, **await self._fetch(origin)},
                          await self.state.room())
            await self.state.save_robots(crawl_id, _key(origin), record)
        parsed = Protego.parse(record["body"])
        self._parsed[(crawl_id, origin)] = (record["fetched_at"], parsed)
        return parsed

    async def allowed(self, crawl_id: str, url: str, agent: str) -> bool:
        return (await self.rules(crawl_id, url)).can_fetch(url, agent)

    async def crawl_delay(self, crawl_id: str, url: str, agent: str) -> float | None:
        delay = (await self.rules(crawl_id, url)).crawl_delay(agent)
        return float(delay) if delay else None

    async def sitemaps(self, crawl_id: str, url: str) -> list[str]:
        return list((await self.rules(crawl_id, url)).sitemaps)

    async def _fetch(self, origin: str) -> dict[str, Any]:
        """``{"status": …, "body": …}``: the rules as text ("" allows everything)."""
        url = origin + "/robots.txt"
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
        try:
            async with checked.session(self.policy, timeout=timeout, headers={"User-Agent": self.user_agent}) as http:
                got = await checked.fetch(http, self.policy, url, MAX_BYTES)
        except PolicyBlocked:
            return {"status": 0, "body": ""}  # its pages are refused by the policy anyway
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RobotsUnavailable(f"{url}: {said(exc)}") from None  # a timeout says nothing
        if 200 <= got.status < 300:
            return {"status": got.status, "body": got.body.decode("utf-8", "replace")}
        if 400 <= got.status < 500 or got.status == 310:  # 310: too many redirects; as Google, no robots.txt
            return {"status": got.status, "body": ""}
        raise RobotsUnavailable(f"{got.url}: HTTP {got.status}")
