"""``busscrape crawl --detach``: the crawl is started on the fleet's NATS and the command returns
at once with its id; the fleet's workers (none here) do the rest, ``crawl status`` follows it."""

from __future__ import annotations

import asyncio

import orjson

from busscrape.bus import names
from busscrape.crawl.state import SEEDS, CrawlState
from tests.conftest import make_settings
from tests.support import crawl_site
from tests.support.bus import count, has_messages, wait_until
from tests.support.cli import busscrape
from tests.support.procs import env_for


async def test_detach_starts_the_crawl_on_the_fleet_and_returns_at_once(applied, nats_url, site, tmp_path):
    crawl_site.install(site)
    env = env_for(make_settings(tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]}))
    started = await asyncio.to_thread(busscrape, "crawl", site.url("/"), "--detach", "--json", "--max-pages", "3",
                                      "--robots", "ignore", env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    doc = orjson.loads(started.stdout.splitlines()[-1])
    crawl_id = doc["crawl_id"]
    assert doc["seeds"]["queued"] == 1
    # The seed waits for the fleet's workers (TASKS sources it from SEEN a moment after the PubAck).
    await wait_until(lambda: has_messages(applied.js, names.TASKS_STREAM), timeout=10)
    assert await count(applied.js, names.TASKS_STREAM) == 1
    assert not any(path != "/robots.txt" for _, path in site.hits)  # nothing rendered by the command
    state = CrawlState(applied.js)
    assert (await state.spec(crawl_id)).max_pages == 3 and await state.page(crawl_id, SEEDS) is not None
    status = await asyncio.to_thread(busscrape, "crawl", "status", crawl_id, "--json", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    summary = orjson.loads(status.stdout.splitlines()[-1])
    assert summary["links"]["queued"] == 1 and summary["archived"] == 0


def test_detach_without_a_nats_url_is_a_usage_error(tmp_path):
    refused = busscrape("crawl", "http://127.0.0.2:9/", "--detach", env=None, cwd=tmp_path)
    assert refused.returncode == 2 and "--detach needs a NATS URL" in refused.stdout + refused.stderr
