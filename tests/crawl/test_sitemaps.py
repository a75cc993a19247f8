"""Sitemap seeds on a real nats-server and a site served on loopback (robots-declared index files,
gzip files, the filter by ``lastmod``): a sitemap is read whole,
however the server cuts it into writes; what a crawl's sitemaps may cost is bounded and the
seed record says what was cut; every redirect hop of a sitemap fetch is asked of the policy."""

from __future__ import annotations

import asyncio
import gzip
import hashlib

from aiohttp import web

from busscrape.crawl.run import start_crawl
from busscrape.crawl.sitemaps import SitemapLimits, sitemap_urls
from busscrape.crawl.spec import CrawlSpec
from busscrape.net.policy import NetworkPolicy
from tests.crawl.test_robots import serve_in_writes

XML = '<?xml version="1.0" encoding="UTF-8"?>\n'


def urlset(urls: list[str], lastmod: str | None = None) -> bytes:
    modified = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
    return (XML + '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<url><loc>{u}</loc>{modified}</url>\n" for u in urls) + "</urlset>").encode()


def index(urls: list[str]) -> bytes:
    return (XML + '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in urls) + "</sitemapindex>").encode()


def allow(site) -> list[str]:
    return [f"{site.hosts[0]}/32"]


async def test_a_3000_url_sitemap_seeds_all_3000(applied, settings, site):
    pages = [site.url(f"/p/{i}") for i in range(3000)]
    serve_in_writes(site, "/sitemap.xml", urlset(pages), "application/xml")
    record = await start_crawl(applied, settings.with_overrides(network={"allow": allow(site)}),
                               CrawlSpec(seeds=(site.url("/"),), sitemaps=True, robots="ignore", depth=0))
    assert record["counts"]["queued"] == 3001  # the seed and every sitemap URL
    assert record["sitemaps"] == {"urls": 3000, "files": record["sitemaps"]["files"],
                                  "cut": {"urls": 0, "files": 0, "truncated": 0}, "truncated": []}


async def test_what_the_sitemap_limits_cut_is_counted(site):
    site.page("/robots.txt", f"Sitemap: {site.url('/index.xml')}\n", headers={"Content-Type": "text/plain"})
    parts = [site.url(f"/s{n}.xml") for n in range(4)]
    site.page("/index.xml", index(parts).decode(), headers={"Content-Type": "application/xml"})
    for n, part in enumerate(parts):
        site.page(part.removeprefix(site.url("")), urlset([site.url(f"/p/{n}/{i}") for i in range(40)]).decode(),
                  headers={"Content-Type": "application/xml"})
    policy = NetworkPolicy.from_settings(allow(site))
    found = await sitemap_urls([site.url("/")], policy, limits=SitemapLimits(urls=50, files=4, bytes=1 << 20))
    # Four requests: robots.txt, index.xml and two of its four parts; the rest are counted as cut
    # (the other two parts, and the known sitemap paths the parser would have tried).
    assert found.files == 4 and found.files_cut >= 2
    assert len(found.urls) == 50 and found.urls_cut == 2 * 40 - 50
    small = await sitemap_urls([site.url("/")], policy, limits=SitemapLimits(bytes=2000))
    assert small.truncated_count >= 1 and small.record()["cut"]["truncated"] == small.truncated_count


async def test_every_redirect_hop_of_a_sitemap_fetch_is_asked_of_the_policy(site):
    site.page("/sitemap.xml", "", status=302, headers={"Location": site.url("/elsewhere.xml", host=1)})
    site.page("/elsewhere.xml", urlset([site.url("/p/1")]).decode(), headers={"Content-Type": "application/xml"})
    found = await sitemap_urls([site.url("/")], NetworkPolicy.from_settings(allow(site)))
    assert found.urls == [] and site.hits[(site.hosts[1], "/elsewhere.xml")] == 0


PAGES = 3000  # a urlset of ~200 KB: many reads of the network, and a gzip file of many chunks


async def test_a_sitemap_index_of_a_gzip_file_and_a_plain_one_seeds_every_page(site):
    plain = [site.url(f"/plain/{i}") for i in range(3)]
    # Distinct digests in the paths, so that the gzip file is as long as several reads.
    zipped = [site.url(f"/zipped/{hashlib.sha256(str(i).encode()).hexdigest()}") for i in range(PAGES)]
    site.page("/robots.txt", f"User-agent: *\nSitemap: {site.url('/index.xml')}\n",
              headers={"Content-Type": "text/plain"})
    site.page("/index.xml", f"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<sitemap><loc>{site.url('/pages.xml.gz')}</loc></sitemap>
<sitemap><loc>{site.url('/plain.xml')}</loc></sitemap>
</sitemapindex>""", headers={"Content-Type": "application/xml"})
    body = gzip.compress(urlset(zipped, lastmod="2026-01-01"))
    assert len(body) > 100_000

    @site.route("/pages.xml.gz")
    async def pages(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/gzip"})  # chunked
        await response.prepare(request)
        for at in range(0, len(body), 4096):  # as a slow network delivers it: a read at a time
            await response.write(body[at:at + 4096])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    site.page("/plain.xml", urlset(plain, lastmod="2026-01-01").decode(), headers={"Content-Type": "application/xml"})
    found = await sitemap_urls([site.url("/")], NetworkPolicy.from_settings([f"{h}/32" for h in site.hosts]))
    assert sorted(found.urls) == sorted(zipped + plain)
    assert site.hits[(site.hosts[0], "/pages.xml.gz")] == 1 and site.hits[(site.hosts[0], "/index.xml")] == 1
