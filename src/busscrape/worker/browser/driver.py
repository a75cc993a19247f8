"""Playwright's driver, started first thing in a worker.

The driver is a node process that takes a third of a second and more to boot on a small
machine; it needs no settings. ``busscrape worker`` starts it before it reads its settings
(building them is most of a Python process's start), so the two overlap on two cores, and
hands it to the ``BrowserPool`` that launches Chromium through it (``cli/worker.py``).
"""

from __future__ import annotations

import asyncio
import contextlib

from playwright.async_api import Playwright, async_playwright


def start_driver() -> asyncio.Task[Playwright]:
    """Start the driver in the background (on the running loop, which will drive it)."""
    return asyncio.create_task(async_playwright().start(), name="playwright-driver")


async def stop_driver(driver: asyncio.Task[Playwright]) -> None:
    """Stop a driver whether or not it came up (idempotent: a pool that took it may have stopped it)."""
    if not driver.done():
        driver.cancel()
    with contextlib.suppress(BaseException):
        await (await driver).stop()
