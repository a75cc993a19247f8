"""The practical limit both browser benchmarks compare against: Playwright and nothing else.

The same captures as a worker (rendered HTML, title and visible text, a PNG screenshot of the
whole page up to the worker's height cap, a HAR without bodies built from network events) with
the same per-task isolation (busscrape.tabs: one reused tab per slot, wiped between tasks) and
the same screenshot call (``Tab.screenshot``), and
none of the bus: no network-policy proxy, no object store, no result, no archive.

``shared_context_loop`` is the ceiling below that: every page in one shared browser context
(one page per slot, never wiped: no isolation between pages), HTML and text, a viewport PNG
screenshot through ``page.screenshot()``, no HAR. What Chromium can render here and little else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from playwright.async_api import Browser, async_playwright

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

        return await _timed(browser, [slot() for _ in range(concurrency)])


async def shared_context_loop(urls: list[str], concurrency: int) -> float:
    """Seconds for ``urls`` in one shared context, viewport screenshot, no HAR (launch excluded)."""
    browser_settings = BrowserSettings()
    binary = require_chromium(browser_settings)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=binary.path, args=launch_args(browser_settings))
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        queue: asyncio.Queue[str] = asyncio.Queue()
        for url in urls:
            queue.put_nowait(url)

        async def slot() -> None:
            page = await context.new_page()
            while not queue.empty():
                await page.goto(queue.get_nowait(), wait_until="load")
                await page.evaluate("() => [document.title, document.body.innerText]")
                await page.content()
                await page.screenshot()
            await page.close()

        return await _timed(browser, [slot() for _ in range(concurrency)])


async def _timed(browser: Browser, slots: list[Coroutine[Any, Any, None]]) -> float:
    """Seconds the slots take together; the browser closed after."""
    started = time.perf_counter()
    await asyncio.gather(*slots)
    elapsed = time.perf_counter() - started
    await browser.close()
    return elapsed
