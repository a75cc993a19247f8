"""A Playwright Chromium on the system's Chromium binary, launched as the worker launches it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.async_api import Browser


@contextlib.asynccontextmanager
async def launched() -> AsyncIterator[Browser]:
    from busscrape.settings import BrowserSettings
    from busscrape.worker.browser.chromium import find_chromium, launch_args
    from busscrape.worker.browser.driver import playwright

    async with playwright() as driver:
        browser = await driver.chromium.launch(executable_path=find_chromium(BrowserSettings()).path,
                                                   args=launch_args(BrowserSettings()))
        try:
            yield browser
        finally:
            await browser.close()
