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
import hashlib
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


def page_html(n: int, port: int) -> str:
    rng = random.Random(n)
    size = rng.randrange(50_000, 200_000)
    css = f"http://{ORIGINS[1]}:{port}/static/site.css"
    js = f"http://{ORIGINS[1]}:{port}/static/app.js"
    images = "".join(f'<img src="http://{ORIGINS[2]}:{port}/img/{(n + i) % 40}.png" width=160 height=120 alt="">'
                     for i in range(3))
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>Bench page {n}</title>"
             f'<link rel=stylesheet href="{css}"></head><body><header><h1>Page {n}</h1>{images}</header>'
             f'<div id=app data-page="{n}"></div><main>']
    length = sum(len(p) for p in parts)
    i = 0
    while length < size:
        words = " ".join(rng.choice(WORDS) for _ in range(60))
        digest = hashlib.md5(words.encode()).hexdigest()
        block = (f"<h2>Section {i}</h2><p>{words}</p><table><tr><td>{i}</td><td>{digest}"
                 f"</td></tr></table><a href=/page/{(n + i) % 997}>next</a>")
        parts.append(block)
        length += len(block)
        i += 1
    parts.append(f'</main><script src="{js}"></script></body></html>')
    return "".join(parts)


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
SITE_CSS = "body{font:14px sans-serif;margin:2em;max-width:1000px}h2{color:#335}table{border:1px solid #ccc}"


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
