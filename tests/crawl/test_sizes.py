"""What a crawl stores fits what NATS takes, on a real nats-server with a real Chromium worker:
a page of 5,000 links of 330 characters (1.7 MB of hrefs, over the 1 MiB value limit) is
rendered and archived once, its links cut to fit (``links_cut``), never retried or
dead-lettered for their size."""

from __future__ import annotations

import pytest

from busscrape.bus import names
from busscrape.crawl.spec import CrawlSpec, crawl_task_id
from busscrape.crawl.state import CrawlState
from tests.crawl.test_follow_failures import crawl_until, settings_for
from tests.support.bus import count, dead_letters, results

pytestmark = pytest.mark.browser

LINKS, LENGTH = 5000, 330


async def test_a_page_of_many_long_links_is_archived_once_with_its_links_cut_to_fit(bus, tmp_path, nats_url, site):
    stem = site.url("/p/", host=1)
    hrefs = [f"{stem}{i:05d}-" + "x" * (LENGTH - len(stem) - 6) for i in range(LINKS)]
    assert all(len(h) == LENGTH for h in hrefs)
    anchors = "".join(f"<a href='{h}'>l</a>" for h in hrefs)
    site.page("/", f"<html><title>many</title><body>{anchors}</body></html>")
    # A page of 1.7 MB of links loads slowly on a loaded machine: time is not what is tested here.
    settings = settings_for(tmp_path, nats_url, site, max_deliver=5).with_overrides(
        worker={"navigation_timeout": "60s"})
    spec = CrawlSpec(seeds=(site.url("/"),), scope="any", depth=1, max_pages=1, robots="ignore")
    state = CrawlState(bus.js)
    index = crawl_task_id(spec.crawl_id, site.url("/"))

    async def followed() -> bool:
        return await state.page(spec.crawl_id, index) is not None and await count(bus.js, names.TASKS_STREAM) == 0

    await crawl_until(bus, settings, spec, followed)
    assert await dead_letters(bus.js) == []
    assert [r.url for r in await results(bus.js)] == [site.url("/")]
    assert site.hits[(site.hosts[0], "/")] == 1  # rendered once
    record = await state.page(spec.crawl_id, index)
    kept = record["counts"]["discovered"]
    assert 2000 < kept < LINKS and record["links_cut"] == LINKS - kept
    assert record["counts"]["budget_cut"] == kept  # max_pages=1: the seed took the budget
    assert await state.links(spec.crawl_id, index) is None


async def test_a_seed_record_over_the_value_limit_is_written_in_parts_and_the_crawl_runs(bus, tmp_path, nats_url,
                                                                                       site):
    """3,000 sitemap seeds under a 64 KiB CRAWLS value limit (as ~29,000 under the default 1 MiB):
    the seed record lists every task id, across parts; a second start resumes with the same."""
    from busscrape.bus import provision, topology
    from busscrape.crawl.frontier import Frontier
    from busscrape.crawl.progress import summarise
    from busscrape.crawl.run import crawl_status
    from busscrape.crawl.state import SEEDS
    from busscrape.net.policy import NetworkPolicy
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, nats_url, streams={"max_msg_size": "64KiB"},
                             network={"allow": [f"{h}/32" for h in site.hosts]})
    await provision.apply(bus.js, topology.load(settings))
    spec = CrawlSpec(seeds=(site.url("/"),), robots="ignore", depth=0)
    extra = [site.url(f"/s/{i}") for i in range(3000)]
    frontier = Frontier(bus.js, settings, NetworkPolicy.from_settings(settings.network.allow))
    record = await frontier.seed(spec, extra)
    assert record["counts"]["queued"] == 3001 and len(record["queued"]) == 3001 and record["parts"] > 1
    assert set(record["queued"]) == {crawl_task_id(spec.crawl_id, u) for u in (spec.seeds[0], *extra)}
    again = await Frontier(bus.js, settings, NetworkPolicy.from_settings(settings.network.allow)).seed(spec, extra)
    assert again["queued"] == record["queued"]  # resumed: the record as it stands
    pages = await CrawlState(bus.js).pages(spec.crawl_id)
    assert summarise(spec.crawl_id, pages).pages_followed == 0 and SEEDS in pages
    assert sum(len(r["queued"]) for r in pages.values()) == 3001  # every id once, head and parts
    summary = await crawl_status(bus, spec.crawl_id)
    assert summary is not None and summary.links["queued"] == 3001


async def test_links_are_cut_to_the_value_limit_the_bucket_has_not_the_one_the_worker_was_told(bus, tmp_path,
                                                                                               nats_url, site):
    """The streams were applied with 256 KiB values; the worker's own settings say 1 MiB. The
    links are cut to what CRAWLS takes (its ``max_value_size``), and the page archived once."""
    stem = site.url("/p/", host=1)
    anchors = "".join(f"<a href='{stem}{i:05d}-{'x' * 300}'>l</a>" for i in range(LINKS))
    site.page("/", f"<html><title>many</title><body>{anchors}</body></html>")
    # A page of 1.7 MB of links loads slowly on a loaded machine: time is not what is tested here.
    settings = settings_for(tmp_path, nats_url, site, max_deliver=5).with_overrides(
        worker={"navigation_timeout": "60s"})
    small = settings.with_overrides(streams={"max_msg_size": "256KiB"})
    spec = CrawlSpec(seeds=(site.url("/"),), scope="any", depth=1, max_pages=1, robots="ignore")
    state = CrawlState(bus.js)
    index = crawl_task_id(spec.crawl_id, site.url("/"))

    async def followed() -> bool:
        return await state.page(spec.crawl_id, index) is not None and await count(bus.js, names.TASKS_STREAM) == 0

    await crawl_until(bus, small, spec, followed, worker_settings=settings)
    assert await dead_letters(bus.js) == [] and site.hits[(site.hosts[0], "/")] == 1
    record = await state.page(spec.crawl_id, index)
    assert 300 < record["counts"]["discovered"] < 1000 and record["links_cut"] == LINKS - record["counts"]["discovered"]
