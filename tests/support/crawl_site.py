"""A site graph to crawl, on the test site's two hosts (``tests.support.site``).

Host 0 (the seed's host)::

    /                 index: links to /a/1, /b (four spellings), a JavaScript-made link to /js,
                      an off-host link to host 1, /private/x (robots-disallowed), a loop back
                      to /, a redirect that leaves the host, the calendar, a download
    /a/N              a chain (depth tests): /a/1 → /a/2 → … → /a/CHAIN
    /b                a leaf
    /js               only reachable through the link the index's script made
    /calendar?d=N     an infinite calendar: every day links to the next
    /private/x        disallowed by robots.txt (never requested by an obeying crawl)
    /out              302 to host 1's /landing (out of host scope)
    /only-in-sitemap  linked from nowhere, listed in /sitemap.xml
    /file.bin         a download
    /robots.txt       Disallow: /private/ ; Sitemap: /sitemap.xml

Host 1: /elsewhere, /landing (leaves). ``site.hits`` logs every request.
"""

from __future__ import annotations

from aiohttp import web

from tests.support.site import Site

CHAIN = 6


def install(site: Site, *, crawl_delay: float | None = None) -> None:
    other = site.url("/elsewhere", host=1)
    b_spellings = ["/b", "/b#top", f"http://{site.origin(0).upper()}/b?utm_source=news", "./b?fbclid=x"]
    links = "".join(f'<a href="{h}">b</a>' for h in b_spellings)
    site.page("/", f"""<html><head><title>index</title></head><body>
        <a href="/a/1">chain</a> {links}
        <a href="{other}">elsewhere</a> <a href="/private/x">private</a> <a href="/">home</a>
        <a href="/out">out</a> <a href="/calendar?d=1">calendar</a> <a href="mailto:x@example.com">mail</a>
        <a href="/file.bin">download</a>
        <div id="made"></div>
        <script>const a = document.createElement('a'); a.href = '/js'; a.textContent = 'js';
        document.getElementById('made').appendChild(a);</script></body></html>""")
    for n in range(1, CHAIN + 1):
        nxt = f'<a href="/a/{n + 1}">next</a>' if n < CHAIN else ""
        site.page(f"/a/{n}", f"<html><title>a{n}</title><body>{nxt}<a href='/'>home</a></body></html>")
    site.page("/b", "<html><title>b</title><body>leaf</body></html>")
    site.page("/js", "<html><title>js</title><body>made by script</body></html>")
    site.page("/private/x", "<html><title>private</title></html>")
    site.page("/only-in-sitemap", "<html><title>sitemap only</title><body><a href='/b'>b</a></body></html>")
    site.page("/elsewhere", "<html><title>elsewhere</title></html>")
    site.page("/landing", "<html><title>landing</title><body><a href='/elsewhere'>x</a></body></html>")
    delay = f"Crawl-delay: {crawl_delay}\n" if crawl_delay else ""
    site.page("/robots.txt", f"User-agent: *\nDisallow: /private/\n{delay}Sitemap: {site.url('/sitemap.xml')}\n",
              headers={"Content-Type": "text/plain"})
    site.page("/sitemap.xml", f"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>{site.url('/only-in-sitemap')}</loc><lastmod>2026-01-01</lastmod></url>
<url><loc>{site.url('/b')}</loc><lastmod>2020-01-01</lastmod></url>
</urlset>""", headers={"Content-Type": "application/xml"})
    site.page("/file.bin", "x" * 100, headers={"Content-Type": "application/octet-stream",
                                               "Content-Disposition": "attachment; filename=file.bin"})

    @site.route("/out")
    async def out(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(site.url("/landing", host=1))

    @site.route("/calendar")
    async def calendar(request: web.Request) -> web.StreamResponse:
        day = int(request.query.get("d", "1"))
        return web.Response(text=f"<html><title>day {day}</title><body><a href='/calendar?d={day + 1}'>next</a>"
                                 "</body></html>", content_type="text/html")


def hit_paths(site: Site, host: int = 0) -> set[str]:
    return {path for (h, path), n in site.hits.items() if h == site.hosts[host] and n}
