"""The standard pages the worker tests scrape, served by ``Site``."""

from __future__ import annotations

import asyncio
import hashlib
import time

from aiohttp import web

from tests.support.site import Site

STATIC = """<!doctype html><html><head><title>Static page</title><link rel=stylesheet href=/style.css></head>
<body><h1>Static</h1><p>Plain server-rendered text.</p><img src=/pixel.svg></body></html>"""

JS_RENDERED = """<!doctype html><html><head><title>JS page</title></head><body><div id=app>loading</div>
<script>setTimeout(() => {
  document.getElementById('app').textContent = 'rendered-by-' + 'javascript-' + (4200 + 42); }, 50);
</script></body></html>"""

NOISE = """<!doctype html><html><head><title>Noise</title><style>body{margin:0}</style></head><body>
<canvas id=c width=1280 height=2800></canvas><script>
const c = document.getElementById('c'), x = c.getContext('2d'), img = x.createImageData(1280, 2800);
for (let i = 0; i < img.data.length; i += 65536) crypto.getRandomValues(img.data.subarray(i, i + 65536));
for (let i = 3; i < img.data.length; i += 4) img.data[i] = 255;  // opaque noise: PNG cannot shrink it
x.putImageData(img, 0, 0);</script></body></html>"""


def big_html(megabytes: int) -> str:
    """A deterministic page of about ``megabytes`` MB of visible text."""
    line = "<p>" + hashlib.sha256(b"busscrape").hexdigest() * 4 + "</p>\n"
    body = line * (megabytes * 1024 * 1024 // len(line))
    return "<!doctype html><html><head><title>Big</title></head><body>" + body + "</body></html>"


def install(site: Site) -> dict[str, list[float]]:
    """Add the standard pages; returns per-path request timestamps (monotonic) for timing checks."""
    stamps: dict[str, list[float]] = {}

    def stamp(request: web.Request) -> None:
        stamps.setdefault(request.path, []).append(time.monotonic())

    site.page("/static", STATIC)
    site.page("/js", JS_RENDERED)
    site.page("/noise", NOISE)
    site.page("/style.css", "h1{color:#336}", headers={"Content-Type": "text/css"})
    site.page("/pixel.svg", "<svg xmlns='http://www.w3.org/2000/svg' width='4' height='4'/>",
              headers={"Content-Type": "image/svg+xml"})

    @site.route("/redirect")
    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/redirect2")

    @site.route("/redirect2")
    async def redirect2(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMovedPermanently("/static")

    @site.route("/status")
    async def status(request: web.Request) -> web.StreamResponse:
        stamp(request)
        code = int(request.query.get("code", "200"))
        headers = {"Retry-After": request.query["retry_after"]} if "retry_after" in request.query else None
        return web.Response(status=code, text=f"<h1>status {code}</h1>", content_type="text/html", headers=headers)

    failures: dict[str, int] = {}

    @site.route("/flaky")
    async def flaky(request: web.Request) -> web.StreamResponse:
        """Serves the first ?ok= requests per ?key= (none by default), fails the next ?fail= with ?code=,
        then serves again (?ok=1&fail=99&code=404: a page that went away)."""
        stamp(request)
        key = request.query.get("key", "")
        failures[key] = failures.get(key, 0) + 1
        ok = int(request.query.get("ok", "0"))
        if ok < failures[key] <= ok + int(request.query.get("fail", "1")):
            return web.Response(status=int(request.query.get("code", "503")), text="down", content_type="text/html")
        return web.Response(text="<title>recovered</title><p>ok now</p>", content_type="text/html")

    @site.route("/slow")
    async def slow(request: web.Request) -> web.StreamResponse:
        stamp(request)
        await asyncio.sleep(float(request.query.get("s", "3")))
        return web.Response(text="<title>slow</title><p>finally</p>", content_type="text/html")

    @site.route("/never")
    async def never(request: web.Request) -> web.StreamResponse:
        """Sends the start of a page, then never finishes it."""
        stamp(request)
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        await response.write(b"<html><head><title>never</title></head><body><p>still loading")
        await asyncio.sleep(3600)
        return response

    big = big_html(20)

    @site.route("/big")
    async def big_page(request: web.Request) -> web.StreamResponse:
        return web.Response(text=big, content_type="text/html")

    return stamps
