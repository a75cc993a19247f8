"""A Playwright Chromium on the system's Chromium binary, launched as the worker launches it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.async_api import Browser


@contextlib.asynccontextmanager
async def launched() -> AsyncIterator[Browser]:
    from playwright.async_api import async_playwright

    from busscrape.settings import BrowserSettings
    from busscrape.worker.browser.chromium import find_chromium, launch_args

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=find_chromium(BrowserSettings()).path,
                                                   args=launch_args(BrowserSettings()))
        try:
            yield browser
        finally:
            await browser.close()
