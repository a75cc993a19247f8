"""A HAR 1.2 recorder built from Playwright's network events, one per task.

Playwright's own HAR recording is per browser context and written when the context closes,
which ties HAR capture to one context per task. Recording from events instead works the same
whichever way contexts are managed, lets response bodies be embedded or omitted per task, and
lets the recorder drop bodies when the HAR would exceed its size limit.

Only synchronous request/response properties are read on the hot path (headers, timing);
bodies are fetched only when the task asked for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import orjson
from playwright.async_api import Page, Request, ResourceTiming, Response

from busscrape import __version__
from busscrape.worker.bodies import ResponseBodies

_TEXTUAL = ("text/", "application/json", "application/javascript", "application/xml", "image/svg+xml",
            "application/x-javascript", "application/ld+json")


# Request headers that carry credentials: a task's own `Authorization` (how docs/dispatch.md tells users to
# log in to the pages they scrape) would otherwise sit in every HAR of the archive. Their values
# are masked, as Chromium's DevTools does in its default ("sanitized") HAR export. Cookies are
# the site's own state and stay, but for a session's pages (its login's token) unless
# `worker.archive_session_cookies = "kept"`: `masked_headers`.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})
COOKIE_HEADERS = frozenset({"cookie", "set-cookie"})
MASKED = "[masked]"


def masked_headers(mask_cookies: bool) -> frozenset[str]:
    """The header names whose values the HAR and the WARC mask (lower case)."""
    return CREDENTIAL_HEADERS | COOKIE_HEADERS if mask_cookies else CREDENTIAL_HEADERS


def _headers(pairs: Iterable[tuple[str, str]], masked: frozenset[str] = CREDENTIAL_HEADERS) -> list[dict[str, str]]:
    return [{"name": k, "value": MASKED if k.lower() in masked else v} for k, v in pairs]


async def wire_headers(message: Request | Response) -> list[tuple[str, str]]:
    """The headers as sent or received, Cookie and Set-Cookie among them (Playwright's
    ``headers`` leaves those out); the ``headers`` it has when the browser no longer can say."""
    try:
        return [(h["name"], h["value"]) for h in await message.headers_array()]
    except Exception:
        return list(message.headers.items())


def _iso(epoch_ms: float) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


TimingMark = Literal["startTime", "domainLookupStart", "domainLookupEnd", "connectStart", "secureConnectionStart",
                     "connectEnd", "requestStart", "responseStart", "responseEnd"]
"""The marks of ``Request.timing`` (``startTime`` in ms since the epoch, the others in ms after it, -1 when
not reached)."""


def _phase(timing: ResourceTiming, start: TimingMark, end: TimingMark) -> float:
    a, b = timing.get(start, -1), timing.get(end, -1)
    return round(b - a, 3) if a >= 0 and b >= 0 and b >= a else -1


NOT_EMBEDDED = "body not embedded: over max_body_bytes, or over what the page's HAR may hold (max_har_bytes)"
POST_TEXT_CHARS = 65536
"""A request body's text in the HAR is cut at this many characters."""


