"""robots.txt and sitemap fetches connect to the address the policy checked: a name that answers
an allowed address to the check and a refused one afterwards (DNS rebinding) reaches nothing.

The rebinding name is ``localhost``: the policy's first answer is 127.0.0.2 (allowed), every
later one the system's (127.0.0.1 and ::1, not allowed). An HTTP client resolving the name
again itself would connect to 127.0.0.1, where the test's site also listens and logs the hit.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from busscrape.crawl.robots import Robots
from busscrape.crawl.sitemaps import sitemap_urls
from busscrape.crawl.state import CrawlState
from busscrape.net.addresses import IPAddress
from busscrape.net.policy import AllowList, NetworkPolicy
from tests.support.site import Site

ALLOWED, REFUSED = "127.0.0.2", "127.0.0.1"


@dataclass
class RebindingPolicy(NetworkPolicy):
    answered: list[str] = field(default_factory=list)

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        if host != "localhost":
            return await super().resolve(host, port)
        self.answered.append(host)
        if len(self.answered) == 1:
            return [ipaddress.ip_address(ALLOWED)]
        return await super().resolve(host, port)


@pytest.fixture
def two_faced() -> Iterator[Site]:
    """The site on both addresses; ``site.reached`` logs (address connected to, path) of each
    request (``site.hits`` has the Host header, which is the name either way)."""
    with Site(hosts=(ALLOWED, REFUSED)) as site:
        site.reached = []
        bodies = {"/robots.txt": ("User-agent: *\nDisallow: /\n", "text/plain"),
                  "/sitemap.xml": (f"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://localhost:{site.port}/p</loc></url>
</urlset>""", "application/xml")}

        async def logged(request: web.Request) -> web.StreamResponse:
            site.reached.append((request.transport.get_extra_info("sockname")[0], request.path))
            text, content_type = bodies[request.path]
            return web.Response(text=text, content_type=content_type)

        for path in bodies:
            site.route(path)(logged)
        yield site


def policy() -> RebindingPolicy:
    return RebindingPolicy(AllowList.parse([f"{ALLOWED}/32"]))


def refused_hits(site: Site) -> list[str]:
    return [path for address, path in site.reached if address != ALLOWED]


async def test_robots_txt_is_fetched_from_the_checked_address_only(applied, two_faced):
    rebinding = policy()
    robots = Robots(CrawlState(applied.js), rebinding)
    allowed = await robots.allowed("c1", f"http://localhost:{two_faced.port}/page", "busscrape")
    assert refused_hits(two_faced) == []  # never connected to the refused address
    assert len(rebinding.answered) >= 2  # the check, then the connection: both asked the policy
    assert allowed is True  # refused by the policy, so no robots.txt: its pages are refused anyway


async def test_sitemaps_are_fetched_from_the_checked_address_only(two_faced):
    rebinding = policy()
    found = await sitemap_urls([f"http://localhost:{two_faced.port}/"], rebinding)
    assert refused_hits(two_faced) == []
    assert len(rebinding.answered) >= 2
    assert found.urls == []
