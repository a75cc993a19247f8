"""Renders one task in an isolated tab (``browser.tabs``) and captures what it asked for.

One render, in order::

    policy check of the URL ─► a tab from the pool ─► watch the page (failed requests, an
    oversize document, the HAR) ─► navigate ─► the status policy's verdict
    ─► the task's steps ─► capture (``capture``: DOM, HTML, screenshot, HAR)

Every way a page can fail becomes an error class that says what happens to the task
(``page_errors``). Durations are seconds here, as everywhere in busscrape; they turn into
Playwright's milliseconds only in the calls that take them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request, Response, Route
from playwright.async_api import TimeoutError as PlaywrightTimeout

from busscrape.artifacts.files import CONTENT_TYPES, screenshot_file
from busscrape.errors import LimitExceeded, NavigationTimeout, PermanentStatus, RetryableStatus
from busscrape.model.messages import ScrapeTask
from busscrape.net.egress import EgressProxy
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import WorkerSettings
from busscrape.telemetry import tracing
from busscrape.worker.browser.pool import BrowserPool
from busscrape.worker.browser.tabs import Tab
from busscrape.worker.capture import Capture, Capturer, Rendered, Visit
from busscrape.worker.har import HarRecorder
from busscrape.worker.page_errors import first_line, navigation_error, page_error, retry_after_seconds
from busscrape.worker.status_policy import StatusPolicy
from busscrape.worker.step_runner import run_steps
from busscrape.worker.warc import PayloadIndex, WarcRecorder

__all__ = ["Capture", "Rendered", "Renderer"]


@dataclass
class _Watch:
    """What the page's listeners saw during one render; they leave with the task (the tab stays)."""

    page: Page
    failed: list[tuple[str, str]] = field(default_factory=list)
    oversize: int | None = None
    """The Content-Length of a main document over ``max_page_bytes`` (the page was closed)."""
    har: HarRecorder | None = None
    warc: WarcRecorder | None = None
    listeners: list[tuple[str, Any]] = field(default_factory=list)

    def on(self, event: str, handler: Any) -> None:
        self.page.on(event, handler)
        self.listeners.append((event, handler))

    def detach(self) -> None:
        for event, handler in self.listeners:
            with contextlib.suppress(Exception):
                self.page.remove_listener(event, handler)


