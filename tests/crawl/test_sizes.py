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
    settings = settings_for(tmp_path, nats_url, site, max_deliver=5)
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
