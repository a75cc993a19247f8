"""Capturing a rendered page: one round trip for the DOM's text, title, height and timings, then
the HTML, the screenshot (height-capped) and the HAR, each within its configured limit.

What the capture returns (``Rendered``) is everything the worker puts into the result: the
captures go to ARTIFACTS as bytes, the rest travels inline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from busscrape.artifacts.files import CONTENT_TYPES, HAR_FILE, HTML_FILE, TEXT_FILE, WARC_FILE, screenshot_file
from busscrape.crawl.links import LINKS_JS, MAX_LINKS, PageLinks
from busscrape.errors import LimitExceeded, NavigationTimeout
from busscrape.model import bounds
from busscrape.model.messages import ScrapeTask
from busscrape.settings import WorkerSettings
from busscrape.worker.browser.tabs import Tab
from busscrape.worker.har import HarRecorder
from busscrape.worker.warc import Resource, WarcRecorder

SCREENSHOT_TIMEOUT = 30.0  # seconds; a screenshot that takes longer is a page that will not settle
MAX_TITLE = 1000

# One round trip for what is read from the DOM after the steps (the HTML itself comes from
# page.content(), which moves large documents faster than an evaluate() return value).
# innerText leaves out the gap a margin or padding draws between two inline elements that touch
# in the markup (<a>Home</a><a>Article</a> reads "HomeArticle"): for the time of the read, a space
# stands in each such gap.
_CAPTURE_JS = """([wantText, follow, most]) => {
  const nav = performance.getEntriesByType('navigation')[0];
  const root = document.documentElement;
  let text = '';
  if (wantText && document.body) {
    const gaps = [];
    for (const el of document.body.querySelectorAll('*')) {
      const next = el.nextSibling;
      if (!next || next.nodeType !== 1) continue;
      const a = getComputedStyle(el), b = getComputedStyle(next);
      if (!a.display.startsWith('inline') || !b.display.startsWith('inline')) continue;
      const gap = parseFloat(a.marginRight) + parseFloat(a.paddingRight) + parseFloat(b.marginLeft)
        + parseFloat(b.paddingLeft);
      if (gap > 0) { const space = document.createTextNode(' '); el.after(space); gaps.push(space); }
    }
    text = document.body.innerText;
    for (const space of gaps) space.remove();
  }
  let links = null, linksMs = 0;
  if (follow) {
    const began = performance.now();
    links = (""" + LINKS_JS + """)(follow, most);
    linksMs = performance.now() - began;
  }
  return {
    links: links,
    links_ms: linksMs,
    title: document.title || '',
    text: text,
    height: Math.max(root ? root.scrollHeight : 0, document.body ? document.body.scrollHeight : 0),
    width: root ? root.clientWidth : 0,
    timing: nav ? {ttfb: nav.responseStart, dom_content_loaded: nav.domContentLoadedEventEnd,
                   load: nav.loadEventEnd} : {},
  };
}"""


@dataclass(frozen=True)
class Capture:
    """One file of a render, as bytes (or a file at its start, for the WARC: read chunk by chunk)."""

    file: str
    kind: str
    content_type: str
    data: bytes | IO[bytes]


@dataclass
class Rendered:
    """A rendered page: what it answered, what was captured."""

    final_url: str
    status: int | None
    redirect_chain: tuple[str, ...]
    response_headers: dict[str, str]
    title: str
    timings: dict[str, float]
    captures: list[Capture] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)
    har_bodies_dropped: bool = False
    html: str | None = None
    """The rendered DOM as HTML, for the task's extractor (tasks with one only)."""
    links: PageLinks | None = None
    """The links of the rendered DOM (crawl tasks only)."""
    proxy: str | None = None
    """The upstream proxy the page went through, without credentials."""
    warc_payloads: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The payloads the page's WARC holds in full (``WarcRecorder.stored``): later pages may
    refer to them once this page's result stands (``Renderer.payloads``)."""


@dataclass
class Visit:
    """What navigation and steps left for the capture."""

    tab: Tab
    task: ScrapeTask
    status: int | None
    headers: dict[str, str]
    chain: tuple[str, ...]
    failed: list[tuple[str, str]]
    """(URL, failure) of every request that failed, the policy's refusals among them."""
    shots: list[Capture]
    """Screenshots the steps took."""
    har: HarRecorder | None
    timings: dict[str, float]
    warc: WarcRecorder | None = None
    follow: str | None = None
    """CSS selector of the links to read (crawl tasks only)."""


