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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import structlog
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request, Response, Route
from playwright.async_api import TimeoutError as PlaywrightTimeout

from busscrape.artifacts.files import CONTENT_TYPES, screenshot_file
from busscrape.errors import InvalidTask, LimitExceeded, NavigationTimeout, PermanentStatus, RetryableStatus
from busscrape.model.messages import ScrapeTask
from busscrape.net.egress import EgressProxy
from busscrape.net.egresses import Egresses
from busscrape.net.policy import NetworkPolicy
from busscrape.net.proxies import Proxies
from busscrape.net.upstream import Upstream
from busscrape.settings import WorkerSettings
from busscrape.telemetry import tracing
from busscrape.worker.bodies import ResponseBodies
from busscrape.worker.browser.compat import listen, storage_state
from busscrape.worker.browser.pool import BrowserPool
from busscrape.worker.browser.tabs import Tab
from busscrape.worker.capture import Capture, Capturer, Rendered, Visit
from busscrape.worker.har import HarRecorder
from busscrape.worker.leases import Deferred, Lease, Wait
from busscrape.worker.page_errors import (
    cut_off_by_network_change,
    first_line,
    navigation_error,
    page_error,
    retry_after_seconds,
)
from busscrape.worker.sessions import SessionRule, Sessions, Stored
from busscrape.worker.status_policy import StatusPolicy
from busscrape.worker.step_runner import run_steps
from busscrape.worker.warc import PayloadIndex, WarcRecorder

__all__ = ["Capture", "Rendered", "Renderer"]

log = structlog.get_logger("busscrape.worker")


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
        listen(self.page, event, handler)
        self.listeners.append((event, handler))

    def detach(self) -> None:
        for event, handler in self.listeners:
            with contextlib.suppress(Exception):
                self.page.remove_listener(event, handler)
        self.listeners.clear()

    def discard(self) -> None:
        """Drop what the recorders hold (the WARC's temporary file): nothing of it is captured."""
        if self.warc is not None:
            self.warc.close()


@dataclass(frozen=True)
class _Navigation:
    """The host's politeness around a render's navigation: ``before`` right before the page is
    requested, ``sent`` with the time the browser sent that request."""

    before: Callable[[], Awaitable[None]] | None
    sent: Callable[[float], Coroutine[Any, Any, None]] | None


