"""The bundled demo site that ``busscrape demo`` serves on loopback and scrapes.

Seven pages that show what the bus does with each kind: a static article, a page rendered by
JavaScript from a JSON API, a slow page, a gallery of images, a permanent redirect, an index
that links them, and a broken link (404) that ends dead-lettered with its reason. Under
``/shop/`` a product list and product pages for the demo extractor (``demo_shop``).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib

from aiohttp import web

from busscrape.ops.demo_shop import LANTERN, PRODUCT_PATHS, SHOP_PATHS, shop_pages

_STYLE = """body{font:16px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:46rem;padding:0 1rem;color:#222}
h1{color:#234}nav a{margin-right:1rem}.card{border:1px solid #ccd;border-radius:6px;padding:.5rem 1rem;margin:.5rem 0}
img{border-radius:4px;margin:.25rem}"""

_NAV = ('<nav><a href="/">Home</a><a href="/static.html">Article</a><a href="/spa.html">Live feed</a>'
        '<a href="/gallery.html">Gallery</a><a href="/slow.html">Slow</a><a href="/missing.html">Broken</a></nav>')


def _page(title: str, body: str, head: str = "") -> str:
    return (f'<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>'
            f'<link rel=stylesheet href="/style.css">{head}</head><body>{_NAV}<h1>{title}</h1>{body}</body></html>')


def _png(hue: int, width: int = 240, height: int = 160) -> bytes:
    """A small gradient PNG, generated so the demo ships no binary files."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows += bytes(((hue + x) % 256, (hue * 3 + y) % 256, (x * y // 64 + hue) % 256))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


PAGES = {
    "/": _page("busscrape demo", "<p>A tiny site to scrape. Each page shows the bus handling one kind of page.</p>"
               '<ul><li><a href="/static.html">a static article</a></li><li><a href="/spa.html">a page rendered by '
               'JavaScript</a></li><li><a href="/gallery.html">images</a></li><li><a href="/slow.html">a slow page'
               '</a></li><li><a href="/old-article">a redirect</a></li><li><a href="/missing.html">a broken link</a>'
               "</li></ul>"),
    "/static.html": _page("A static article", "<p>Server-rendered text: what you see in the HTML is what the "
                          "browser shows.</p>" + "".join(f"<h2>Section {i}</h2><p>JetStream keeps every task until "
                                                         "a worker acks it; the archive keeps every page.</p>"
                                                         for i in range(1, 6))),
    "/spa.html": _page("Live feed", '<div id=feed class=card>Loading…</div>', head="""<script>
window.addEventListener('DOMContentLoaded', async () => {
  const items = await (await fetch('/api/items.json')).json();
  document.getElementById('feed').innerHTML =
    items.map(i => `<div class=card><b>${i.title}</b> ${i.text}</div>`).join('');
});</script>"""),
    "/gallery.html": _page("Gallery", "".join(f'<img src="/img/{i}.png" width=240 height=160 alt="tile {i}">'
                                              for i in range(1, 7))),
    "/slow.html": _page("A slow page", "<p>This page took two seconds to answer; the worker waited for it.</p>"),
}
PAGES.update(shop_pages(_page))
ITEMS = [{"title": f"Item {i}", "text": "rendered in the browser from /api/items.json"} for i in range(1, 6)]
DEMO_PATHS = ("/", "/static.html", "/spa.html", "/gallery.html", "/slow.html", "/old-article", "/missing.html")
DEMO_EXTRACTOR = "demo-product"


class DemoSite:
    """Serves the demo on 127.0.0.1 in the running event loop. Async context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._images = {f"/img/{i}.png": _png(i * 40) for i in range(1, 7)}

    @property
    def origin(self) -> str:
        return f"{self.host}:{self.port}"

    def urls(self) -> list[str]:
        return [f"http://{self.origin}{path}" for path in DEMO_PATHS]

    def specs(self) -> list[dict[str, str]]:
        """The demo's tasks as JSONL specs: every page, the shop's product pages with the demo extractor."""
        return [{"url": url} for url in self.urls()] + [
            {"url": f"http://{self.origin}{path}", **({"extractor": DEMO_EXTRACTOR} if path in PRODUCT_PATHS else {})}
            for path in SHOP_PATHS]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in PAGES:
            if path == "/slow.html":
                await asyncio.sleep(2)
            return web.Response(text=PAGES[path], content_type="text/html")
        if path == "/style.css":
            return web.Response(text=_STYLE, content_type="text/css")
        if path == "/api/items.json":
            return web.json_response(ITEMS)
        if path == "/shop/api/lantern.json":
            return web.json_response(LANTERN)
        if path in self._images:
            return web.Response(body=self._images[path], content_type="image/png")
        if path == "/old-article":
            raise web.HTTPMovedPermanently("/static.html")
        return web.Response(status=404, text=_page("Not found", "<p>There is no such page.</p>"),
                            content_type="text/html")

    async def __aenter__(self) -> DemoSite:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        if not self.port:
            with socket.socket() as sock:
                sock.bind((self.host, 0))
                self.port = sock.getsockname()[1]
        await web.TCPSite(self._runner, self.host, self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
