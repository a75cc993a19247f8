"""Starting a crawl and waiting for its end (``busscrape crawl``, ``POST /crawls``).

``start_crawl`` stores the rules and queues the seeds (and the sitemaps' URLs); it is what
``--detach`` and the API do. ``crawl_until_done`` also follows the crawl until every page it
queued is archived or dead-lettered and every archived page's links are followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.crawl.frontier import Frontier
from busscrape.crawl.progress import CrawlSummary, CrawlWatch
from busscrape.crawl.sitemaps import sitemap_urls
from busscrape.crawl.spec import CrawlSpec
from busscrape.crawl.state import SEEDS
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import Settings
from busscrape.status.tracker import Tracker

CRAWL_NEEDS: frozenset[names.Need] = frozenset({("kv", names.CRAWLS_BUCKET), *names.DISPATCH_NEEDS})


async def start_crawl(bus: Bus, settings: Settings, spec: CrawlSpec) -> dict[str, Any]:
    """Store the crawl and queue its seeds; the seed record (what the seeds became)."""
    await provision.require(bus.js, topology.load(settings), CRAWL_NEEDS)
    policy = NetworkPolicy.from_settings(settings.network.allow)
    frontier = Frontier(bus.js, settings, policy)
    if await frontier.state.page(spec.crawl_id, SEEDS) is not None:
        return await frontier.seed(spec)  # resumed: seeded before
    extra: list[str] = []
    if spec.sitemaps:
        extra = await sitemap_urls(spec.seeds, policy, spec.sitemap_since)
    return await frontier.seed(spec, extra)


async def crawl_until_done(bus: Bus, settings: Settings, spec: CrawlSpec, tracker: Tracker, stop: asyncio.Event,
                           report: Callable[[], None] | None = None) -> CrawlSummary:
    """Start (or resume) the crawl and wait until it is done or ``stop`` is set."""
    await provision.require(bus.js, topology.load(settings), CRAWL_NEEDS)
    watch = CrawlWatch(Frontier(bus.js, settings, NetworkPolicy.from_settings([])).state, tracker, spec.crawl_id)
    await watch.start()
    try:
        watch.see(SEEDS, await start_crawl(bus, settings, spec))
        while not watch.done and not stop.is_set():
            await tracker.changed(timeout=0.5)
            if report is not None:
                report()
        return await watch.summary()
    finally:
        await watch.stop()
