"""robots.txt on a real nats-server (CRAWLS) and a site served on loopback: the whole file is
read up to Google's 500 KiB, however the server cuts it into writes, and every redirect hop of
the fetch is asked of the network policy."""

from __future__ import annotations

import asyncio

from aiohttp import web

from busscrape.crawl.robots import Robots, _key
from busscrape.crawl.state import CrawlState
from busscrape.net.policy import NetworkPolicy

WRITE = 8 * 1024


def big_robots(size: int = 180_000) -> bytes:
    """``size`` bytes of comment lines (the rules of other agents would do as well), then the
    rules that matter at the very end."""
    tail = b"User-agent: *\nCrawl-delay: 2\nDisallow: /secret\n"
    line = b"# " + b"x" * 76 + b"\n"
    return line * ((size - len(tail)) // len(line)) + tail


def serve_in_writes(site, path: str, body: bytes, content_type: str = "text/plain") -> None:
    """``body`` sent in 8 KiB writes, each its own network chunk (as a slow origin sends it)."""

    @site.route(path)
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        for at in range(0, len(body), WRITE):
            await response.write(body[at:at + WRITE])
            await asyncio.sleep(0.002)  # not a timing assertion: it keeps the writes apart on the wire
        await response.write_eof()
        return response


async def test_a_large_robots_txt_is_obeyed_to_its_last_line(applied, site):
    body = big_robots()
    assert len(body) > 170_000
    serve_in_writes(site, "/robots.txt", body)
    robots = Robots(CrawlState(applied.js), NetworkPolicy.from_settings([f"{site.hosts[0]}/32"]))
    assert await robots.allowed("c1", site.url("/secret"), "busscrape") is False
    assert await robots.allowed("c1", site.url("/open"), "busscrape") is True
    assert await robots.crawl_delay("c1", site.url("/"), "busscrape") == 2.0
    record = await CrawlState(applied.js).robots("c1", _key(f"http://{site.origin()}"))
    assert record is not None and len(record["body"]) == len(body)


async def test_many_asks_at_once_fetch_robots_txt_once(applied, site):
    """Seeding 3,000 sitemap URLs of one site asks for its rules 3,000 times at once: one fetch
    (before: one each, 3,000 fetches of a 40 KB robots.txt at once, and the seeding failed with
    ``RobotsUnavailable`` when they timed out)."""
    serve_in_writes(site, "/robots.txt", big_robots(40_000))
    robots = Robots(CrawlState(applied.js), NetworkPolicy.from_settings([f"{site.hosts[0]}/32"]))
    verdicts = await asyncio.gather(*(robots.allowed("c1", site.url(f"/p/{i}"), "busscrape") for i in range(300)))
    assert all(verdicts) and await robots.allowed("c1", site.url("/secret"), "busscrape") is False
    assert site.hits[(site.hosts[0], "/robots.txt")] == 1


async def test_every_redirect_hop_of_the_robots_fetch_is_asked_of_the_policy(applied, site):
    """robots.txt redirecting to an address the policy refuses, and to a URL with credentials:
    neither is fetched (so no rules: the policy refuses the host's pages anyway)."""
    site.page("/robots.txt", "", status=302, headers={"Location": site.url("/elsewhere.txt", host=1)})
    site.page("/elsewhere.txt", "User-agent: *\nDisallow: /\n", headers={"Content-Type": "text/plain"})
    robots = Robots(CrawlState(applied.js), NetworkPolicy.from_settings([f"{site.hosts[0]}/32"]))
    assert await robots.allowed("c1", site.url("/page"), "busscrape") is True
    assert site.hits[(site.hosts[1], "/elsewhere.txt")] == 0
    site.page("/robots.txt", "", status=301,
              headers={"Location": site.url("/elsewhere.txt").replace("http://", "http://user:secret@")})
    assert await robots.allowed("c2", site.url("/page"), "busscrape") is True
    assert site.hits[(site.hosts[0], "/elsewhere.txt")] == 0
    assert site.hits[(site.hosts[0], "/robots.txt")] == 2


async def test_a_robots_txt_that_grows_past_a_value_once_escaped_is_cut_to_fit(applied, site):
    """500 KiB of control bytes after the rules: 3 MB as JSON (``\\u0001`` each), over the 1 MiB
    CRAWLS value. Stored cut to fit, the record says how much; the rules at its start hold."""
    body = "User-agent: *\nDisallow: /secret\n" + "\x01" * (500 * 1024 - 40)
    site.page("/robots.txt", body, headers={"Content-Type": "text/plain"})
    state = CrawlState(applied.js)
    robots = Robots(state, NetworkPolicy.from_settings([f"{site.hosts[0]}/32"]))
    assert await robots.allowed("c1", site.url("/secret"), "busscrape") is False
    record = await state.robots("c1", _key(f"http://{site.origin()}"))
    assert record is not None and record["cut"] > 0 and len(record["body"]) + record["cut"] == len(body)
    assert await Robots(state, robots.policy).allowed("c1", site.url("/secret"), "busscrape") is False  # from KV
