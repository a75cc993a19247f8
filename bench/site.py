"""A deterministic benchmark website on several loopback origins.

Pages of realistic weight: HTML of 50-200 KB (text, a table, links), a shared stylesheet and a
script served from a second origin, three images from a third, and a little JavaScript that
renders part of the content (so a browser is needed to see it all). Everything is generated
from the page number, so every run serves the same bytes.

    python bench/site.py --pages 500        # serve until Ctrl-C and print a few URLs
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import struct
import threading
import zlib

from aiohttp import web

ORIGINS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
WORDS = ("bus", "stream", "consumer", "worker", "render", "archive", "page", "browser", "queue", "result",
         "partition", "chromium", "ingest", "dead", "letter", "retry", "policy", "lag", "ack", "subject")


def _png(seed: int, width: int = 160, height: int = 120) -> bytes:
    """A small deterministic RGB PNG (a gradient with noise: ~20-40 KB)."""
    rng = random.Random(seed)
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            row += bytes(((x * 3 + seed) % 256, (y * 2 + rng.randrange(64)) % 256, (x + y + rng.randrange(128)) % 256))
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


@functools.lru_cache(maxsize=2048)
def page_html(n: int, port: int) -> str:
    """A page built like a real one: most bytes are markup and an inline state blob, the visible
    part is an article of one to three thousand words (a few screens tall, not a wall of text)."""
    rng = random.Random(n)
    size = rng.randrange(50_000, 200_000)
    css = f"http://{ORIGINS[1]}:{port}/static/site.css"
    js = f"http://{ORIGINS[1]}:{port}/static/app.js"
    images = "".join(f'<figure class="media"><img src="http://{ORIGINS[2]}:{port}/img/{(n + i) % 40}.png" '
                     f'width=160 height=120 alt="figure {i}"><figcaption>Figure {i}</figcaption></figure>'
                     for i in range(3))
    nav = "".join(f'<li class="nav-item"><a class="nav-link" href="/page/{(n + i) % 997}" data-track="nav-{i}">'
                  f'{rng.choice(WORDS).title()} {i}</a></li>' for i in range(80))
    article = []
    for section in range(rng.randrange(6, 14)):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(120, 220)))
        article.append(f'<section class="article-section" id="s{section}"><h2>Section {section}</h2>'
                       f"<p>{words}</p></section>")
    related = "".join(f'<div class="card"><a href="/page/{(n * 7 + i) % 997}"><span class="card-title">'
                      f"{rng.choice(WORDS)} {i}</span></a></div>" for i in range(20))
    footer = "".join(f'<a class="footer-link" href="/page/{(n + 3 * i) % 997}">link {i}</a>' for i in range(100))
    head = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Bench page {n}</title>"
            f'<meta name="viewport" content="width=device-width"><link rel=stylesheet href="{css}">'
            f"<style>{SITE_CSS * 20}</style></head>")
    body = (f'<body><header><nav><ul class="nav">{nav}</ul></nav><h1>Page {n}</h1></header>'
            f'<main><article>{images}{"".join(article)}</article><div id=app data-page="{n}"></div>'
            f'<aside class="related">{related}</aside></main><footer>{footer}</footer>')
    page = head + body
    # The rest is what frameworks inline for hydration: bytes the browser parses, nobody sees.
    items, length = [], len(page)
    while length < size:
        item = json.dumps({"id": len(items), "name": " ".join(rng.choice(WORDS) for _ in range(8)),
                           "tags": [rng.choice(WORDS) for _ in range(4)], "score": rng.random()},
                          separators=(",", ":"))
        items.append(item)
        length += len(item) + 1
    state = '{"page":%d,"items":[%s]}' % (n, ",".join(items))  # noqa: UP031 - JSON braces
    return (page + f'<script id="__STATE__" type="application/json">{state}</script>'
            f'<script src="{js}"></script></body></html>')


APP_JS = """
document.addEventListener('DOMContentLoaded', () => {
  const app = document.getElementById('app'), n = Number(app.dataset.page);
  const ul = document.createElement('ul');
  for (let i = 0; i < 50; i++) {
    const li = document.createElement('li'); li.textContent = 'item ' + (n * 50 + i); ul.appendChild(li);
  }
  app.appendChild(ul);
});
"""
SITE_CSS = ("body{font:15px/1.5 sans-serif;margin:0 auto;max-width:1000px}h2{color:#335}.nav{display:flex;"
            "flex-wrap:wrap;list-style:none}.nav-item{margin:2px 6px}.card{display:inline-block;width:45%}"
            ".media{display:inline-block;margin:4px}footer{font-size:12px}")


class BenchSite:
    """Serves the site on every origin, in a background thread. Context manager."""

    def __init__(self, port: int = 0, pages: int = 1000) -> None:
        self.port = port
        self.pages = pages
        self._images = {i: _png(i) for i in range(40)}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.requests = 0

    def urls(self, count: int) -> list[str]:
        """``count`` page URLs spread over the first origin's paths (pages link across origins)."""
        return [f"http://{ORIGINS[i % 2]}:{self.port}/page/{i % self.pages}?v={i // self.pages}" for i in range(count)]

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        path = request.path
        if path.startswith("/page/"):
            return web.Response(text=page_html(int(path[6:]), self.port), content_type="text/html")
        if path == "/static/site.css":
            return web.Response(text=SITE_CSS, content_type="text/css", headers={"Cache-Control": "max-age=3600"})
        if path == "/static/app.js":
            return web.Response(text=APP_JS, content_type="application/javascript",
                                headers={"Cache-Control": "max-age=3600"})
        if path.startswith("/img/"):
            return web.Response(body=self._images[int(path[5:-4]) % 40], content_type="image/png",
                                headers={"Cache-Control": "max-age=3600"})
        return web.Response(status=404)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        if not self.port:
            import socket

            with socket.socket() as s:
                s.bind((ORIGINS[0], 0))
                self.port = s.getsockname()[1]
        for host in ORIGINS:
            await web.TCPSite(self._runner, host, self.port, backlog=1024).start()

    def __enter__(self) -> BenchSite:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--port", type=int, default=8808)
    args = parser.parse_args()
    with BenchSite(args.port, args.pages) as site:
        print("\n".join(site.urls(5)), "…", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
