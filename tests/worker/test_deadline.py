"""A render ends by its deadline however its cancel goes (``worker.deadline``), on real Chromium.

The case that stalled the cluster chaos run's host: the render's cancel is *lost*. On Python
3.11 ``asyncio.wait_for`` swallows a cancel that lands in the loop iteration where its inner
work completes (cpython gh-86296; nats-py waits for every reply that way), and that is what
happens when a worker's loop is frozen past a deadline (SIGSTOP, a long GC, a loaded machine):
the reply and the timeout are both due at once. The render then goes on without a deadline,
and the next browser call that has no bound of its own (``page.evaluate`` on a page whose
renderer never answers) waits for ever, with the host slot held.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from busscrape.settings import BrowserSettings
from busscrape.worker import deadline
from busscrape.worker.browser.pool import BrowserPool

pytestmark = pytest.mark.browser

# Loaded, then its renderer never answers again.
BUSY = "<title>busy</title><script>addEventListener('load', () => setTimeout(() => { for (;;) {} }, 50));</script>"


async def _render_losing_its_cancel(page, reply_after: float) -> str:
    """A render that waits for a reply (as ``attempts.reach`` waits for NATS), then asks the page."""
    await asyncio.wait_for(asyncio.sleep(reply_after), 30)
    return await page.evaluate("document.title")


async def test_a_render_whose_cancel_is_lost_and_whose_page_never_answers_ends_by_its_deadline(site, monkeypatch):
    site.page("/busy", BUSY)
    monkeypatch.setattr(deadline, "CLEANUP_GRACE", 2.0)
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000,
                           recycle_rss=2**40) as pool:
        async with pool.tab() as tab:
            tab.broken = True  # closed after the test, not wiped
            await tab.page.goto(site.url("/busy"), wait_until="load")
            loop = asyncio.get_running_loop()
            # The loop frozen (as SIGSTOP freezes a worker) across both the reply (0.9 s) and the
            # deadline (1 s): when it runs again both are due in one iteration, and the cancel is lost.
            loop.call_later(0.3, time.sleep, 1.5)
            rendering = asyncio.ensure_future(deadline.within(
                _render_losing_its_cancel(tab.page, 0.9), 1.0, grace=deadline.CLEANUP_GRACE, what="render"))
            # A liveness check, not a speed one: without the bound it never ends.
            done, _ = await asyncio.wait({rendering}, timeout=120)
            assert done, "the render outlived its deadline: its caller would hold the slot for ever"
            with pytest.raises(TimeoutError):
                rendering.result()
            assert deadline.abandoned() == 1  # left behind, still waiting for the page
            await tab.context.close()  # the page goes: the render left behind ends too
            await asyncio.sleep(0.5)
            assert deadline.abandoned() == 0


async def test_a_render_that_ends_in_time_gives_its_outcome_and_one_over_time_is_a_timeout(site):
    site.page("/ok", "<title>ok</title>")
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000,
                           recycle_rss=2**40) as pool:
        async with pool.tab() as tab:
            await tab.page.goto(site.url("/ok"))
            assert await deadline.within(tab.page.evaluate("document.title"), 30, grace=1, what="render") == "ok"
            with pytest.raises(TimeoutError):
                await deadline.within(tab.page.wait_for_timeout(60_000), 0.2, grace=5, what="render")
            assert deadline.abandoned() == 0  # cancelled cleanly: nothing left behind
