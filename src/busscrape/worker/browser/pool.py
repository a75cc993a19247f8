"""One Chromium per worker process: launched once, relaunched after a crash, recycled when old.

``BrowserPool`` hands out isolated browser contexts (``async with pool.context(...) as ctx``).
All traffic goes through the worker's egress proxy. The pool watches the browser:

- disconnected (crashed, killed): in-flight contexts fail (their tasks are retried) and the
  next ``context()`` relaunches it;
- old: after ``recycle_after_tasks`` contexts, or when Chromium's processes use more than
  ``recycle_rss``, the pool stops handing out contexts, lets the open ones finish, relaunches;
- on exit (and on relaunch) every Chromium process it started is gone: it closes the browser
  and then kills whatever is left of its process tree, so no zombies stay behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog
from playwright.async_api import Browser, Playwright
from playwright.async_api import Error as PlaywrightError

from busscrape.errors import BrowserCrashed
from busscrape.ops.lifeline import running
from busscrape.settings import BrowserSettings
from busscrape.worker.browser.chromium import PROXIED_ARGS, launch_args, launch_env, require_chromium
from busscrape.worker.browser.driver import playwright
from busscrape.worker.browser.tabs import Tab

log = structlog.get_logger("busscrape.browser")

# V8 heap per tab: a page that allocates without end crashes its own tab quickly instead of
# eating the host's memory first.
JS_HEAP_MB = 1024


class BrowserPool:
    """Launches and supervises the worker's Chromium. Async context manager; enter once."""

    def __init__(self, settings: BrowserSettings, *, proxy_url: str | None, recycle_after_tasks: int,
                 recycle_rss: int, isolation: str = "tab", tab_max_uses: int = 100,
                 tab_wipe_delay: float = 0.0, idle_tabs: int = 8,
                 driver: asyncio.Future[Playwright] | None = None) -> None:
        self.settings = settings
        self._driver = driver
        """Playwright's driver when it was started ahead (``browser.driver``); the pool stops it."""
        self.proxy_url = proxy_url
        self.recycle_after_tasks = recycle_after_tasks
        self.recycle_rss = recycle_rss
        self.binary = require_chromium(settings)
        self.restarts = 0
        self.version = ""
        self._marker = f"--busscrape-pool={uuid.uuid4().hex}"
        self._pw: Playwright | None = None
        self._browser: Browser | None = None
        self._tasks_since_launch = 0
        self._open = 0
        self._idle = asyncio.Condition()
        self._launch_lock = asyncio.Lock()
        self._recycling = False
        self._entered = False
        self.isolation = isolation
        self.tab_max_uses = tab_max_uses
        self._tabs: dict[tuple[str | None, str | None], list[Tab]] = {}
        self.tab_wipe_delay = tab_wipe_delay
        self.idle_tabs = idle_tabs
        """Wiped tabs kept ready, over all user agents (each distinct ``user_agent`` needs its own)."""
        self._wiping: set[asyncio.Task[None]] = set()
        self._wanted = asyncio.Event()  # set while a task waits for a tab: deferred wipes start now
        self._waiting = 0
        self._shelved = 0
        self._returned = asyncio.Event()  # set once a task's tab has come back (wiped or closed)

    async def __aenter__(self) -> BrowserPool:
        if self._entered:
            raise RuntimeError("a BrowserPool can be entered only once")
        self._entered = True
        self._pw = await (self._driver if self._driver is not None else playwright().start())
        await self._launch()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close_browser()
        if self._pw is not None:
            with contextlib.suppress(Exception):
                await self._pw.stop()
        self._kill_leftovers()

    @property
    def up(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    @property
    def contexts(self) -> int:
        """Browser contexts open now: tabs in use, being wiped and ready."""
        return len(self._browser.contexts) if self._browser is not None else 0

    # -- launching --------------------------------------------------------------------------

    async def _launch(self) -> None:
        assert self._pw is not None
        extra = (self._marker, f"--js-flags=--max-old-space-size={JS_HEAP_MB}")
        args = launch_args(self.settings, extra + (PROXIED_ARGS if self.proxy_url else ()))
        proxy: Any = {"server": self.proxy_url, "bypass": "<-loopback>"} if self.proxy_url else None
        self._browser = await self._pw.chromium.launch(
            executable_path=self.binary.path, headless=self.settings.headless, args=args, proxy=proxy,
            env=launch_env(), handle_sigint=False, handle_sigterm=False, handle_sighup=False,
        )
        self.version = self._browser.version
        self._tasks_since_launch = 0
        browser = self._browser
        browser.on("disconnected", lambda _: None if browser is not self._browser else log.warning(
            "browser.disconnected", restarts=self.restarts))
        log.info("browser.launched", version=self.version, source=self.binary.source, restarts=self.restarts,
                 pool=self._marker.split("=", 1)[1])
        if self.settings.headless and not self.binary.headless_shell and not self.restarts:
            log.warning("browser.not_a_headless_shell", path=self.binary.path,
                        hint="a page whose subresource asks for HTTP authentication hangs until the "
                             "navigation times out; install chromium-headless-shell (see worker/browser/chromium.py)")

    async def _close_browser(self) -> None:
        for wipe in list(self._wiping):
            wipe.cancel()
        await asyncio.gather(*self._wiping, return_exceptions=True)
        tabs = [t for ts in self._tabs.values() for t in ts]
        self._tabs.clear()
        for tab in tabs:
            await tab.close()
        processes = self.pids()
        browser, self._browser = self._browser, None
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 15)
        self._kill_leftovers()
        # A SIGKILL takes effect a moment later: a relaunch must not run beside the old Chromium.
        await exited(processes)

    async def _ensure(self) -> Browser:
        async with self._launch_lock:
            if self._recycling or not self.up:
                crashed = not self._recycling and self._browser is not None
                await self._wait_idle()
                await self._close_browser()
                self.restarts += 1
                if crashed:
                    log.warning("browser.relaunch_after_crash", restarts=self.restarts)
                await self._launch()
                self._recycling = False
            assert self._browser is not None
            return self._browser

    async def _wait_idle(self) -> None:
        async with self._idle:
            await self._idle.wait_for(lambda: self._open == 0)

    # -- contexts ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def tab(self, *, user_agent: str | None = None, proxy: str | None = None,
                  session: dict[str, Any] | None = None) -> AsyncIterator[Tab]:
        """An isolated tab for one task: a wiped, reused one (``isolation="tab"``) or a fresh
        context (``isolation="context"``). Nothing one task leaves is visible to the next."""
        browser = await self._ensure()
        # A session's tab is its own context, loaded with the session's state and closed after
        # the task: no other task ever sees it.
        tab = None if session is not None else await self._idle_tab((user_agent, proxy))
        if tab is None:
            try:
                tab = await Tab.open(browser, user_agent=user_agent, proxy=proxy, generation=self.restarts,
                                     storage_state=session)
                tab.private = session is not None
            except PlaywrightError as exc:
                raise BrowserCrashed(f"cannot open a browser context: {exc.message}") from None
        self._open += 1
        self._tasks_since_launch += 1
        try:
            yield tab
        finally:
            self._check_age()  # now, not after the wipe: the next task must see a recycle due
            if self._reusable(tab):
                # Wipe after the task has left: its result need not wait for the clean-up. With
                # another tab ready, later still, so that it does not slow the result down either.
                defer = self.tab_wipe_delay if self._tabs.get(tab.kind) else 0.0
                wipe = asyncio.create_task(self._wipe(tab, defer))
                self._wiping.add(wipe)
                wipe.add_done_callback(self._wiping.discard)
            else:
                await self._retire(tab)

    async def prewarm(self, count: int, *, ready: int | None = None, rest_after: float = 0.0) -> None:
        """Open ``count`` tabs ahead of the first tasks (a new tab costs a renderer start).

        With ``ready``, return once that many are open and let the others open in the
        background: a worker's first task needs one tab, and on a small machine four renderers
        starting at once take several times as long as one. A task that finds no tab ready
        waits for one of those (as for a wipe) instead of opening its own.

        With ``rest_after``, the others start opening only once a task's tab has come back or
        that many seconds have passed: the first page then renders alone, without renderers
        starting and pages loading beside it."""
        if self.isolation != "tab" or count < 1:
            return
        browser = await self._ensure()
        first = min(count, ready if ready is not None else count)
        opened = await asyncio.gather(*(Tab.open(browser, user_agent=None, generation=self.restarts)
                                        for _ in range(first)), return_exceptions=True)
        self._tabs.setdefault((None, None), []).extend(t for t in opened if isinstance(t, Tab))
        for _ in range(count - first):
            warming = asyncio.create_task(self._warm(browser, rest_after))
            self._wiping.add(warming)  # on its way to the shelf, like a tab being wiped
            warming.add_done_callback(self._wiping.discard)

    async def _warm(self, browser: Browser, after: float) -> None:
        if after > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(after):
                    await self._returned.wait()
        try:
            tab = await Tab.open(browser, user_agent=None, generation=self.restarts)
        except PlaywrightError as exc:
            log.warning("tab.prewarm_failed", error=exc.message[:200])
            return
        for old in self._shelve(tab):
            await old.close()

    async def _idle_tab(self, kind: tuple[str | None, str | None]) -> Tab | None:
        while True:
            tabs = self._tabs.get(kind, [])
            while tabs:
                tab = tabs.pop()
                if tab.generation == self.restarts and self.up:
                    return tab
                await tab.close()
            if not self._wiping:
                return None
            # A tab is being wiped: waiting for it beats opening a new one (~4x the cost).
            self._waiting += 1
            self._wanted.set()
            try:
                await asyncio.wait(set(self._wiping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self._wanted.clear()

    def _reusable(self, tab: Tab) -> bool:
        return (self.isolation == "tab" and not tab.private and not tab.broken and tab.uses < self.tab_max_uses
                and tab.generation == self.restarts and self.up and not self._recycling)

    async def _wipe(self, tab: Tab, defer: float = 0.0) -> None:
        try:
            if defer > 0:
                await tab.pause()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(defer):
                        await self._wanted.wait()
            await tab.wipe()
        except Exception as exc:
            log.warning("tab.discarded", error=str(exc)[:200])
            await self._retire(tab)
            return
        if self._reusable(tab):
            surplus = self._shelve(tab)
            await self._done(tab)
            for old in surplus:
                await old.close()
        else:
            await self._retire(tab)

    def _shelve(self, tab: Tab) -> list[Tab]:
        """Keep a wiped tab ready; return the idle tabs that no longer fit in ``idle_tabs``, the
        longest idle first (tasks with many distinct user agents would otherwise keep a tab
        for each until the next recycle)."""
        self._shelved += 1
        tab.shelved = self._shelved
        self._tabs.setdefault(tab.kind, []).append(tab)
        idle = sorted((t for ts in self._tabs.values() for t in ts), key=lambda t: t.shelved)
        surplus = idle[:max(len(idle) - self.idle_tabs, 0)]
        for old in surplus:
            self._tabs[old.kind].remove(old)
            if not self._tabs[old.kind]:
                del self._tabs[old.kind]
        return surplus

    async def _retire(self, tab: Tab) -> None:
        await tab.close()
        await self._done(tab)

    async def _done(self, tab: Tab) -> None:
        """A task's tab is back (idle or closed): count it, and maybe recycle the browser."""
        self._open -= 1
        self._returned.set()
        self._check_age()
        async with self._idle:
            self._idle.notify_all()

    def _check_age(self) -> None:
        if self._recycling:
            return
        if self._tasks_since_launch >= self.recycle_after_tasks:
            self._recycling = True
            log.info("browser.recycle", reason="tasks", tasks=self._tasks_since_launch)
        elif self._tasks_since_launch % 25 == 0 and (rss := self.rss()) > self.recycle_rss:
            self._recycling = True
            log.info("browser.recycle", reason="memory", rss=rss, limit=self.recycle_rss)

    # -- processes --------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Every process of this pool's Chromium: the browser (found by its marker) and descendants."""
        children: dict[int, list[int]] = {}
        roots = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
                if self._marker.encode() in (entry / "cmdline").read_bytes():
                    roots.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        found, stack = [], list(roots)
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.append(pid)
                stack.extend(children.get(pid, []))
        return found

    def rss(self) -> int:
        """Proportional memory of Chromium's processes in bytes (PSS: shared pages counted once)."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        return total

    def _kill_leftovers(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


async def exited(pids: list[int], timeout: float = 10.0) -> None:
    """Wait (up to ``timeout``) until each process has exited: gone, or a zombie (its memory and
    CPU given back; only its parent's reaping is left)."""
    for _ in range(int(timeout / 0.05)):  # polled: /proc offers nothing to wait on
        if not any(running(pid) for pid in pids):
            return
        await asyncio.sleep(0.05)
