"""Renders one task in an isolated tab (``busscrape.tabs``) and captures what it asked for.

Navigation (policy-checked), status policy, steps, then one round trip to the page for the
rendered DOM, title, visible text and timings, a screenshot (height-capped), a HAR. Every way a
page can fail is turned into an error class that says what happens to the task:
timeouts and network errors are retried, blocked addresses, downloads, redirect loops and
oversize pages are dead-lettered, a crashed tab or browser is retried on a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request, Response, Route
from playwright.async_api import TimeoutError as PlaywrightTimeout

from busscrape.errors import (
    BrowserCrashed,
    LimitExceeded,
    NavigationTimeout,
    PageNetworkError,
    PermanentError,
    PermanentStatus,
    PolicyBlocked,
    RetryableStatus,
)
from busscrape.model.messages import ScrapeTask
from busscrape.model.steps import Screenshot
from busscrape.net.egress import EgressProxy
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import WorkerSettings
from busscrape.telemetry import tracing
from busscrape.worker.browser.pool import BrowserPool
from busscrape.worker.browser.tabs import Tab
from busscrape.worker.har import HarRecorder
from busscrape.worker.politeness import HostGate
from busscrape.worker.status_policy import StatusPolicy
from busscrape.worker.step_runner import run_steps

CONTENT_TYPES = {"html": "text/html; charset=utf-8", "text": "text/plain; charset=utf-8",
                 "har": "application/json", "png": "image/png", "jpeg": "image/jpeg"}
HTML_FILE, TEXT_FILE, HAR_FILE = "page.html", "page.txt", "page.har"

# One round trip for what is read from the DOM after the steps (the HTML itself comes from
# page.content(), which moves large documents faster than an evaluate() return value).
_CAPTURE_JS = """(wantText) => {
  const nav = performance.getEntriesByType('navigation')[0];
  const root = document.documentElement;
  return {
    title: document.title || '',
    text: wantText && document.body ? document.body.innerText : '',
    height: Math.max(root ? root.scrollHeight : 0, document.body ? document.body.scrollHeight : 0),
    width: root ? root.clientWidth : 0,
    timing: nav ? {ttfb: nav.responseStart, dom_content_loaded: nav.domContentLoadedEventEnd,
                   load: nav.loadEventEnd} : {},
  };
}"""

# Playwright/Chromium error text -> (error class, reason). First match wins.
_NAV_ERRORS: list[tuple[str, type, str]] = [
    ("Download is starting", PermanentError, "download"),
    ("ERR_TOO_MANY_REDIRECTS", PermanentError, "redirect_loop"),
    ("ERR_INVALID_REDIRECT", PermanentError, "invalid_redirect"),
    ("ERR_UNSAFE_REDIRECT", PolicyBlocked, "blocked_redirect"),
    ("ERR_UNKNOWN_URL_SCHEME", PolicyBlocked, "blocked_scheme"),
    ("ERR_NAME_NOT_RESOLVED", PageNetworkError, "dns_error"),
    ("ERR_SOCKS_CONNECTION_HOST_UNREACHABLE", PageNetworkError, "dns_error"),
    ("crash", BrowserCrashed, "page_crashed"),
    ("Target page, context or browser has been closed", BrowserCrashed, "browser_crashed"),
    ("Target closed", BrowserCrashed, "browser_crashed"),
    ("net::", PageNetworkError, "network_error"),
]


def screenshot_file(task: ScrapeTask, step: str | None = None) -> str:
    """``screenshot.png`` for the page, ``shot-<step>.png`` for a screenshot step (``.jpg`` for JPEG)."""
    ext = "jpg" if task.options.screenshot.format == "jpeg" else "png"
    return f"shot-{step}.{ext}" if step else f"screenshot.{ext}"


def capture_files(task: ScrapeTask) -> list[str]:
    """Every file a render of ``task`` stores: how the objects of an attempt that died are found."""
    wanted = task.options.artifacts
    files = [file for kind, file in (("html", HTML_FILE), ("text", TEXT_FILE), ("har", HAR_FILE)) if kind in wanted]
    if "screenshot" in wanted:
        files.append(screenshot_file(task))
    return files + [screenshot_file(task, step.name) for step in task.steps if isinstance(step, Screenshot)]


@dataclass(frozen=True)
class Capture:
    file: str
    kind: str
    content_type: str
    data: bytes


@dataclass
class Rendered:
    final_url: str
    status: int | None
    redirect_chain: tuple[str, ...]
    response_headers: dict[str, str]
    title: str
    timings: dict[str, float]
    captures: list[Capture] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)
    har_bodies_dropped: bool = False


@dataclass
class _Visit:
    """What navigation and steps left for the capture."""

    tab: Tab
    task: ScrapeTask
    status: int | None
    headers: dict[str, str]
    chain: tuple[str, ...]
    failed: list[tuple[str, str]]
    shots: list[Capture]
    har: HarRecorder | None
    timings: dict[str, float]

    @property
    def page(self) -> Page:
        return self.tab.page


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


class Renderer:
    def __init__(self, pool: BrowserPool, policy: NetworkPolicy, egress: EgressProxy | None,
                 settings: WorkerSettings, gate: HostGate | None = None) -> None:
        self.pool = pool
        self.gate = gate
        self.policy = policy
        self.egress = egress
        self.settings = settings
        self.statuses = StatusPolicy.parse(settings.retry_statuses, settings.dead_statuses)
        self._chores: set[asyncio.Future[Any]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a page chore (close a popup, dismiss a dialog) without waiting; failures do not matter."""
        chore = asyncio.ensure_future(coro)
        self._chores.add(chore)
        chore.add_done_callback(lambda done: (self._chores.discard(done), done.cancelled() or done.exception()))

    async def render(self, task: ScrapeTask) -> Rendered:
        opts = task.options
        await self.policy.check_url(task.url)
        async with self.pool.tab(user_agent=opts.user_agent) as tab:
            try:
                await tab.begin(viewport=(opts.viewport.width, opts.viewport.height), headers=dict(opts.headers))
                return await self._render_in(tab, task)
            except PlaywrightTimeout as exc:
                raise NavigationTimeout(f"{task.url}: {_first_line(exc)}", reason="page_timeout") from None
            except PlaywrightError as exc:
                # After navigation: the page crashed, closed itself, or the browser went away.
                message = _first_line(exc)
                for needle, kind, reason in _NAV_ERRORS:
                    if needle in message and kind is BrowserCrashed:
                        raise BrowserCrashed(f"{task.url}: {message}", reason=reason) from None
                raise PageNetworkError(f"{task.url}: {message}", reason="page_error") from None

    async def _render_in(self, tab: Tab, task: ScrapeTask) -> Rendered:
        """Render on a tab; the listeners of this task leave with it (the tab is reused)."""
        listeners: list[tuple[str, Any]] = []
        try:
            return await self._visit(tab, task, listeners)
        finally:
            for event, handler in listeners:
                with contextlib.suppress(Exception):
                    tab.page.remove_listener(event, handler)

    async def _visit(self, tab: Tab, task: ScrapeTask, listeners: list[tuple[str, Any]]) -> Rendered:
        opts = task.options
        started = time.perf_counter()
        since = time.monotonic()
        nav_timeout = (opts.navigation_timeout or self.settings.navigation_timeout) * 1000
        if opts.block_resources:
            blocked_types = set(opts.block_resources)

            async def block(route: Route) -> None:
                if route.request.resource_type in blocked_types:
                    await route.abort("blockedbyclient")
                else:
                    await route.fallback()

            await tab.context.route("**/*", block)
        page = tab.page
        page.set_default_timeout(nav_timeout)
        failed: list[tuple[str, str]] = []

        def on_failed(request: Request) -> None:
            failed.append((request.url, request.failure or ""))

        page.on("requestfailed", on_failed)
        listeners.append(("requestfailed", on_failed))
        oversize: list[int] = []

        def check_size(response: Response) -> None:
            # A document whose Content-Length is over the limit is stopped before the browser
            # spends a minute parsing it (pages without one are checked after rendering).
            length = response.headers.get("content-length", "")
            if (length.isdigit() and int(length) > self.settings.max_page_bytes
                    and response.request.is_navigation_request() and response.frame == page.main_frame):
                oversize.append(int(length))
                self._spawn(page.close())

        page.on("response", check_size)
        listeners.append(("response", check_size))
        har = HarRecorder(page, embed_bodies=opts.har_content == "embed") if "har" in opts.artifacts else None
        if har is not None:
            listeners.extend(har.listeners())

        if self.gate is not None:
            await self.gate.pace(urlsplit(task.url).hostname or "")
        try:
            with tracing.span("navigate", **{"url.full": task.url, "busscrape.wait_until": opts.wait_until}):
                response = await page.goto(task.url, wait_until=opts.wait_until, timeout=nav_timeout)
        except PlaywrightError as exc:  # a timeout too: a loaded browser may not close the page in time
            if oversize:
                raise LimitExceeded(f"{task.url} is {oversize[0]} bytes, over max_page_bytes "
                                    f"{self.settings.max_page_bytes}", reason="page_too_large") from None
            if isinstance(exc, PlaywrightTimeout):
                raise NavigationTimeout(f"navigation to {task.url} did not finish in {nav_timeout / 1000:.0f}s "
                                        f"(wait_until={opts.wait_until})") from None
            raise self._navigation_error(task.url, exc, failed, since) from None
        navigated = time.perf_counter()

        status = response.status if response is not None else None
        headers = response.headers if response is not None else {}
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

        shots: list[Capture] = []

        async def extra_shot(name: str, full_page: bool) -> None:
            data = await self._screenshot(tab, task, full_page=full_page, height=None)
            shots.append(Capture(screenshot_file(task, name), "extra_screenshot", CONTENT_TYPES[opts.screenshot.format],
                                 data))

        await run_steps(page, task.steps, default_timeout=nav_timeout / 1000,
                        allow_evaluate=self.settings.allow_evaluate, check_url=self.policy.check_url,
                        take_screenshot=extra_shot)
        stepped = time.perf_counter()
        visit = _Visit(tab, task, status, dict(headers), tuple(reversed(chain)), failed, shots, har,
                       {"navigation": _ms(started, navigated), "steps": _ms(navigated, stepped)})
        with tracing.span("capture", artifacts=",".join(opts.artifacts)):
            rendered = await self._capture(visit)
        rendered.timings["capture"] = _ms(stepped, time.perf_counter())
        rendered.timings["total"] = _ms(started, time.perf_counter())
        return rendered

    async def _capture(self, visit: _Visit) -> Rendered:
        page, task, har, timings = visit.page, visit.task, visit.har, visit.timings
        opts = task.options
        dom = await page.evaluate(_CAPTURE_JS, "text" in opts.artifacts)
        if "html" in opts.artifacts:
            dom["html"] = await page.content()
        rendered = self._captures(task, dom)
        if "screenshot" in opts.artifacts:
            data = await self._screenshot(visit.tab, task, full_page=opts.screenshot.full_page, height=dom["height"])
            rendered.insert(1 if rendered and rendered[0].kind == "html" else 0,
                            Capture(screenshot_file(task), "screenshot", CONTENT_TYPES[opts.screenshot.format], data))
        rendered += visit.shots
        dropped = False
        timings.update({k: round(v, 1) for k, v in (dom.get("timing") or {}).items() if v})
        if har is not None:
            har.page_title = dom["title"]
            await har.settle()
            try:
                data, dropped = har.build(browser_version=self.pool.version, max_bytes=self.settings.max_har_bytes,
                                          page_timings={"onContentLoad": timings.get("dom_content_loaded", -1),
                                                        "onLoad": timings.get("load", -1)})
            except ValueError as exc:
                raise LimitExceeded(str(exc), reason="har_too_large") from None
            rendered.append(Capture(HAR_FILE, "har", CONTENT_TYPES["har"], data))
        blocked = [url for url, why in visit.failed if "SOCKS" in why or "blockedbyclient" in why]
        return Rendered(final_url=page.url, status=visit.status, redirect_chain=visit.chain,
                        response_headers=visit.headers, title=dom["title"][:1000], timings=timings,
                        captures=rendered, blocked_requests=blocked[:100], har_bodies_dropped=dropped)

    def _captures(self, task: ScrapeTask, dom: dict) -> list[Capture]:
        out = []
        if "html" in task.options.artifacts:
            html = dom["html"].encode("utf-8", "surrogatepass")
            if len(html) > self.settings.max_page_bytes:
                raise LimitExceeded(f"rendered HTML is {len(html)} bytes, over max_page_bytes "
                                    f"{self.settings.max_page_bytes}", reason="page_too_large")
            out.append(Capture(HTML_FILE, "html", CONTENT_TYPES["html"], html))
        if "text" in task.options.artifacts:
            text = dom["text"].encode("utf-8", "surrogatepass")
            out.append(Capture(TEXT_FILE, "text", CONTENT_TYPES["text"], text[: self.settings.max_page_bytes]))
        return out

    async def _screenshot(self, tab: Tab, task: ScrapeTask, *, full_page: bool, height: int | None) -> bytes:
        shot = task.options.screenshot
        cap = self.settings.max_screenshot_height
        viewport = task.options.viewport
        page = tab.page
        try:
            async with asyncio.timeout(30):
                if full_page and height is None:
                    height = await page.evaluate("() => document.documentElement.scrollHeight")
                if not full_page or height <= viewport.height:
                    return await tab.screenshot(fmt=shot.format, quality=shot.quality, clip_height=None)
                if height <= cap:
                    return await tab.screenshot(fmt=shot.format, quality=shot.quality, clip_height=height)
                # Taller than the cap: a viewport as tall as the cap is several times faster than a
                # clipped full-page capture on heavy pages (measured: 2.7s vs 9.3s on a 20 MB page).
                await page.set_viewport_size({"width": viewport.width, "height": cap})
                try:
                    return await tab.screenshot(fmt=shot.format, quality=shot.quality, clip_height=None)
                finally:
                    await page.set_viewport_size({"width": viewport.width, "height": viewport.height})
        except TimeoutError:
            raise NavigationTimeout("screenshot did not finish in 30s", reason="screenshot_timeout") from None

    def _navigation_error(self, url: str, exc: PlaywrightError, failed: list[tuple[str, str]],
                          since: float) -> Exception:
        message = (exc.message or str(exc)).splitlines()[0][:500]
        if "ERR_SOCKS_CONNECTION_FAILED" in message or "ERR_PROXY" in message:
            reason = self._refusal_for(url, failed, since)
            if reason:
                return PolicyBlocked(f"navigation to {url} refused: {reason}", reason="blocked_address")
            return PageNetworkError(f"navigation to {url} failed: {message}")
        for needle, kind, reason in _NAV_ERRORS:
            if needle in message:
                return kind(f"navigation to {url} failed: {message}", reason=reason)
        return PageNetworkError(f"navigation to {url} failed: {message}")

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


def _first_line(exc: PlaywrightError) -> str:
    return (exc.message or str(exc)).splitlines()[0][:500]


def _ms(a: float, b: float) -> float:
    return round((b - a) * 1000, 1)
