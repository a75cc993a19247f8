"""The peer: Crawlee for Python's PlaywrightCrawler doing HTML + screenshot of the same pages.

Run by bench/e2e.py with the interpreter of a separate venv that has ``crawlee[playwright]``
(it is a benchmark peer, not a busscrape dependency):

    .venv-crawlee/bin/python bench/crawlee_peer.py URLS_FILE --concurrency 4 --chromium /usr/bin/chromium

It saves each page's HTML and screenshot to Crawlee's key-value store, as a Crawlee user would,
takes the screenshot with Playwright's page.screenshot as a Crawlee user would (full page, up to
the same height cap as busscrape),
and prints one JSON line: {"pages": N, "seconds": S}.

With ``--defaults`` it is Crawlee as it comes: no context options (its fingerprint generator
picks the viewport), and ``page.screenshot()``, the viewport only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--cap", type=int, default=4096, help="screenshot height cap, as busscrape's")
    parser.add_argument("--args", default="", help="Chromium switches, space-separated")
    parser.add_argument("--defaults", action="store_true", help="Crawlee's defaults: a viewport screenshot")
    args = parser.parse_args()
    os.environ.setdefault("CRAWLEE_STORAGE_DIR", tempfile.mkdtemp(prefix="crawlee-bench-"))

    from crawlee import ConcurrencySettings
    from crawlee.crawlers import PlaywrightCrawler, PlaywrightCrawlingContext
    from crawlee.storages import KeyValueStore

    with open(args.urls) as handle:  # noqa: ASYNC230 - read once, before anything runs
        urls = [u.strip() for u in handle if u.strip()]
    launch = {"args": args.args.split()} if args.args else {}
    if args.chromium:
        launch["executable_path"] = args.chromium
    crawler = PlaywrightCrawler(
        headless=True,
        browser_launch_options=launch,
        browser_new_context_options=None if args.defaults else {"viewport": {"width": 1280, "height": 800}},
        concurrency_settings=ConcurrencySettings(min_concurrency=args.concurrency,
                                                 max_concurrency=args.concurrency,
                                                 desired_concurrency=args.concurrency),
        max_request_retries=1,
    )
    store = await KeyValueStore.open()
    done = []

    @crawler.router.default_handler
    async def handler(context: PlaywrightCrawlingContext) -> None:
        page = context.page
        html = await page.content()
        height = await page.evaluate("() => document.documentElement.scrollHeight")
        if args.defaults:
            shot = await page.screenshot()
        elif height <= args.cap:
            shot = await page.screenshot(full_page=True)
        else:
            await page.set_viewport_size({"width": 1280, "height": args.cap})
            shot = await page.screenshot()
        key = hashlib.sha256(context.request.url.encode()).hexdigest()[:32]
        await store.set_value(f"{key}-html", html, content_type="text/html")
        await store.set_value(f"{key}-png", shot, content_type="image/png")
        done.append(context.request.url)

    started = time.perf_counter()
    await crawler.run(urls)
    seconds = time.perf_counter() - started
    print(json.dumps({"pages": len(done), "seconds": seconds}), flush=True)
    if len(done) != len(urls):
        print(f"crawlee rendered {len(done)} of {len(urls)} pages", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
