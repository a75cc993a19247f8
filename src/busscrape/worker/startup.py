"""The worker's browser side, started before the worker has connected to NATS.

A worker's first task needs a Chromium with a tab open behind the egress proxy, and that is
the slow part of its start: Playwright's driver, the browser, a renderer (a second or more
on a small machine). None of it needs NATS, so ``busscrape worker`` starts it first and
connects, checks the streams and imports the rest of the worker while Chromium comes up
(``cli/worker.py``); ``Worker.setup`` then takes it over. A worker built without one starts
its own in ``setup``, as before.

Only the first tab is waited for, so the worker binds to TASKS as soon as one page can render;
the other slots' tabs open in the background once the first task's tab is back, or after
``FIRST_PAGE_ALONE`` seconds (``BrowserPool.prewarm(ready=1, rest_after=...)``). On two cores
three renderers starting and three pages loading beside the first page made it take about
twice as long (0.55 s against 0.21 s from the first tab to the first result, median of 4 cold
runs each, ``bench/cold_start.py``), and a run's first page is what its user waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack

from playwright.async_api import Playwright

from busscrape.net.egresses import Egresses
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import Settings
from busscrape.worker.browser.pool import BrowserPool

FIRST_PAGE_ALONE = 1.0
"""Seconds a worker's first page renders alone at most (a slow first page does not hold the
other slots for longer)."""


class BrowserStart:
    """The egress proxy and the browser pool, with a first tab. ``begin()`` starts them in the
    background; ``async with start as (egresses, pool)`` waits for them and closes them on exit."""

    def __init__(self, settings: Settings, driver: asyncio.Future[Playwright] | None = None) -> None:
        self.settings = settings
        self.driver = driver
        self.policy = NetworkPolicy.from_settings(settings.network.allow)
        self._stack = AsyncExitStack()
        self.egresses = Egresses(self.policy, self._stack)
        """The egress listeners: the direct one the pool starts behind, one per upstream proxy later."""
        self._task: asyncio.Task[tuple[Egresses, BrowserPool]] | None = None

    def begin(self) -> BrowserStart:
        if self._task is None:
            self._task = asyncio.create_task(self._start(), name="browser-start")
        return self

    async def _start(self) -> tuple[Egresses, BrowserPool]:
        w = self.settings.worker
        egress = await self.egresses.start()
        pool = await self._stack.enter_async_context(
            BrowserPool(self.settings.browser, proxy_url=egress.url, recycle_after_tasks=w.recycle_after_tasks,
                        recycle_rss=w.recycle_rss, isolation=w.isolation, tab_max_uses=w.tab_max_uses,
                        tab_wipe_delay=w.tab_wipe_delay, idle_tabs=w.concurrency, driver=self.driver))
        await pool.prewarm(w.concurrency, ready=1, rest_after=FIRST_PAGE_ALONE)
        return self.egresses, pool

    async def __aenter__(self) -> tuple[Egresses, BrowserPool]:
        task = self.begin()._task
        assert task is not None
        try:
            return await task
        except BaseException:
            await self._stack.aclose()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop what was started (also when nobody waited for it: the worker never got that far)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self._stack.aclose()