class HarRecorder:
    """Collects one page's requests; ``build()`` returns the HAR as bytes."""

    def __init__(self, page: Page, *, embed_bodies: bool, max_body_bytes: int = 20 * 1024 * 1024,
                 max_total_bytes: int = 100 * 1024 * 1024, mask_cookies: bool = False,
                 bodies: ResponseBodies | None = None) -> None:
        self.embed_bodies = embed_bodies
        self.bodies = bodies or ResponseBodies(readers=1)
        self.masked = masked_headers(mask_cookies)
        self.max_body_bytes = max_body_bytes
        self.max_total_bytes = max_total_bytes
        """Embedded bodies held at once, over the whole page (a page of many large responses
        would otherwise hold them all in memory until the HAR is built, then drop them)."""
        self.embedded_bytes = 0
        self._entries: dict[Request, dict[str, Any]] = {}
        self._order: list[Request] = []
        self._bodies: list[asyncio.Future[None]] = []
        self._pending: dict[Request, Response] = {}
        self._page = page
        self.page_title = ""
        self.page_started = datetime.now(UTC)
        page.on("request", self._on_request)
        page.on("response", self._on_response)
        page.on("requestfinished", self._on_finished)
        page.on("requestfailed", self._on_failed)

    def listeners(self) -> list[tuple[str, Any]]:
        """The page listeners this recorder added (to remove when the task leaves the tab)."""
        return [("request", self._on_request), ("response", self._on_response),
                ("requestfinished", self._on_finished), ("requestfailed", self._on_failed)]

    # -- events -----------------------------------------------------------------------------

    def _on_request(self, request: Request) -> None:
        url = request.url
        if url.startswith("data:"):
            return
        post = request.post_data_buffer
        entry: dict[str, Any] = {
            "pageref": "page_1",
            "startedDateTime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "time": 0,
            "request": {
                "method": request.method,
                "url": url,
                "httpVersion": "HTTP/1.1",
                "cookies": [],
                "headers": _headers(request.headers.items(), self.masked),  # as sent: ``_wire``
                "queryString": [{"name": k, "value": v} for k, v in parse_qsl(urlsplit(url).query,
                                                                                keep_blank_values=True)],
                "headersSize": -1,
                "bodySize": len(post) if post else 0,
            },
            "response": None,
            "cache": {},
            "timings": {"blocked": -1, "dns": -1, "connect": -1, "ssl": -1, "send": 0, "wait": 0, "receive": 0},
            "_resourceType": request.resource_type,
        }
        if post:
            mime = request.headers.get("content-type", "application/octet-stream")
            text = post.decode("utf-8", "replace")[:POST_TEXT_CHARS]
            # A request body counts against the page's HAR as a response body does (50 POSTs
            # would otherwise hold the HAR's whole budget again, uncounted).
            if self._room(len(text)):
                self.embedded_bytes += len(text)
                entry["request"]["postData"] = {"mimeType": mime, "text": text}
            else:
                entry["request"]["postData"] = {"mimeType": mime, "text": "", "comment": NOT_EMBEDDED}
        self._entries[request] = entry
        self._order.append(request)

    def _on_response(self, response: Response) -> None:
        entry = self._entries.get(response.request)
        if entry is None:
            return
        headers = response.headers
        size = int(headers.get("content-length", "0") or 0) if headers.get("content-length", "").isdigit() else 0
        entry["response"] = {
            "status": response.status,
            "statusText": response.status_text,
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": _headers(headers.items(), self.masked),
            "content": {"size": size, "mimeType": headers.get("content-type", "")},
            "redirectURL": headers.get("location", ""),
            "headersSize": -1,
            "bodySize": size,
        }
        if self.embed_bodies and response.request.method != "HEAD" and not (300 <= response.status < 400):
            self._pending[response.request] = response
        self._bodies.append(asyncio.ensure_future(self._wire(entry, response)))

    async def _wire(self, entry: dict[str, Any], response: Response) -> None:
        """What only Playwright's async calls tell: the headers as on the wire (Cookie and
        Set-Cookie too, masked per ``masked``), the HTTP version and the server's address."""
        entry["request"]["headers"] = _headers(await wire_headers(response.request), self.masked)
        entry["response"]["headers"] = _headers(await wire_headers(response), self.masked)
        with contextlib.suppress(Exception):
            version = await response.http_version()
            if version:
                entry["request"]["httpVersion"] = entry["response"]["httpVersion"] = version
        with contextlib.suppress(Exception):
            address = await response.server_addr()
            if address:
                entry["serverIPAddress"] = address["ipAddress"]
                entry["connection"] = str(address["port"])

    def _on_finished(self, request: Request) -> None:
        entry = self._entries.get(request)
        if entry is None:
            return
        self._fill_timing(entry, request)
        response = self._pending.pop(request, None)
        if response is not None:
            self._bodies.append(asyncio.ensure_future(self._embed(entry, response)))

    async def _embed(self, entry: dict[str, Any], response: Response) -> None:
        try:
            await self._embed_body(entry, response)
        finally:
            self.bodies.done(response)

    async def _embed_body(self, entry: dict[str, Any], response: Response) -> None:
        content = entry["response"]["content"]
        length = response.headers.get("content-length", "")
        if length.isdigit() and not self._room(int(length)):
            content["comment"] = NOT_EMBEDDED  # not even fetched from the browser
            return
        try:
            body = await self.bodies.read(response)
        except Exception:
            return
        content["size"] = entry["response"]["bodySize"] = len(body)
        if content["mimeType"].startswith(_TEXTUAL):
            text, encoding = body.decode("utf-8", "replace"), None
        else:
            text, encoding = base64.b64encode(body).decode(), "base64"
        del body
        if not self._room(len(text)):
            content["comment"] = NOT_EMBEDDED
            return
        self.embedded_bytes += len(text)
        content["text"] = text
        if encoding:
            content["encoding"] = encoding

    def _room(self, size: int) -> bool:
        return size <= self.max_body_bytes and self.embedded_bytes + size <= self.max_total_bytes

    def _on_failed(self, request: Request) -> None:
        entry = self._entries.get(request)
        if entry is None:
            return
        self._fill_timing(entry, request)
        entry["_failure"] = request.failure or "failed"

    @staticmethod
    def _fill_timing(entry: dict[str, Any], request: Request) -> None:
        t = request.timing
        start = t.get("startTime", 0)
        if start > 0:
            entry["startedDateTime"] = _iso(start)
        entry["timings"] = {
            "blocked": -1,
            "dns": _phase(t, "domainLookupStart", "domainLookupEnd"),
            "connect": _phase(t, "connectStart", "connectEnd"),
            "ssl": _phase(t, "secureConnectionStart", "connectEnd"),
            "send": 0,
            "wait": _phase(t, "requestStart", "responseStart"),
            "receive": _phase(t, "responseStart", "responseEnd"),
        }
        end = t.get("responseEnd", -1)
        entry["time"] = round(end, 3) if end >= 0 else 0

    # -- output -----------------------------------------------------------------------------

    async def settle(self, wait: float = 10.0) -> None:
        """Wait for pending response bookkeeping (bodies) before building."""
        if self._bodies:
            await asyncio.wait(self._bodies, timeout=wait)

    def build(self, *, browser_version: str, page_timings: dict[str, float], max_bytes: int) -> tuple[bytes, bool]:
        """The HAR document and whether bodies had to be dropped to fit ``max_bytes``.

        Raises ``ValueError`` when even without bodies it does not fit.
        """
        entries = []
        for request in self._order:
            entry = dict(self._entries[request])
            if entry["response"] is None:
                entry["response"] = {"status": 0, "statusText": "", "httpVersion": "", "cookies": [], "headers": [],
                                     "content": {"size": 0, "mimeType": ""}, "redirectURL": "", "headersSize": -1,
                                     "bodySize": -1}
            entries.append(entry)
        doc = {"log": {
            "version": "1.2",
            "creator": {"name": "busscrape", "version": __version__},
            "browser": {"name": "chromium", "version": browser_version},
            "pages": [{"startedDateTime": self.page_started.isoformat().replace("+00:00", "Z"), "id": "page_1",
                       "title": self.page_title, "pageTimings": page_timings}],
            "entries": entries,
        }}
        data = orjson.dumps(doc)
        if len(data) <= max_bytes:
            return data, False
        for entry in entries:
            entry["response"]["content"].pop("text", None)
            entry["response"]["content"].pop("encoding", None)
            if entry["request"].get("postData", {}).get("text"):
                entry["request"] = {**entry["request"], "postData": {
                    **entry["request"]["postData"], "text": "", "comment": NOT_EMBEDDED}}
        data = orjson.dumps(doc)
        if len(data) > max_bytes:
            raise ValueError(f"HAR of {len(entries)} requests is {len(data)} bytes without bodies, over {max_bytes}")
        return data, True
