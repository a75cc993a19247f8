"""Reusable tabs: one browser context and one page per worker slot, wiped between tasks.

A fresh browser context per task is the obvious isolation, and on a small machine the most
expensive part of a render: measured here, opening a context and its first page cost ~450 ms
of the ~1.1 s a task took, because every new page starts a new renderer process. A tab keeps
its context and page (and so its warm renderer) for a run of tasks, and between two tasks
removes everything one task could leave for the next:

- the page goes to ``about:blank`` and its session history is reset (``history.back()``
  cannot reach the previous task's page; the back/forward cache is off for the whole browser),
  ``window.name`` is emptied;
- cookies and permissions of the context are cleared;
- every origin the task touched loses all its storage (``Storage.clearDataForOrigin``: local
  and session storage, IndexedDB, Cache Storage, file systems, service workers …);
- the context's HTTP cache is dropped (``Network.clearBrowserCache``);
- request routes, extra headers and popups of the task are removed.

One thing no wipe reaches is the context's HTTP auth cache: a task whose page sent credentials
in a URL (or an XHR given a user and password) leaves its tab to be closed instead.

The wipe runs after the task has left the tab, off its result's path. While the worker has
other tabs ready it waits ``worker.tab_wipe_delay`` first, the page's scripts paused
(``pause``), so that Chromium's clean-up does not compete for the CPU with the upload and
archiving of the result; a task that finds no tab ready starts it at once (``BrowserPool``).

``tests/worker/test_tabs.py`` proves it: state set by one task is invisible to the next. A tab whose
page crashed, or that failed to wipe in time, is closed instead of reused, and every tab is
replaced after ``max_uses`` tasks so that a long-lived renderer cannot accumulate leaks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any
from urllib.parse import urlsplit

import structlog
from playwright.async_api import Browser, BrowserContext, CDPSession, Dialog, Page, Request
from playwright.async_api import Error as PlaywrightError

log = structlog.get_logger("busscrape.tabs")

WIPE_TIMEOUT = 10.0


class Tab:
    """A context with one page, reused by one task at a time."""

    def __init__(self, context: BrowserContext, page: Page, cdp: CDPSession, *, user_agent: str | None,
                 proxy: str | None = None,
                 generation: int) -> None:
        self.context = context
        self.page = page
        self.cdp = cdp
        self.user_agent = user_agent
        self.proxy = proxy
        self.private = False
        """A session's tab: closed after its task, never reused."""
        """The egress listener this tab's context goes through (one per upstream proxy; none: the browser's)."""
        self.generation = generation
        self.uses = 0
        self.shelved = 0
        """When the pool last put it back ready (a counter): the longest idle goes first."""
        self.broken = False
        self.origins: set[str] = set()
        self._viewport: tuple[int, int] | None = None
        self._headers_set = False
        self._paused = False
        self._chores: set[asyncio.Future[Any]] = set()
        page.on("dialog", self._dialog)
        page.on("request", self._seen)
        page.on("crash", self._crashed)
        context.on("page", self._popup)

    @property
    def kind(self) -> tuple[str | None, str | None]:
        """What tabs must share to be reused for one another: user agent and proxy."""
        return self.user_agent, self.proxy

    @classmethod
    async def open(cls, browser: Browser, *, user_agent: str | None, generation: int,
                   proxy: str | None = None, storage_state: dict[str, Any] | None = None) -> Tab:
        options: dict[str, Any] = {"accept_downloads": False, "service_workers": "block"}
        if user_agent:
            options["user_agent"] = user_agent
        if proxy:
            options["proxy"] = {"server": proxy, "bypass": "<-loopback>"}
        if storage_state is not None:
            options["storage_state"] = storage_state
        context = await browser.new_context(**options)
        try:
            page = await context.new_page()
            cdp = await context.new_cdp_session(page)
        except Exception:
            await context.close()
            raise
        return cls(context, page, cdp, user_agent=user_agent, proxy=proxy, generation=generation)

    # -- per task ---------------------------------------------------------------------------

    async def begin(self, *, viewport: tuple[int, int], headers: dict[str, str]) -> None:
        """Dress the tab for a task: its viewport and extra request headers."""
        self.uses += 1
        if viewport != self._viewport:
            await self.page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
            self._viewport = viewport
        if headers:
            await self.context.set_extra_http_headers(headers)
            self._headers_set = True

    async def screenshot(self, *, fmt: str, quality: int | None, clip_height: int | None) -> bytes:
        """The viewport, or the top ``clip_height`` CSS pixels of the page at viewport width.

        Straight through CDP with ``optimizeForSpeed``: Chromium encodes with its fast settings,
        which halves the cost of a full-page PNG (measured on 4,200 px pages: 245 ms against
        Playwright's 500 ms, for a file 25% larger; still lossless). Playwright's
        ``page.screenshot`` also settles CSS animations and hides the caret first; a scraper's
        screenshot records the page as it is.
        """
        params: dict[str, Any] = {"format": fmt, "optimizeForSpeed": True}
        if fmt == "jpeg" and quality:
            params["quality"] = quality
        if clip_height is not None:
            width = self._viewport[0] if self._viewport else (self.page.viewport_size or {"width": 1280})["width"]
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": clip_height, "scale": 1}
        data = await self._cdp("Page.captureScreenshot", params)
        return base64.b64decode(data["data"])

    async def pause(self) -> None:
        """Stop the last task's page from running scripts (timers, animation frames) while its
        wipe waits; ``wipe`` turns them back on once the page has left."""
        self._paused = True
        await self._cdp("Emulation.setScriptExecutionDisabled", {"value": True})

    async def wipe(self) -> None:
        """Remove every trace of the last task (raises when the tab cannot be trusted any more)."""
        async with asyncio.timeout(WIPE_TIMEOUT):
            for extra in self.context.pages:
                if extra is not self.page:
                    await extra.close()
            await self.context.unroute_all(behavior="ignoreErrors")
            await self.page.goto("about:blank", wait_until="load")
            if self._paused:
                await self._cdp("Emulation.setScriptExecutionDisabled", {"value": False})
                self._paused = False
            await self._cdp("Page.resetNavigationHistory")
            await self.page.evaluate("() => { window.name = ''; }")
            await self.context.clear_cookies()
            await self.context.clear_permissions()
            origins, self.origins = self.origins, set()
            await asyncio.gather(*(self._cdp("Storage.clearDataForOrigin", {"origin": o, "storageTypes": "all"})
                                   for o in origins))
            await self._cdp("Network.clearBrowserCache")
            if self._headers_set:
                await self.context.set_extra_http_headers({})
                self._headers_set = False

    async def _cdp(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A CDP call on the tab's page; the session is re-attached once if the page's target
        was swapped under it (seen after cross-process navigations: "Not attached")."""
        try:
            return await self.cdp.send(method, params)
        except PlaywrightError:
            self.cdp = await self.context.new_cdp_session(self.page)
            return await self.cdp.send(method, params)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.context.close(), 10)

    # -- events -----------------------------------------------------------------------------

    def _seen(self, request: Request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https") and parts.netloc:
            self.origins.add(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")
            if parts.username is not None:
                # Credentials in a request URL (an XHR given a user and password shows up this
                # way too) go into the context's HTTP auth cache, which no CDP call clears: the
                # next task on this tab would send them unasked. Such a tab is closed, not wiped.
                self.broken = True

    def _crashed(self, _: Page) -> None:
        self.broken = True

    def _dialog(self, dialog: Dialog) -> None:
        # Dismiss alerts, confirms and prompts; accept "leave this page?" so navigation proceeds.
        # Playwright's client does the same when a page has no dialog listener; ours says so here
        # rather than leaving the worker's behaviour to a default of the library.
        action = dialog.accept() if dialog.type == "beforeunload" else dialog.dismiss()
        self._background(action)

    def _popup(self, popup: Page) -> None:
        if popup is not self.page:
            self._background(popup.close())

    def _background(self, awaitable: Any) -> None:
        """Run a small page chore without waiting for it; failures (page gone) do not matter."""
        chore = asyncio.ensure_future(awaitable)
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)
        chore.add_done_callback(lambda done: done.cancelled() or done.exception())
