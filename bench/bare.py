"""The practical limit both browser benchmarks compare against: Playwright and nothing else.

The same captures as a worker (rendered HTML, title and visible text, a PNG screenshot of the
whole page up to the worker's height cap, a HAR without bodies built from network events) with
the same per-task isolation (busscrape.tabs: one reused tab per slot, wiped between tasks) and
the same screenshot call (``Tab.screenshot``), and
none of the bus: no network-policy proxy, no object store, no result, no archive.
"""

from __future__ import annotations

import asyncio
import time

from playwright.async_api import async_playwright

from busscrape.settings import BrowserSettings, WorkerSettings
from busscrape.worker.browser.chromium import launch_args, require_chromium
from busscrape.worker.browser.pool import JS_HEAP_MB
from busscrape.worker.browser.tabs import Tab
from busscrape.worker.har import HarRecorder

CAP = WorkerSettings().max_screenshot_height


async def bare_loop(urls: list[str], concurrency: int) -> float:
    """Seconds Playwright alone takes over ``urls`` with ``concurrency`` tabs (launch excluded)."""
    browser_settings = BrowserSettings()
    binary = require_chromium(browser_settings)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=binary.path, args=launch_args(
            browser_settings, (f"--js-flags=--max-old-space-size={JS_HEAP_MB}",)))
        queue: asyncio.Queue[str] = asyncio.Queue()
        for url in urls:
            queue.put_nowait(url)

        async def slot() -> None:
            tab = await Tab.open(browser, user_agent=None, generation=0)
            while not queue.empty():
                url = queue.get_nowait()
                await tab.begin(viewport=(1280, 800), headers={})
                har = HarRecorder(tab.page, embed_bodies=False)
                await tab.page.goto(url, wait_until="load")
                await tab.page.evaluate("() => [document.title, document.body.innerText]")
                await tab.page.content()
                height = await tab.page.evaluate("() => document.documentElement.scrollHeight")
                if height <= CAP:
                    await tab.screenshot(fmt="png", quality=None, clip_height=max(height, 800))
                else:
                    await tab.page.set_viewport_size({"width": 1280, "height": CAP})
                    await tab.screenshot(fmt="png", quality=None, clip_height=None)
                    await tab.page.set_viewport_size({"width": 1280, "height": 800})
                await har.settle()
                har.build(browser_version=browser.version, page_timings={}, max_bytes=10**9)
                for event, handler in har.listeners():
                    tab.page.remove_listener(event, handler)
                await tab.wipe()
            await tab.close()

        started = time.perf_counter()
        await asyncio.gather(*(slot() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        await browser.close()
    return elapsed
