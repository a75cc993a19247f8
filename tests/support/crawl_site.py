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


# -- the big graph (``install_graph``): ≥ 500 pages over two seed hosts ------------------------

SECTIONS, PAGES = 10, 25
GRAPH_DEPTH = 3
SITEMAP_ONLY = 5


def install_graph(site: Site) -> dict[tuple[int, str], int]:
    """A site graph on hosts 0 and 1 (both seeds' hosts; host 2 is off-host), to crawl with
    ``--scope host --depth 3 --strip-tracking --sitemaps``; what such a crawl must archive, as
    ``{(host, path and query): depth}``. Per seed host::

        /                 → /s/0 … /s/9, /private/x (robots-disallowed), host 2's /x (off-host);
                            host 0 also: /cal?d=1, /out (302 to host 2), /file.bin (a download)
        /s/I              → /s/I/p/0 … /s/I/p/24: the odd ones made only by its script, the even
                            ones in four spellings (fragment, dot segment, upper-case scheme with a
                            utm_ parameter), the other seed host's /s/I/p/0, /private/I, host 2
        /s/I/p/J          → / (a loop), and for J = 0 /deep/I
        /deep/I           → /deeper/I: found at depth 3, never requested
        /cal?d=N          → /cal?d=N+1: an infinite calendar, cut by the depth
        /only-sitemap/K   (host 0) linked from nowhere, in the sitemap; → /only-sitemap/K/child
    """
    expected: dict[tuple[int, str], int] = {}
    port = site.port

    def at(host: int, path: str) -> str:
        return site.url(path, host=host)

    for h in (0, 1):
        other = 1 - h
        expected[(h, "/")] = 0
        home = "".join(f"<a href='/s/{i}'>s{i}</a>" for i in range(SECTIONS))
        extra = ("<a href='/cal?d=1'>cal</a><a href='/out'>out</a><a href='/file.bin'>file</a>" if h == 0 else "")
        _page(site, h, "/", f"{home}<a href='/private/x'>p</a><a href='{at(2, '/x')}'>x</a>{extra}")
        for i in range(SECTIONS):
            expected[(h, f"/s/{i}")] = 1
            markup, made = [], []
            for j in range(PAGES):
                expected[(h, f"/s/{i}/p/{j}")] = 2
                if j % 2:
                    made.append(f"/s/{i}/p/{j}")
                else:
                    upper = f"HTTP://{site.hosts[h]}:{port}/s/{i}/p/{j}?utm_source=feed"
                    markup += [f"<a href='/s/{i}/p/{j}'>p</a>", f"<a href='/s/{i}/p/{j}#top'>p</a>",
                               f"<a href='/s/{i}/./p/{j}'>p</a>", f"<a href='{upper}'>p</a>"]
                tail = f"<a href='/deep/{i}'>deep</a>" if j == 0 else ""
                _page(site, h, f"/s/{i}/p/{j}", f"<a href='/'>home</a>{tail}")
            script = ("<div id='made'></div><script>for (const href of " + repr(made) + ") {"
                      "const a = document.createElement('a'); a.href = href; a.textContent = href;"
                      "document.getElementById('made').appendChild(a);}</script>")
            _page(site, h, f"/s/{i}", "".join(markup) + f"<a href='{at(other, f'/s/{i}/p/0')}'>o</a>"
                  f"<a href='/private/{i}'>p</a><a href='{at(2, f'/s/{i}')}'>x</a>" + script)
            expected[(h, f"/deep/{i}")] = 3
            _page(site, h, f"/deep/{i}", f"<a href='/deeper/{i}'>deeper</a>")
            _page(site, h, f"/deeper/{i}", "too deep")
    for n in (1, 2, 3):
        expected[(0, f"/cal?d={n}")] = n
    expected[(0, "/out")] = 1
    for k in range(SITEMAP_ONLY):
        expected[(0, f"/only-sitemap/{k}")] = 0
        expected[(0, f"/only-sitemap/{k}/child")] = 1
        _page(site, 0, f"/only-sitemap/{k}", f"<a href='/only-sitemap/{k}/child'>c</a>")
        _page(site, 0, f"/only-sitemap/{k}/child", "child")
    _page(site, 2, "/landing", "<a href='/x'>x</a>")

    @site.route("/robots.txt")
    async def robots(request: web.Request) -> web.StreamResponse:
        sitemap = f"Sitemap: {at(0, '/sitemap.xml')}\n" if request.host.startswith(site.hosts[0]) else ""
        return web.Response(text=f"User-agent: *\nDisallow: /private/\n{sitemap}", content_type="text/plain")

    locs = "".join(f"<url><loc>{at(0, f'/only-sitemap/{k}')}</loc></url>" for k in range(SITEMAP_ONLY))
    _page(site, 0, "/sitemap.xml", '<?xml version="1.0" encoding="UTF-8"?>'
          f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>', "application/xml")
    site.page("/file.bin", "x" * 100, headers={"Content-Type": "application/octet-stream",
                                               "Content-Disposition": "attachment; filename=file.bin"})

    @site.route("/out")
    async def out(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(at(2, "/landing"))

    @site.route("/cal")
    async def calendar(request: web.Request) -> web.StreamResponse:
        day = int(request.query.get("d", "1"))
        return web.Response(text=f"<html><body><a href='/cal?d={day + 1}'>next</a></body></html>",
                            content_type="text/html")

    return expected


def _page(site: Site, host: int, path: str, body: str, content_type: str = "text/html") -> None:
    """``body`` at ``path`` on ``host`` (the site serves one route table: pages that differ by
    host share a route that picks the host's body)."""
    bodies = _bodies(site).setdefault(path, {})
    bodies[host] = body if content_type != "text/html" else f"<html><title>{path}</title><body>{body}</body></html>"

    async def handler(request: web.Request) -> web.StreamResponse:
        h = next((n for n, addr in enumerate(site.hosts) if request.host.startswith(addr + ":")), None)
        if h not in bodies:
            return web.Response(status=404, text="no such page on this host")
        return web.Response(text=bodies[h], content_type=content_type)

    site.routes[path] = handler


def _bodies(site: Site) -> dict[str, dict[int, str]]:
    if not hasattr(site, "graph_bodies"):
        site.graph_bodies = {}
    return site.graph_bodies