class Renderer:
    def __init__(self, pool: BrowserPool, policy: NetworkPolicy, egress: EgressProxy | Egresses | None,
                 settings: WorkerSettings, proxies: Proxies | None = None,
                 sessions: Sessions | None = None) -> None:
        self.pool = pool
        self.policy = policy
        self.egress = egress
        self.proxies = proxies
        self.sessions = sessions
        self.settings = settings
        self.statuses = StatusPolicy.parse(settings.retry_statuses, settings.dead_statuses)
        self.capturer = Capturer(settings, browser_version=lambda: pool.version)
        self._chores: set[asyncio.Future[Any]] = set()
        self.payloads = PayloadIndex()
        """The payloads of the archived WARCs of this worker: with ``warc_revisits = "worker"`` a
        later page's identical ones are revisits (the worker adds a page's once its result stands)."""

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a page chore (close an oversize page) without waiting; failures do not matter."""
        chore = asyncio.ensure_future(coro)
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)
        chore.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def render(self, task: ScrapeTask, before_navigation: Callable[[], Awaitable[None]] | None = None,
                     follow: str | None = None,
                     sent: Callable[[float], Coroutine[Any, Any, None]] | None = None) -> Rendered:
        """``before_navigation`` runs right before the page is requested (the host's start is
        taken there: page set-up time does not shift it); what it raises ends the render.
        ``sent`` is told when the browser sent that request (wall clock; the host's delay counts
        from there). ``follow``: the CSS selector of the links to read from the page (crawl tasks)."""
        nav = _Navigation(before_navigation, sent)
        await self.policy.check_url(task.url)
        name = task.options.session
        if name is None:
            return await self._render(task, nav, None, follow)
        if self.sessions is None:
            raise InvalidTask(f"task names session {name!r} but this worker has no sessions file "
                              "(BUSSCRAPE_WORKER__SESSIONS_FILE)", reason="unknown_session")
        rule = self.sessions.rule(name)
        async with self.sessions.lock(name):  # one login per session, not one per slot
            return await self._render(task, nav, rule, follow)

    async def _render(self, task: ScrapeTask, nav: _Navigation,
                      rule: SessionRule | None, follow: str | None) -> Rendered:
        # An expired session is read too (its login count goes on), but starts from nothing.
        stored = await self.sessions.store.get(rule_name(task), expired=True) if rule and self.sessions else None
        lease = None
        if rule is not None and (stored is None or stored.expires_at <= time.time()):
            lease, stored = await self._claim_login(rule_name(task), stored)
        try:
            rendering = self._render_in_tab(task, nav, rule, follow, stored)
            # A login lease lost (expired, another worker logs in now) stops this login and render.
            return await (lease.guard(rendering) if lease is not None else rendering)
        finally:
            if lease is not None:
                await lease.release()

    async def _claim_login(self, name: str, stored: Stored | None, *,
                           failed_check: bool = False) -> tuple[Lease | None, Stored | None]:
        """A new or expired session, or one whose check just failed: the fleet's login lease, or
        a deferral of the task while another worker holds it. A login that worker stored
        meanwhile is used as it is: at once for a new session, and for a failed check by
        deferring the task (its page was loaded with the old state; it comes back with the new)."""
        assert self.sessions is not None
        lease = await self.sessions.claim_login(name)
        if lease is None:
            raise Deferred(Wait(self.sessions.login_wait, "session_login"))
        again = await self.sessions.store.get(name, expired=True)
        renewed = again is not None and again.expires_at > time.time() and (
            not failed_check or stored is None or again.logged_in_at > stored.logged_in_at)
        if renewed:
            await lease.release()
            if failed_check:
                raise Deferred(Wait(0.05, "session_login"))
            return None, again
        return lease, again if again is not None else stored

    async def _render_in_tab(self, task: ScrapeTask, nav: _Navigation,
                             rule: SessionRule | None, follow: str | None, stored: Stored | None) -> Rendered:
        opts = task.options
        upstream, listener = await self._proxy_for(task, stored.proxy if stored is not None else None)
        fresh = stored is not None and stored.expires_at > time.time()
        state = None if rule is None else stored.state if fresh and stored else {"cookies": [], "origins": []}
        relogin: Lease | None = None
        proxy = upstream.url if upstream is not None else None
        async with self.pool.tab(user_agent=opts.user_agent, proxy=listener, session=state) as tab:
            try:
                await tab.begin(viewport=(opts.viewport.width, opts.viewport.height), headers=dict(opts.headers))
                logged_in = rule is not None and not fresh
                if rule is not None and logged_in:
                    await self._login(tab, rule, task)
                    # Stored at once: should the visit be deferred (the host's start taken while
                    # the login ran), the next delivery uses this login instead of typing it again.
                    stored = await self._keep_session(tab, task, rule, stored, True, proxy)
                watch = await self._watch(tab, task)
                try:
                    rendered = await self._visit(tab, task, watch, nav, follow)
                    if rule is not None and not logged_in and not await _session_holds(tab.page, rule):
                        # The check failed: logged out. Logged in again once for the fleet, as a
                        # new session is: every worker whose page fails at once would log in.
                        relogin, stored = await self._claim_login(rule_name(task), stored, failed_check=True)
                        # Nothing records the login (its form holds the password): the
                        # recorders of the logged-out visit go, new ones record the visit again.
                        watch.detach()
                        watch.discard()
                        await self._login(tab, rule, task)
                        stored = await self._keep_session(tab, task, rule, stored, True, proxy)
                        watch = await self._watch(tab, task, block=False)
                        rendered = await self._visit(tab, task, watch, nav, follow)
                except BaseException:
                    watch.discard()  # its temporary file: no capture will carry it
                    raise
                finally:
                    watch.detach()
                rendered.proxy = proxy
                if rule is not None:  # the cookies the page set (the login is stored already)
                    await self._keep_session(tab, task, rule, stored, False, proxy)
                return rendered
            except PlaywrightTimeout as exc:
                raise NavigationTimeout(f"{task.url}: {first_line(exc)}", reason="page_timeout") from None
            except PlaywrightError as exc:
                raise page_error(task.url, exc) from None
            finally:
                if relogin is not None:  # held until the new login is stored
                    await relogin.release()

    async def _login(self, tab: Tab, rule: SessionRule, task: ScrapeTask) -> None:
        """The session's login: its page, its steps, the page left to settle."""
        assert self.sessions is not None
        timeout = task.options.navigation_timeout or self.settings.navigation_timeout
        await self.policy.check_url(rule.login_url)
        with tracing.span("session login", **{"busscrape.session": task.options.session or ""}):
            await tab.page.goto(rule.login_url, wait_until="load", timeout=timeout * 1000)
            await run_steps(tab.page, rule.login_steps, default_timeout=timeout, allow_evaluate=False,
                            check_url=self.policy.check_url, take_screenshot=_no_shots)
            await tab.page.wait_for_load_state("load", timeout=timeout * 1000)
        self.sessions.logins += 1
        log.info("session.logged_in", session=task.options.session)

    async def _keep_session(self, tab: Tab, task: ScrapeTask, rule: SessionRule, stored: Stored | None,
                            logged_in: bool, proxy: str | None) -> Stored:
        """Store the context's state back: cookies the task's pages set carry on. ``logged_in``:
        it is a new login (its time, TTL and count start again). Returns what was stored."""
        assert self.sessions is not None and task.options.session is not None
        now = time.time()
        state = await storage_state(tab.context)
        new_login = logged_in or stored is None
        if new_login:
            kept = Stored(task.options.session, state, now, now + rule.ttl, proxy,
                          (stored.logins + 1) if stored is not None else 1)
        else:
            assert stored is not None
            kept = Stored(task.options.session, state, stored.logged_in_at, stored.expires_at, proxy, stored.logins)
        if (left_out := await self.sessions.store.put(kept, same_login=not new_login)) is not None:
            log.warning("session.too_large", session=kept.name, left_out=left_out)
        return kept

    async def _proxy_for(self, task: ScrapeTask, prefer: str | None = None) -> tuple[Upstream | None, str | None]:
        """The task's upstream proxy (``net/proxies.py``) and the egress listener in front of it."""
        if self.proxies is None or not isinstance(self.egress, Egresses):
            return None, None
        upstream = self.proxies.choose(task.options.proxy, urlsplit(task.url).hostname or "",
                                       session=task.options.session, prefer=prefer)
        if upstream is None:
            return None, None
        return upstream, await self.egress.listener_for(upstream)

    async def _watch(self, tab: Tab, task: ScrapeTask, *, block: bool = True) -> _Watch:
        """Routes and listeners for this task: blocked resource types, failed requests, an
        oversize main document (stopped by its Content-Length before the browser spends a minute
        parsing it; pages without one are checked after rendering), the HAR."""
        opts = task.options
        page = tab.page
        watch = _Watch(page)
        if block and opts.block_resources:  # a route of the tab's context: set once per task
            blocked_types = set(opts.block_resources)

            async def abort_blocked(route: Route) -> None:
                if route.request.resource_type in blocked_types:
                    await route.abort("blockedbyclient")
                else:
                    await route.fallback()

            await tab.context.route("**/*", abort_blocked)

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
        mask_cookies = opts.session is not None and self.settings.archive_session_cookies == "masked"
        embed = "har" in opts.artifacts and opts.har_content == "embed"
        # The HAR's embedded bodies and the WARC share one fetch of each body from the browser.
        bodies = ResponseBodies(readers=embed + ("warc" in opts.artifacts))
        if "har" in opts.artifacts:
            watch.har = HarRecorder(page, embed_bodies=embed, max_total_bytes=self.settings.max_har_bytes,
                                    mask_cookies=mask_cookies, bodies=bodies)
            watch.listeners.extend(watch.har.listeners())
        if "warc" in opts.artifacts:
            watch.warc = WarcRecorder(page, max_body_bytes=self.settings.max_warc_body_bytes,
                                      max_total_bytes=self.settings.max_warc_bytes,
                                      payloads=self.payloads if self.settings.warc_revisits == "worker" else None,
                                      browser_version=self.pool.version, mask_cookies=mask_cookies, bodies=bodies)
            watch.listeners.extend(watch.warc.listeners())
        return watch

    async def _visit(self, tab: Tab, task: ScrapeTask, watch: _Watch, nav: _Navigation,
                     follow: str | None = None) -> Rendered:
        timeout = task.options.navigation_timeout or self.settings.navigation_timeout
        tab.page.set_default_timeout(timeout * 1000)
        if nav.before is not None:
            await nav.before()
        started = time.perf_counter()
        if nav.sent is None:
            response = await self._navigate(tab.page, task, watch, timeout)
        else:
            told = nav.sent
            page = tab.page

            def on_request(request: Request) -> None:
                # The first request of the navigation, read as the browser reports it (after it
                # went out): told at once, not when the page has loaded (the next start waits on it).
                if request.is_navigation_request() and request.frame == page.main_frame:
                    page.remove_listener("request", on_request)
                    self._spawn(told(time.time()))

            page.on("request", on_request)
            try:
                response = await self._navigate(page, task, watch, timeout)
            finally:
                page.remove_listener("request", on_request)
        navigated = time.perf_counter()
        status, headers, chain = self._answer(tab.page, response)
        shots = await self._steps(tab, task, timeout)
        if (cut := cut_off_by_network_change(task.url, watch.failed)) is not None:
            raise cut
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


def rule_name(task: ScrapeTask) -> str:
    assert task.options.session is not None
    return task.options.session


async def _session_holds(page: Page, rule: SessionRule) -> bool:
    """The session's check on a task's page: still logged in?"""
    if rule.check_url and rule.check_url in page.url:
        return False
    if rule.check_selector:
        return await page.query_selector(rule.check_selector) is not None
    return True


async def _no_shots(name: str, full_page: bool) -> None:
    raise InvalidTask(f"login steps take no screenshots ({name})", reason="invalid_session")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
