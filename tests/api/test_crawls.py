"""``POST /crawls`` and ``GET /crawls/{id}`` over real HTTP, against a real nats-server and a
loopback site (no browser: the test plays the worker's part through the frontier)."""

from __future__ import annotations

import aiohttp
import pytest

from busscrape.api.server import ApiServer
from busscrape.bus import names
from busscrape.crawl.frontier import Frontier
from busscrape.crawl.links import PageLinks
from busscrape.model.messages import ScrapeTask, decode
from busscrape.net.policy import NetworkPolicy
from tests.api.test_server import AUTH, TOKEN, call, error_of
from tests.support import crawl_site
from tests.support.bus import stream_messages


@pytest.fixture
def crawl_settings(settings, site):
    return settings.with_overrides(api={"port": 0, "token": TOKEN},
                                   network={"allow": [f"{h}/32" for h in site.hosts]})


@pytest.fixture
async def http(applied, crawl_settings):
    async with ApiServer(applied, crawl_settings) as server, \
            aiohttp.ClientSession(base_url=server.url, headers=AUTH) as session:
        yield session


async def test_post_crawls_seeds_it_and_get_follows_its_progress(applied, http, crawl_settings, site):
    crawl_site.install(site)
    body = {"seeds": [site.url("/"), site.url("/#again")], "depth": 1, "max_pages": 5, "labels": {"job": "t"}}
    status, started = await call(http, "POST", "/crawls", json=body)
    assert status == 202, started
    assert started["seeds"]["queued"] == started["seeds"]["discovered"] == 1  # one page, two spellings
    crawl_id = started["crawl_id"]
    status, again = await call(http, "POST", "/crawls", json=body)
    assert (status, again["crawl_id"]) == (202, crawl_id)  # the same crawl: resumed, nothing queued twice
    [msg] = await stream_messages(applied.js, names.SEEN_STREAM)
    seed = decode(ScrapeTask, msg.data)
    assert seed.crawl is not None and seed.crawl.depth == 0 and seed.labels == {"job": "t"}
    # A worker renders the seed and follows its links.
    frontier = Frontier(applied.js, crawl_settings, NetworkPolicy.from_settings(crawl_settings.network.allow))
    await frontier.follow(seed, seed.url, PageLinks((site.url("/a/1"), site.url("/private/x"),
                                                     site.url("/elsewhere", host=1)), 3, "text/html"))
    status, progress = await call(http, "GET", f"/crawls/{crawl_id}")
    assert status == 200, progress
    assert progress["links"]["queued"] == 2 and progress["links"]["robots_disallowed"] == 1
    assert progress["links"]["out_of_scope"] == 1 and progress["budget_used"] == 2
    assert progress["by_depth"]["1"] == {"discovered": 3, "queued": 1, "robots_disallowed": 1, "out_of_scope": 1}


@pytest.mark.parametrize(("body", "reason"), [
    ({"seeds": []}, "invalid_request"),
    ({"seeds": ["http://x.test/"], "scope": "site"}, "invalid_request"),
    ({"seeds": ["http://x.test/"], "include": ["("]}, "invalid_request"),
    ({"seeds": ["ftp://x.test/"]}, "unsupported_scheme"),
])
async def test_bad_crawls_are_400_with_the_reason(http, body, reason):
    status, answer = await call(http, "POST", "/crawls", json=body)
    assert status == 400 and error_of(answer) == reason, answer


async def test_get_crawls_answers_404_and_400(http):
    assert (await call(http, "GET", "/crawls/0123456789abcdef"))[0] == 404
    status, answer = await call(http, "GET", "/crawls/nope")
    assert status == 400 and error_of(answer) == "invalid_crawl_id"


async def test_a_crawl_whose_seed_was_blocked_is_422_then_runs_once_the_api_allows_it(applied, settings, site):
    """Issue 36.1: a seed the network policy refused is checked again when the same crawl is
    asked for again (the API restarted with the allow list), not blocked for good."""
    crawl_site.install(site)
    body = {"seeds": [site.url("/b")], "depth": 0}
    closed = settings.with_overrides(api={"port": 0, "token": TOKEN})
    async with ApiServer(applied, closed) as server, aiohttp.ClientSession(base_url=server.url, headers=AUTH) as s:
        status, answer = await call(s, "POST", "/crawls", json=body)
    assert status == 422 and error_of(answer) == "crawl_seed_skipped", answer
    assert site.url("/b") in answer["error"]["message"] and "--allow" in answer["error"]["message"]
    assert await stream_messages(applied.js, names.SEEN_STREAM) == []
    opened = closed.with_overrides(network={"allow": [f"{site.hosts[0]}/32"]})
    async with ApiServer(applied, opened) as server, aiohttp.ClientSession(base_url=server.url, headers=AUTH) as s:
        status, started = await call(s, "POST", "/crawls", json=body)
        assert status == 202 and started["seeds"]["queued"] == 1 and started["seeds"]["blocked"] == 0, started
        status, again = await call(s, "POST", "/crawls", json=body)
    assert (status, again["seeds"]["queued"]) == (202, 1)  # resumed: queued once
    [msg] = await stream_messages(applied.js, names.SEEN_STREAM)
    assert decode(ScrapeTask, msg.data).url == site.url("/b")

async def test_post_crawls_with_sitemaps_answers_before_they_are_read(applied, http, site):
    """The site's sitemap does not answer until the test lets it: ``POST /crawls`` answers 202
    (``seeding``) meanwhile, ``GET`` says the crawl is seeding, and once the sitemap is read every
    URL of it is queued."""
    import asyncio
    import threading

    from aiohttp import web

    from tests.support.bus import wait_until

    gate = threading.Event()

    @site.route("/sitemap.xml")
    async def sitemap(request: web.Request) -> web.StreamResponse:
        await asyncio.to_thread(gate.wait, 120)
        urls = "".join(f"<url><loc>{site.url(f'/p/{i}')}</loc></url>" for i in range(30))
        return web.Response(text=f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>',
                            content_type="application/xml")

    body = {"seeds": [site.url("/")], "sitemaps": True, "robots": "ignore", "depth": 0}
    try:
        status, started = await call(http, "POST", "/crawls", json=body)
        assert status == 202 and started["seeding"] is True and started["seeds"] == {}, started
        status, progress = await call(http, "GET", f"/crawls/{started['crawl_id']}")
        assert status == 200 and progress["seeding"] is True
    finally:
        gate.set()

    async def seeded() -> bool:
        return (await call(http, "GET", f"/crawls/{started['crawl_id']}"))[1].get("seeding") is False

    await wait_until(seeded, timeout=90)
    status, progress = await call(http, "GET", f"/crawls/{started['crawl_id']}")
    assert progress["links"]["queued"] == 31
