"""Playwright's driver, started first thing in a worker, with Node's compile cache.

The driver is a node process that takes a third of a second and more to boot on a small
machine; it needs no settings. ``busscrape worker`` starts it before it reads its settings
(building them is most of a Python process's start), so the two overlap on two cores, and
hands it to the ``BrowserPool`` that launches Chromium through it (``cli/worker.py``).

Most of the driver's boot is V8 compiling Playwright's JavaScript, the same every time. Node keeps
the compiled code on disk when ``NODE_COMPILE_CACHE`` names a folder (Node 22.1 and later; the
driver's Node is newer): every driver busscrape starts gets that folder, Node's own default for it
(``<tmp>/node-compile-cache``, keyed inside by Node's version and each file's contents), unless
the environment names another. Measured (8 boots each, warm cache against none): 0.25 s to a
running driver instead of 0.33 s, 0.31 s of CPU instead of 0.40 s; the first boot, which writes
the cache, as without it. ``NODE_DISABLE_COMPILE_CACHE=1`` turns it off (Node's switch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from playwright.async_api import Playwright, async_playwright

if TYPE_CHECKING:  # what async_playwright() returns; playwright.async_api does not re-export it
    from playwright.async_api._context_manager import PlaywrightContextManager

COMPILE_CACHE = "NODE_COMPILE_CACHE"


def compile_cache() -> str:
    """The folder Node keeps the driver's compiled code in: the environment's, else Node's default
    (set in this process's environment, which Playwright hands to the driver it starts)."""
    return os.environ.setdefault(COMPILE_CACHE, str(Path(tempfile.gettempdir()) / "node-compile-cache"))


def playwright() -> PlaywrightContextManager:
    """``async_playwright()`` with the compile cache: what starts every driver in busscrape."""
    compile_cache()
    return async_playwright()


def start_driver() -> asyncio.Task[Playwright]:
    """Start the driver in the background (on the running loop, which will drive it)."""
    return asyncio.create_task(playwright().start(), name="playwright-driver")


async def stop_driver(driver: asyncio.Task[Playwright]) -> None:
    """Stop a driver whether or not it came up (idempotent: a pool that took it may have stopped it)."""
    if not driver.done():
        driver.cancel()
    with contextlib.suppress(BaseException):
        await (await driver).stop()
