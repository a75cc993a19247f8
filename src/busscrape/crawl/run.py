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
from busscrape.crawl.robots import RobotsUnavailable
from busscrape.crawl.sitemaps import SitemapLimits, sitemap_urls
from busscrape.crawl.spec import CrawlSpec
from busscrape.crawl.state import SEEDS, CrawlState
from busscrape.dispatch.urls import UrlNormaliser, UrlRules
from busscrape.errors import InputError, SeedsUnchecked
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import Settings
from busscrape.status.tracker import Tracker

CRAWL_NEEDS: frozenset[names.Need] = frozenset({("kv", names.CRAWLS_BUCKET), *names.DISPATCH_NEEDS})


def make_spec(settings: Settings, seeds: list[str] | tuple[str, ...], **fields: Any) -> CrawlSpec:
    """A crawl's rules from what a user gave (the CLI's flags, the API's body): seeds normalised
    as the dispatcher normalises; ``InputError`` naming a bad seed, pydantic's ``ValidationError``
    for a bad rule."""
    normalise = UrlNormaliser(UrlRules.from_settings(settings.dispatch))
    normalised = []
    for seed in seeds:
        try:
            normalised.append(normalise(seed))
        except InputError as exc:
            raise InputError(f"seed {seed!r}: {exc}", reason=exc.reason) from None
    return CrawlSpec(seeds=tuple(dict.fromkeys(normalised)), **{k: v for k, v in fields.items() if v is not None})


async def crawl_status(bus: Bus, crawl_id: str) -> CrawlSummary | None:
    """The summary of a crawl as CRAWLS and STATUS have it now (None: no such crawl)."""
    from busscrape.crawl.progress import count_budget, link_depth, summarise
    from busscrape.status.records import StatusBoard

    state = CrawlState(bus.js)
    pages = await state.pages(crawl_id)
    if not pages:
        if await state.stored(crawl_id):  # started, its seeds still being read from its sitemaps
            return CrawlSummary(crawl_id=crawl_id, links={}, by_depth={}, pages_followed=0, seeding=True)
        return None
    summary = summarise(crawl_id, pages)
    await count_budget(state, summary)
    board = StatusBoard(bus.js)
    for key, record in pages.items():
        # A part (``<page>.<n>``) holds more of its head's queued ids: they are at the head's depth.
        head = pages.get(key.rsplit(".", 1)[0], record) if "part" in record else record
        for task_id in record.get("queued") or ():
            latest = await board.latest(task_id)
            outcome = latest[0].state if latest is not None else None
            if outcome in ("archived", "dead"):
                summary.archived += outcome == "archived"
                summary.dead += outcome == "dead"
                done = summary.done_by_depth.setdefault(link_depth(head), {"archived": 0, "dead": 0})
                done[outcome] += 1
    return summary


async def seeding_needed(bus: Bus, settings: Settings, spec: CrawlSpec) -> bool:
    """Check the bus and store the crawl's rules; whether its seeds are still to be queued from
    its sitemaps (then ``start_crawl`` reads them: ``POST /crawls`` does that after answering)."""
    await provision.require(bus.js, topology.load(settings), CRAWL_NEEDS)
    state = CrawlState(bus.js)
    await state.start(spec)
    return spec.sitemaps and await state.page(spec.crawl_id, SEEDS) is None


async def start_crawl(bus: Bus, settings: Settings, spec: CrawlSpec) -> dict[str, Any]:
    """Store the crawl and queue its seeds; the seed record (what the seeds became)."""
    await provision.require(bus.js, topology.load(settings), CRAWL_NEEDS)
    policy = NetworkPolicy.from_settings(settings.network.allow)
    frontier = Frontier(bus.js, settings, policy)
    try:
        if await frontier.state.page(spec.crawl_id, SEEDS) is not None:
            return await frontier.seed(spec)  # resumed: seeded before
        if not spec.sitemaps:
            return await frontier.seed(spec)
        d = settings.dispatch
        found = await sitemap_urls(spec.seeds, policy, spec.sitemap_since,
                                   SitemapLimits(urls=d.sitemap_max_urls, files=d.sitemap_max_files,
                                                 bytes=d.sitemap_max_bytes))
        return await frontier.seed(spec, found.urls, sitemaps=found.record())
    except RobotsUnavailable as exc:
        # Seeding stores nothing until every seed is judged, so the same command again starts the
        # crawl afresh; a page's links, by contrast, are retried by the page's redelivery.
        raise SeedsUnchecked(
            f"crawl {spec.crawl_id}: nothing queued: the robots.txt of a seed could not be read ({exc.message}); "
            "robots.txt is obeyed, so its pages wait until it can be. Run the same command again once the site "
            "answers, or pass --robots ignore") from None


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