class Capturer:
    """Captures what a task asked for, within the worker's limits."""

    def __init__(self, settings: WorkerSettings, browser_version: Callable[[], str] = str) -> None:
        self.settings = settings
        self.browser_version = browser_version
        """The running browser's version, for the HAR (asked per page: a relaunch may change it)."""

    async def capture(self, visit: Visit) -> Rendered:
        page, task, timings = visit.tab.page, visit.task, visit.timings
        opts = task.options
        # The links come in the same read, after the steps: links that JavaScript made are there too.
        dom = await page.evaluate(_CAPTURE_JS, ["text" in opts.artifacts, visit.follow, MAX_LINKS])
        links = None
        if visit.follow:
            links = PageLinks.from_js(dom.get("links") or {})
            # What reading them added to the read, timed in the page (bench/crawl.py reads it).
            timings["links"] = round(float(dom.get("links_ms") or 0.0), 2)
        if "html" in opts.artifacts or opts.extractor:
            dom["html"] = await page.content()
        captures = self._texts(task, dom)
        if "screenshot" in opts.artifacts:
            data = await self.screenshot(visit.tab, task, full_page=opts.screenshot.full_page, height=dom["height"])
            captures.insert(1 if captures and captures[0].kind == "html" else 0,
                            Capture(screenshot_file(task), "screenshot", CONTENT_TYPES[opts.screenshot.format], data))
        captures += visit.shots
        timings.update({k: round(v, 1) for k, v in (dom.get("timing") or {}).items() if v})
        dropped = False
        if visit.har is not None:
            har_capture, dropped = await self._har(visit.har, dom["title"], timings)
            captures.append(har_capture)
        if visit.warc is not None:
            captures.append(await self._warc(visit, dom, captures))
        blocked = [url for url, why in visit.failed if "SOCKS" in why or "blockedbyclient" in why]
        # What the page controls is bounded here, each cut marked: the result always fits in RESULTS.
        return Rendered(final_url=bounds.cut(page.url, bounds.MAX_URL), status=visit.status,
                        redirect_chain=bounds.urls(visit.chain, most=bounds.MAX_REDIRECTS),
                        response_headers=bounds.headers(visit.headers), title=bounds.cut(dom["title"], MAX_TITLE),
                        timings=timings, captures=captures,
                        blocked_requests=list(bounds.urls(blocked, most=bounds.MAX_BLOCKED)),
                        har_bodies_dropped=dropped, html=dom["html"] if opts.extractor else None, links=links,
                        warc_payloads=visit.warc.stored if visit.warc is not None else {})

    def _texts(self, task: ScrapeTask, dom: dict[str, Any]) -> list[Capture]:
        """The rendered HTML (refused over ``max_page_bytes``) and the visible text (cut there)."""
        out = []
        limit = self.settings.max_page_bytes
        if "html" in dom:  # captured, or read for the extractor: the same limit
            html = dom["html"].encode("utf-8", "surrogatepass")
            if len(html) > limit:
                raise LimitExceeded(f"rendered HTML is {len(html)} bytes, over max_page_bytes {limit}",
                                    reason="page_too_large")
            if "html" in task.options.artifacts:
                out.append(Capture(HTML_FILE, "html", CONTENT_TYPES["html"], html))
        if "text" in task.options.artifacts:
            text = dom["text"].encode("utf-8", "surrogatepass")
            out.append(Capture(TEXT_FILE, "text", CONTENT_TYPES["text"], text[:limit]))
        return out

    async def _har(self, har: HarRecorder, title: str, timings: dict[str, float]) -> tuple[Capture, bool]:
        har.page_title = title
        await har.settle()
        try:
            data, dropped = har.build(browser_version=self.browser_version(), max_bytes=self.settings.max_har_bytes,
                                      page_timings={"onContentLoad": timings.get("dom_content_loaded", -1),
                                                    "onLoad": timings.get("load", -1)})
        except ValueError as exc:
            raise LimitExceeded(str(exc), reason="har_too_large") from None
        return Capture(HAR_FILE, "har", CONTENT_TYPES["har"], data), dropped

    async def _warc(self, visit: Visit, dom: dict[str, Any], captures: list[Capture]) -> Capture:
        """The page's WARC: its traffic, then its metadata and the DOM and screenshots as resources."""
        page, task = visit.tab.page, visit.task
        url = page.url
        html = dom.get("html")
        if html is None:
            html = await page.content()
        resources = [Resource(f"urn:dom:{url}", CONTENT_TYPES["html"], html.encode("utf-8", "surrogatepass"))]
        resources += [Resource(f"urn:screenshot:{url}" if c.kind == "screenshot" else f"urn:screenshot:{c.file}:{url}",
                               c.content_type, c.data) for c in captures
                      if c.kind in ("screenshot", "extra_screenshot") and isinstance(c.data, bytes)]
        assert visit.warc is not None  # only a task that records a WARC gets here
        spool = await visit.warc.finish({
            "task_id": task.task_id, "url": task.url, "final_url": url, "status": visit.status,
            "title": bounds.cut(dom["title"], MAX_TITLE), "timings": visit.timings, "labels": task.labels,
        }, resources)
        return Capture(WARC_FILE, "warc", CONTENT_TYPES["warc"], spool)

    async def screenshot(self, tab: Tab, task: ScrapeTask, *, full_page: bool, height: int | None) -> bytes:
        """The viewport, or the page up to ``max_screenshot_height`` CSS pixels."""
        shot = task.options.screenshot
        cap = self.settings.max_screenshot_height
        viewport = task.options.viewport
        page = tab.page
        try:
            async with asyncio.timeout(SCREENSHOT_TIMEOUT):
                if full_page and height is None:
                    height = await page.evaluate("() => document.documentElement.scrollHeight")
                if not full_page or height is None or height <= viewport.height:
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
            raise NavigationTimeout(f"screenshot did not finish in {SCREENSHOT_TIMEOUT:.0f}s",
                                    reason="screenshot_timeout") from None
