"""The frontier on a real nats-server: discovered links become tasks through SEEN, once; the
budget holds across processes; robots.txt is fetched once per crawl and obeyed; sitemaps seed.
Two ``Frontier`` objects stand for two workers (each has its own connection and caches)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.crawl.frontier import Frontier
from busscrape.crawl.links import PageLinks
from busscrape.crawl.run import start_crawl
from busscrape.crawl.spec import CrawlSpec, crawl_task_id
from busscrape.crawl.state import SEEDS, CrawlState
from busscrape.model.messages import CrawlRef, ScrapeTask, decode
from busscrape.net.policy import NetworkPolicy
from busscrape.worker.politeness import HostGate
from tests.support import crawl_site
from tests.support.bus import stream_messages

HTML = "text/html"


def policy_for(site) -> NetworkPolicy:
    return NetworkPolicy.from_settings([f"{h}/32" for h in site.hosts])


def page_task(spec: CrawlSpec, url: str, depth: int = 1) -> ScrapeTask:
    return ScrapeTask(task_id=crawl_task_id(spec.crawl_id, url), url=url, original_url=url,
                      crawl=CrawlRef(crawl_id=spec.crawl_id, depth=depth, parent=None))


async def seen_tasks(bus: Bus) -> list[ScrapeTask]:
    return [decode(ScrapeTask, m.data) for m in await stream_messages(bus.js, names.SEEN_STREAM) if m.data]


async def two_frontiers(applied: Bus, settings, site):
    other = await Bus.connect(settings, name="second-worker")
    return Frontier(applied.js, settings, policy_for(site)), Frontier(other.js, settings, policy_for(site)), other


async def test_the_same_link_found_by_two_workers_at_once_is_one_task(applied, settings, site):
    crawl_site.install(site)
    spec = CrawlSpec(seeds=(site.url("/"),), robots="ignore")
    one, two, other = await two_frontiers(applied, settings, site)
    try:
        await one.seed(spec)
        links = PageLinks((*(site.url(f"/p/{i}") for i in range(40)), site.url("/p/1#x")), 41, HTML)
        parents = [page_task(spec, site.url(f"/parent/{i}")) for i in range(6)]
        await asyncio.gather(*(f.follow(p, p.url, links) for f, p in zip([one, two] * 3, parents, strict=True)))
    finally:
        await other.close()
    tasks = await seen_tasks(applied)
    urls = [t.url for t in tasks]
    assert len(urls) == len(set(urls)) == 41  # the seed and 40 pages, each once
    records = await one.state.pages(spec.crawl_id)
    queued = [t for key, r in records.items() if key != SEEDS for t in r["queued"]]
    assert len(queued) == len(set(queued)) == 40  # every page queued by exactly one parent
    assert sum(r["counts"]["duplicate"] for key, r in records.items() if key != SEEDS) == 6 * 41 - 40


async def test_max_pages_is_exact_across_workers(applied, settings, site):
    crawl_site.install(site)
    spec = CrawlSpec(seeds=(site.url("/"),), robots="ignore", max_pages=25)
    one, two, other = await two_frontiers(applied, settings, site)
    try:
        await one.seed(spec)
        parents = [page_task(spec, site.url(f"/parent/{i}")) for i in range(8)]
        await asyncio.gather(*(
            f.follow(p, p.url, PageLinks(tuple(site.url(f"/q/{i}/{j}") for j in range(10)), 10, HTML))
            for i, (f, p) in enumerate(zip([one, two] * 4, parents, strict=True))))
    finally:
        await other.close()
    assert len(await seen_tasks(applied)) == 25
    state = CrawlState(applied.js)
    assert await state.used(spec.crawl_id) == 25
    records = await state.pages(spec.crawl_id)
    assert sum(r["counts"]["budget_cut"] for r in records.values()) == 80 - 24


async def test_a_redelivered_page_follows_its_links_once(applied, settings, site):
    crawl_site.install(site)
    spec = CrawlSpec(seeds=(site.url("/"),), robots="ignore", max_pages=10)
    frontier = Frontier(applied.js, settings, policy_for(site))
    await frontier.seed(spec)
    page = page_task(spec, site.url("/a/1"))
    links = PageLinks((site.url("/a/2"), site.url("/b")), 2, HTML)
    await frontier.keep(page, page.url, links)
    # The worker died after its result: the redelivery has no DOM, only what was kept.
    assert await frontier.follow(page) is True
    assert await frontier.follow(page) is True
    assert await frontier.follow(page, page.url, links) is True
    assert len(await seen_tasks(applied)) == 3
    assert await frontier.state.used(spec.crawl_id) == 3
    record = await frontier.state.page(spec.crawl_id, page.task_id)
    assert record["counts"]["queued"] == 2 and record["counts"]["duplicate"] == 0
    assert await frontier.state.links(spec.crawl_id, page.task_id) is None  # dropped once followed


async def test_a_page_killed_between_its_creates_and_its_record_counts_its_links_once(applied, settings, site):
    crawl_site.install(site)
    spec = CrawlSpec(seeds=(site.url("/"),), robots="ignore")
    frontier = Frontier(applied.js, settings, policy_for(site))
    await frontier.seed(spec)
    page = page_task(spec, site.url("/a/1"))
    links = PageLinks((site.url("/a/2"),), 1, HTML)
    await frontier.follow(page, page.url, links)
    # As if the first attempt had died before writing its record: the second one finds its own tasks.
    await (await frontier.state.kv()).delete(f"{spec.crawl_id}.page.{page.task_id}")
    await (await frontier.state.kv()).purge(f"{spec.crawl_id}.page.{page.task_id}")
    await frontier.follow(page, page.url, links)
    record = await frontier.state.page(spec.crawl_id, page.task_id)
    assert record["queued"] == [crawl_task_id(spec.crawl_id, site.url("/a/2"))]


async def test_robots_disallow_is_skipped_with_a_reason_and_fetched_once_per_crawl(applied, settings, site):
    crawl_site.install(site, crawl_delay=2.5)
    spec = CrawlSpec(seeds=(site.url("/"),))
    one, two, other = await two_frontiers(applied, settings, site)
    try:
        await one.seed(spec)
        links = PageLinks((site.url("/private/x"), site.url("/private/y?z=1"), site.url("/b")), 3, HTML)
        await one.follow(page_task(spec, site.url("/p1")), site.url("/p1"), links)
        await two.follow(page_task(spec, site.url("/p2")), site.url("/p2"), links)
        delay = await two.crawl_delay(page_task(spec, site.url("/b")))
    finally:
        await other.close()
    assert site.hits[(site.hosts[0], "/robots.txt")] == 1  # once for the crawl, the second worker read KV
    assert not any(path.startswith("/private") for _, path in site.hits)
    record = await one.state.page(spec.crawl_id, page_task(spec, site.url("/p1")).task_id)
    assert record["counts"]["robots_disallowed"] == 2
    assert {s["reason"] for s in record["skipped"]} == {"robots_disallowed"}
    assert [t.url for t in await seen_tasks(applied)] == [site.url("/"), site.url("/b")]
    assert delay == 2.5


async def test_robots_5xx_is_retry_later_and_4xx_allows_everything(applied, settings, site):
    from busscrape.crawl.robots import RobotsUnavailable

    crawl_site.install(site)
    site.page("/robots.txt", "down", status=503)
    frontier = Frontier(applied.js, settings, policy_for(site))
    spec = CrawlSpec(seeds=(site.url("/"),))
    try:
        await frontier.seed(spec)
    except RobotsUnavailable as exc:
        assert "HTTP 503" in str(exc)
    else:
        raise AssertionError("a 503 robots.txt let the seed through")
    site.routes.pop("/robots.txt")  # 404 from now on: no rules, everything allowed
    await frontier.seed(spec)
    record = await frontier.state.page(spec.crawl_id, SEEDS)
    assert record["counts"]["queued"] == 1


async def test_crawl_delay_is_a_floor_under_the_hosts_pacing():
    gate = HostGate(concurrency=2, delay=0.0)
    await gate.pace("h", floor=30.0)
    reserved = gate._host("h").next_start - time.monotonic()
    assert reserved > 20  # the next start waits for the host's Crawl-delay
    other = HostGate(concurrency=2, delay=0.0)
    await other.pace("h")
    assert other._host("h").next_start == 0.0  # no floor, no delay: nothing reserved


async def test_sitemaps_seed_the_crawl_and_since_filters_them(applied, settings, site):
    crawl_site.install(site)
    spec = CrawlSpec(seeds=(site.url("/"),), sitemaps=True, sitemap_since=datetime(2025, 1, 1, tzinfo=UTC))
    record = await start_crawl(applied, settings.with_overrides(network={"allow": [f"{h}/32" for h in site.hosts]}),
                               spec)
    urls = sorted(t.url for t in await seen_tasks(applied))
    assert urls == [site.url("/"), site.url("/only-in-sitemap")]  # /b's lastmod is before --sitemap-since
    assert record["counts"]["queued"] == 2


async def test_domain_scope_follows_the_registrable_domain_through_the_policys_resolver(applied, settings, site):
    from busscrape.net.policy import AllowList
    from tests.support.names import NamedPolicy

    names_ = {"shop.example.co.uk": site.hosts[0], "blog.example.co.uk": site.hosts[1],
              "other.co.uk": site.hosts[1]}
    policy = NamedPolicy(AllowList.parse([f"{h}/32" for h in site.hosts]), names=names_)
    port = site.port
    spec = CrawlSpec(seeds=(f"http://shop.example.co.uk:{port}/",), scope="domain", robots="ignore",
                     exclude=[r"/skip"])
    frontier = Frontier(applied.js, settings, policy)
    await frontier.seed(spec)
    page = page_task(spec, f"http://shop.example.co.uk:{port}/a")
    links = PageLinks((f"http://blog.example.co.uk:{port}/x", f"http://other.co.uk:{port}/y",
                       f"http://shop.example.co.uk:{port}/skip/1", "http://10.1.2.3/private"), 4, HTML)
    await frontier.follow(page, page.url, links)
    record = await frontier.state.page(spec.crawl_id, page.task_id)
    assert record["counts"]["queued"] == 1  # blog.example.co.uk: the same registrable domain
    assert {(s["url"].split("/")[2].split(":")[0], s["reason"]) for s in record["skipped"]} == {
        ("other.co.uk", "out_of_scope"), ("shop.example.co.uk", "excluded"), ("10.1.2.3", "out_of_scope")}
    spec_any = CrawlSpec(seeds=spec.seeds, scope="any", robots="ignore")
    await frontier.seed(spec_any)
    page_any = page_task(spec_any, page.url)
    await frontier.follow(page_any, page.url, PageLinks(("http://10.1.2.3/private",), 1, HTML))
    record = await frontier.state.page(spec_any.crawl_id, page_any.task_id)
    assert record["counts"]["blocked"] == 1  # a private address the allow-list does not open
