"""A network change under a page is an outage: the render is not archived, no attempt is spent, and
the next delivery archives the page whole.

Chromium fails what it has in flight with ``ERR_NETWORK_CHANGED`` when an address comes or goes on
the worker's machine (a VPN up, DHCP, a container started beside it): a capture made then lacks
resources through no fault of the page's. Here the worker, its Chromium, nats-server and the site
run in a network namespace of the module's own (tests/support/netns.py), and the test adds an address
to it while the page's images are in flight: a real change, seen by nothing else on the machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.worker.daemon import Worker
from tests.support import netns
from tests.support.bus import count, dead_letters, enqueue, results

pytestmark = pytest.mark.browser

IMAGES = 24  # more than Chromium's six connections to a host: the rest wait for one
GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
       b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


@pytest.fixture(scope="module", autouse=True)
def own_network() -> Iterator[Path]:
    """Before the module's nats-server (autouse goes first within a scope), so all of it runs there."""
    with netns.private("network-change") as path:
        if path is None:
            pytest.skip("a network namespace of the test's own needs root and iproute2")
        yield path


async def test_a_network_change_under_a_page_is_an_outage_and_the_next_delivery_archives_it_whole(
        wbus, wsettings, site):
    held, release = threading.Event(), threading.Event()  # the first render's images wait for the change

    async def image(_: web.Request) -> web.Response:
        held.set()
        while not release.is_set():  # noqa: ASYNC110 (set from the test's thread and loop, not the site's)
            await asyncio.sleep(0.02)
        return web.Response(body=GIF, content_type="image/gif")

    for n in range(IMAGES):
        site.routes[f"/img/{n}.gif"] = image
    page = site.page("/gallery", "<title>Gallery</title>" + "".join(f"<img src='/img/{n}.gif'>" for n in range(IMAGES)))
    task = await enqueue(wbus.js, page)

    async with Worker(wbus, wsettings) as worker:
        running = asyncio.ensure_future(worker.run())
        for _ in range(300):
            if held.is_set():
                break
            await asyncio.sleep(0.05)
        assert held.is_set(), "the page's images were never asked for"
        await asyncio.sleep(0.5)  # the images beyond the first six are queued for a connection
        subprocess.run(["ip", "addr", "add", "10.203.0.1/32", "dev", "lo"], check=True)  # this namespace's
        await asyncio.sleep(0.5)  # Chromium hears of it (netlink) and fails what waits
        release.set()
        await asyncio.wait_for(running, 120)

    assert worker.counters.get("outage", 0) == 1, worker.counters
    assert site.hits[(site.hosts[0], "/gallery")] == 2  # rendered again, not archived cut off
    [result] = await results(wbus.js)
    assert result.task_id == task.task_id and result.status == 200
    assert result.attempt == 1  # the outage spent no attempt
    har_ref = next(ref for ref in result.artifacts if ref.name == "page.har")
    har = orjson.loads(await ArtifactStore(wbus.js).read(har_ref))
    images = {e["request"]["url"]: e["response"]["status"] for e in har["log"]["entries"]
              if "/img/" in e["request"]["url"]}
    assert images == {site.url(f"/img/{n}.gif"): 200 for n in range(IMAGES)}  # the whole page
    assert await dead_letters(wbus.js) == []
    assert await count(wbus.js, names.TASKS_STREAM) == 0
