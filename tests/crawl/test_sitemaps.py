"""Sitemap seeds from a site served on loopback: robots-declared index files, gzip files, files
larger than one network read, and the filter by ``lastmod``."""

from __future__ import annotations

import asyncio
import gzip
import hashlib

from aiohttp import web

from busscrape.crawl.sitemaps import sitemap_urls
from busscrape.net.policy import NetworkPolicy

PAGES = 3000  # a urlset of ~200 KB: many reads of the network, and a gzip file of many chunks


def urlset(urls: list[str]) -> bytes:
    rows = "".join(f"<url><loc>{u}</loc><lastmod>2026-01-01</lastmod></url>\n" for u in urls)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"\n{rows}</urlset>\n").encode()


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
    body = gzip.compress(urlset(zipped))
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

    site.page("/plain.xml", urlset(plain).decode(), headers={"Content-Type": "application/xml"})
    urls = await sitemap_urls([site.url("/")], NetworkPolicy.from_settings([f"{h}/32" for h in site.hosts]))
    assert sorted(urls) == sorted(zipped + plain)
    assert site.hits[(site.hosts[0], "/pages.xml.gz")] == 1 and site.hits[(site.hosts[0], "/index.xml")] == 1