class Renderer:
    def __init__(self, pool: BrowserPool, policy: NetworkPolicy, egress: EgressProxy | None,
                 settings: WorkerSettings) -> None:
        self.pool = pool
        self.policy = policy
        self.egress = egress
        self.settings = settings
        self.statuses = StatusPolicy.parse(settings.retry_statuses, settings.dead_statuses)
        self.capturer = Capturer(settings, browser_version=lambda: pool.version)
        self._chores: set[asyncio.Future[Any]] = set()
        self.payloads = PayloadIndex()
        """The payloads this worker's WARCs hold: a later page's identical ones are revisits."""

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a page chore (close an oversize page) without waiting; failures do not matter."""
        chore = asyncio.ensure_future(coro)
        self._chores.add(chore)
        chore.add_done_callback(lambda done: (self._chores.discard(done), done.cancelled() or done.exception()))

    async def render(self, task: ScrapeTask, follow: str | None = None) -> Rendered:
        """``follow``: the CSS selector of the links to read from the page (crawl tasks)."""
        opts = task.options
        await self.policy.check_url(task.url)
        async with self.pool.tab(user_agent=opts.user_agent) as tab:
            try:
                await tab.begin(viewport=(opts.viewport.width, opts.viewport.height), headers=dict(opts.headers))
                watch = await self._watch(tab, task)
                try:
                    return await self._visit(tab, task, watch, follow)
                except BaseException:
                    if watch.warc is not None:
                        watch.warc.close()  # its temporary file: no capture will carry it
                    raise
                finally:
                    watch.detach()
            except PlaywrightTimeout as exc:
                raise NavigationTimeout(f"{task.url}: {first_line(exc)}", reason="page_timeout") from None
            except PlaywrightError as exc:
                raise page_error(task.url, exc) from None

    async def _watch(self, tab: Tab, task: ScrapeTask) -> _Watch:
        """Routes and listeners for this task: blocked resource types, failed requests, an
        oversize main document (stopped by its Content-Length before the browser spends a minute
        parsing it; pages without one are checked after rendering), the HAR."""
        opts = task.options
        page = tab.page
        watch = _Watch(page)
        if opts.block_resources:
            blocked_types = set(opts.block_resources)

            async def block(route: Route) -> None:
                if route.request.resource_type in blocked_types:
                    await route.abort("blockedbyclient")
                else:
                    await route.fallback()

            await tab.context.route("**/*", block)

        def on_failed(request: Request) -> None:
            watch.failed.append((request.url, request.failure or ""))

        def check_size(response: Response) -> None:
            length = response.headers.get("content-length", "")
            if (length.isdigit() and int(length) > self.settings.max_page_bytes
                    and response.request.is_navigation_request() and response.frame == page.main_frame):
                watch.oversize = int(length)
                self._spawn(page.close())

        watch.on("requestfailed", on_failed)
        watch.on("response", check_size)
        if "har" in opts.artifacts:
            watch.har = HarRecorder(page, embed_bodies=opts.har_content == "embed",
                                    max_total_bytes=self.settings.max_har_bytes)
            watch.listeners.extend(watch.har.listeners())
        if "warc" in opts.artifacts:
            watch.warc = WarcRecorder(page, max_body_bytes=self.settings.max_warc_body_bytes,
                                      max_total_bytes=self.settings.max_warc_bytes, payloads=self.payloads,
                                      browser_version=self.pool.version)
            watch.listeners.extend(watch.warc.listeners())
        return watch

    async def _visit(self, tab: Tab, task: ScrapeTask, watch: _Watch, follow: str | None = None) -> Rendered:
        started = time.perf_counter()
        timeout = task.options.navigation_timeout or self.settings.navigation_timeout
        tab.page.set_default_timeout(timeout * 1000)
        response = await self._navigate(tab.page, task, watch, timeout)
        navigated = time.perf_counter()
        status, headers, chain = self._answer(tab.page, response)
        shots = await self._steps(tab, task, timeout)
        stepped = time.perf_counter()
        visit = Visit(tab, task, status, headers, chain, watch.failed, shots, watch.har,
                      {"navigation": _ms(navigated - started), "steps": _ms(stepped - navigated)}, warc=watch.warc,
                      follow=follow)
        with tracing.span("capture", artifacts=",".join(task.options.artifacts)):
            rendered = await self.capturer.capture(visit)
        done = time.perf_counter()
        rendered.timings["capture"] = _ms(done - stepped)
        rendered.timings["total"] = _ms(done - started)
        return rendered

    async def _navigate(self, page: Page, task: ScrapeTask, watch: _Watch, timeout: float) -> Response | None:
        since = time.monotonic()
        wait_until = task.options.wait_until
        try:
            with tracing.span("navigate", **{"url.full": task.url, "busscrape.wait_until": wait_until}):
                return await page.goto(task.url, wait_until=wait_until, timeout=timeout * 1000)
        except PlaywrightError as exc:  # a timeout too: a loaded browser may not close the page in time
            if watch.oversize is not None:
                raise LimitExceeded(f"{task.url} is {watch.oversize} bytes, over max_page_bytes "
                                    f"{self.settings.max_page_bytes}", reason="page_too_large") from None
            if isinstance(exc, PlaywrightTimeout):
                raise NavigationTimeout(f"navigation to {task.url} did not finish in {timeout:.0f}s "
                                        f"(wait_until={wait_until})") from None
            raise navigation_error(task.url, exc, self._refusal_for(task.url, watch.failed, since)) from None

    def _answer(self, page: Page, response: Response | None) -> tuple[int | None, dict[str, str], tuple[str, ...]]:
        """Status, headers and redirect chain of the main document; the status policy's verdict
        raised as the error it stands for."""
        status = response.status if response is not None else None
        headers = dict(response.headers) if response is not None else {}
        chain: list[str] = []
        request = response.request.redirected_from if response is not None else None
        while request is not None:
            chain.append(request.url)
            request = request.redirected_from
        verdict = self.statuses.verdict(status)
        if verdict == "retry":
            raise RetryableStatus(f"HTTP {status} from {page.url}", reason=f"http_{status}",
                                  retry_after=retry_after_seconds(headers.get("retry-after")))
        if verdict == "dead":
            raise PermanentStatus(f"HTTP {status} from {page.url}", reason=f"http_{status}")
        return status, headers, tuple(reversed(chain))

    async def _steps(self, tab: Tab, task: ScrapeTask, timeout: float) -> list[Capture]:
        """Run the task's steps; the screenshots they took."""
        shots: list[Capture] = []
        kind = CONTENT_TYPES[task.options.screenshot.format]

        async def extra_shot(name: str, full_page: bool) -> None:
            data = await self.capturer.screenshot(tab, task, full_page=full_page, height=None)
            shots.append(Capture(screenshot_file(task, name), "extra_screenshot", kind, data))

        await run_steps(tab.page, task.steps, default_timeout=timeout, allow_evaluate=self.settings.allow_evaluate,
                        check_url=self.policy.check_url, take_screenshot=extra_shot)
        return shots

    def _refusal_for(self, url: str, failed: list[tuple[str, str]], since: float) -> str | None:
        """The egress proxy's reason for any connection of this navigation it refused."""
        if self.egress is None:
            return None
        for candidate in [url, *(u for u, _ in failed)]:
            try:
                parts = urlsplit(candidate)
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                continue
            if parts.hostname and (why := self.egress.explain(parts.hostname, port, since)):
                return f"{parts.hostname}:{port}: {why}"
        return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
