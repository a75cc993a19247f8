"""Following a page's links after its result stands, on a real nats-server with a real Chromium
worker: a failure there (robots.txt of a linked host answering 503) is the links' failure, never
the page's. The task is redelivered for its links alone; after its last delivery the crawl
records the page as ``follow_failed``, and the page, archived, is never dead-lettered."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from aiohttp import web

from busscrape.bus import names, provision, topology
from busscrape.crawl.run import start_crawl
from busscrape.crawl.spec import CrawlSpec, crawl_task_id
from busscrape.crawl.state import CrawlState
from busscrape.status.records import StatusBoard
from busscrape.worker.daemon import Worker
from tests.conftest import make_settings
from tests.support.bus import count, dead_letters, results, wait_until

pytestmark = pytest.mark.browser


def install(site, *, robots_failures: int, seed_failures: int = 0) -> Counter[str]:
    """Host 0's index links to host 1's /x. Host 1's robots.txt answers 503 ``robots_failures``
    times first; the index answers 503 ``seed_failures`` times first. The counts of each."""
    asked: Counter[str] = Counter()

    @site.route("/")
    async def index(request: web.Request) -> web.StreamResponse:
        asked["/"] += 1
        if asked["/"] <= seed_failures:
            return web.Response(status=503, text="busy")
        return web.Response(text=f"<html><title>i</title><a href='{site.url('/x', host=1)}'>x</a></html>",
                            content_type="text/html")

    @site.route("/robots.txt")
    async def robots(request: web.Request) -> web.StreamResponse:
        if request.host.split(":")[0] != site.hosts[1]:
            return web.Response(status=404)
        asked["robots"] += 1
        if asked["robots"] <= robots_failures:
            return web.Response(status=503, text="down")
        return web.Response(text="User-agent: *\nAllow: /\n", content_type="text/plain")

    site.page("/x", "<html><title>x</title><body>leaf</body></html>")
    return asked


def settings_for(tmp_path, nats_url, site, max_deliver: int):
    return make_settings(tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]},
                         worker={"concurrency": 1, "navigation_timeout": "5s", "retry_base_delay": "200ms",
                                 "retry_max_delay": "1s"},
                         streams={"worker_max_deliver": max_deliver})


async def crawl_until(bus, settings, spec, done, worker_settings=None) -> None:
    """Apply the streams and start the crawl with ``settings``; run a worker (``worker_settings``,
    the same by default) until ``done``."""
    await provision.apply(bus.js, topology.load(settings))
    await start_crawl(bus, settings, spec)
    async with Worker(bus, (worker_settings or settings).with_overrides(worker={"exit_when_idle": "1h"})) as worker:
        running = asyncio.create_task(worker.run())
        try:
            await wait_until(done, timeout=90)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 60)


async def test_links_that_cannot_be_followed_yet_are_followed_on_the_redelivery(bus, tmp_path, nats_url, site):
    asked = install(site, robots_failures=2)
    settings = settings_for(tmp_path, nats_url, site, max_deliver=4)
    spec = CrawlSpec(seeds=(site.url("/"),), scope="any", depth=1)
    state = CrawlState(bus.js)
    leaf = crawl_task_id(spec.crawl_id, site.url("/x", host=1))

    async def leaf_followed() -> bool:
        return await state.page(spec.crawl_id, leaf) is not None

    await crawl_until(bus, settings, spec, leaf_followed)
    index = await state.page(spec.crawl_id, crawl_task_id(spec.crawl_id, site.url("/")))
    assert index["queued"] == [leaf] and index["counts"]["queued"] == 1
    assert asked["robots"] == 3 and asked["/"] == 1  # the page was rendered once: only its links were retried
    assert sorted(r.url for r in await results(bus.js)) == [site.url("/"), site.url("/x", host=1)]
    assert await dead_letters(bus.js) == []
    assert await count(bus.js, names.TASKS_STREAM) == 0


@pytest.mark.parametrize("seed_failures", [0, 1], ids=["redelivered", "rendered-on-the-last-delivery"])
async def test_links_never_followable_are_a_follow_failure_of_the_crawl_not_a_dead_page(bus, tmp_path, nats_url,
                                                                                       site, seed_failures):
    install(site, robots_failures=1000, seed_failures=seed_failures)
    settings = settings_for(tmp_path, nats_url, site, max_deliver=2)
    spec = CrawlSpec(seeds=(site.url("/"),), scope="any", depth=1)
    state = CrawlState(bus.js)
    index = crawl_task_id(spec.crawl_id, site.url("/"))

    async def acked() -> bool:
        return await count(bus.js, names.TASKS_STREAM) == 0

    await crawl_until(bus, settings, spec, acked)
    assert await dead_letters(bus.js) == []  # the page is archived, not dead
    record = await state.page(spec.crawl_id, index)
    assert record["not_followed"] == "follow_failed" and record["error"].startswith("robots_unavailable")
    assert record["counts"] == {"discovered": 1, "queued": 0, "follow_failed": 1} and record["queued"] == []
    assert [r.url for r in await results(bus.js)] == [site.url("/")]
    history = await StatusBoard(bus.js).history(index)
    assert "dead" not in {s.state for s in history}
    assert await state.links(spec.crawl_id, index) is None


async def test_a_permanent_follow_failure_is_recorded_on_the_crawl_and_the_archived_page_acked(bus, tmp_path,
                                                                                              nats_url, site):
    """A follow that fails for good (here a CRAWLS write over its size, ``PayloadTooLarge``, as
    ``bus.payloads`` raises before a write the server would refuse) after the page's result
    stands: the crawl records ``follow_failed`` and the task is acked on its first delivery.
    Before, the worker dead-lettered the archived page (``payload_too_large``)."""
    from busscrape.errors import PayloadTooLarge

    install(site, robots_failures=0)
    settings = settings_for(tmp_path, nats_url, site, max_deliver=3)
    spec = CrawlSpec(seeds=(site.url("/"),), scope="any", depth=1)
    state = CrawlState(bus.js)
    index = crawl_task_id(spec.crawl_id, site.url("/"))
    await provision.apply(bus.js, topology.load(settings))
    await start_crawl(bus, settings, spec)
    async with Worker(bus, settings.with_overrides(worker={"exit_when_idle": "1h"})) as worker:
        async def too_large(*args: object, **kwargs: object) -> bool:
            raise PayloadTooLarge("CRAWLS value of 2000000 bytes, over 1048576")

        worker.frontier.follow = too_large  # type: ignore[method-assign]  # the fault, in the crawl code only
        running = asyncio.create_task(worker.run())

        async def acked() -> bool:
            return await count(bus.js, names.TASKS_STREAM) == 0

        try:
            await wait_until(acked, timeout=90)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 60)
    assert await dead_letters(bus.js) == []  # the page is archived, not dead
    assert [r.url for r in await results(bus.js)] == [site.url("/")]
    record = await state.page(spec.crawl_id, index)
    assert record["not_followed"] == "follow_failed" and record["error"].startswith("payload_too_large"), record
    assert worker.counters.get("completed") == 1 and "retried" not in worker.counters, worker.counters
