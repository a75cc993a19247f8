"""A WARC/1.1 recorder built from Playwright's network events, one per task (the ``warc`` artifact).

What one page's ``page.warc.gz`` holds, in order (each record its own gzip member, so any
record can be read from its offset, as every WARC index expects)::

    warcinfo                     software, format, browser
    response + request           per request, paired by WARC-Concurrent-To (request → response)
    revisit                      a response whose payload is stored already: earlier in this WARC,
                                 or (``warc_revisits = "worker"``) in an archived page of this worker
                                 (identical-payload-digest: no body, refers to the first one)
    metadata urn:pageinfo:<url>  the page: task, final URL, status, title, timings, and a note for
                                 every body that is not (fully) there and why
    resource urn:dom:<url>       the rendered DOM, concurrent to the page's main response
    resource urn:screenshot:<url>  the screenshot, likewise

Bodies come from Playwright (``Response.body()``, CDP's ``Network.getResponseBody`` underneath)
once a request has finished, so only what the browser loaded anyway is recorded. Each record is
compressed and appended to an anonymous temporary file as it comes, so memory holds at most the
body in hand (at most ``max_body_bytes``), not the page: the finished file is handed to the
artifact store, which reads it chunk by chunk.

A body is cut (``WARC-Truncated: length``) when it is over ``max_body_bytes`` or over what the
page may still hold (``max_total_bytes`` for all records of the page), and not fetched at all
when its size says so before. Bodies that are not there are recorded as such, never a crash:
a request that failed half-way (``WARC-Truncated: disconnect``), one still loading when the page
is captured, such as an endless stream (``time``), a body the browser cannot give back
(``unspecified``: redirects, downloads, media it streamed); WebSockets and failed requests
without a response get a note only. The bodies the browser decoded are stored decoded, so
their ``Content-Encoding`` is renamed ``X-Archive-Orig-Content-Encoding`` (replay tools would
decode them again otherwise) and ``Content-Length`` is the stored length.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import tempfile
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from io import BytesIO
from typing import IO, Any
from urllib.parse import urlsplit

import orjson
from playwright.async_api import Page, Request, Response, WebSocket
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from busscrape import __version__
from busscrape.model import bounds
from busscrape.worker.bodies import ResponseBodies
from busscrape.worker.browser.compat import listen
from busscrape.worker.har import MASKED, masked_headers, wire_headers

WARC_VERSION = "1.1"
GZIP_LEVEL = 1  # warcio's own is 9: several times the CPU for a few per cent
MIN_REVISIT = 1024  # bytes: a revisit record of a smaller payload saves nothing
MAX_NOTES = 200
_INLINE = 64 * 1024  # records with smaller bodies are compressed on the loop, larger ones in a thread
_NO_BODY = frozenset({204, 304})
# Hop-by-hop and framing headers that described the bytes on the wire, not the decoded body stored.
_FRAMING = frozenset({"content-encoding", "transfer-encoding", "content-length"})


def payload_digest(body: bytes) -> str:
    """The WARC payload digest of ``body`` (``sha1:`` and base32, as warcio and every index write it)."""
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()


class PayloadIndex:
    """The payloads one worker stored already: digest → (URI, WARC-Date) of the first record.

    Bounded (least recently seen forgotten): a worker runs for days. A page's payloads join only
    once its result stands in RESULTS (the worker adds ``Rendered.warc_payloads`` after the
    PubAck), so a revisit never refers to a record of a page that failed after its capture (a
    refused result, an extraction that failed, a duplicate): that WARC is never archived.
    """

    def __init__(self, most: int = 100_000) -> None:
        self.most = most
        self._first: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def get(self, digest: str) -> tuple[str, str] | None:
        found = self._first.get(digest)
        if found is not None:
            self._first.move_to_end(digest)
        return found

    def add(self, entries: dict[str, tuple[str, str]]) -> None:
        for digest, first in entries.items():
            self._first.setdefault(digest, first)
            self._first.move_to_end(digest)
        while len(self._first) > self.most:
            self._first.popitem(last=False)


class _GzipMember:
    """What warcio writes one record into: compressed as it comes, one gzip member per record."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS + 16)

    def write(self, data: bytes) -> None:
        self.out.write(self.deflate.compress(data))

    def flush(self) -> None:
        self.out.write(self.deflate.flush())


class _Writer(WARCWriter):
    """warcio's writer at a lower gzip level (its gzip wrapper hard-codes level 9)."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__(out, gzip=False, warc_version=WARC_VERSION)

    def _write_warc_record(self, out: IO[bytes], record: Any) -> None:
        super()._write_warc_record(_GzipMember(out), record)


@dataclass
class Resource:
    """A capture to store in the WARC as a ``resource`` record (the DOM, a screenshot)."""

    uri: str
    content_type: str
    data: bytes


def _header_list(pairs: list[tuple[str, str]], *, decoded: bool, masked: frozenset[str]) -> list[tuple[str, str]]:
    """HTTP headers as a list: values with newlines split (Playwright joins repeated headers so,
    which would end the header block early); ``masked`` ones masked as in the HAR; framing renamed."""
    out = []
    for name, value in pairs:
        lower = name.lower()
        if decoded and lower in _FRAMING:
            if lower == "content-encoding":
                out.append(("X-Archive-Orig-Content-Encoding", value.replace("\n", ", ")))
            continue
        for one in value.split("\n"):
            out.append((name, MASKED if lower in masked else one.replace("\r", "")))
    return out


async def _encoded_size(request: Request) -> int:
    """The body's size on the wire as the browser counted it (0 when it cannot say)."""
    try:
        return max(0, int((await request.sizes()).get("responseBodySize", 0)))
    except Exception:
        return 0


class WarcRecorder:
    """Records one page's traffic as WARC records into a temporary file; ``finish()`` returns it."""

    def __init__(self, page: Page, *, max_body_bytes: int, max_total_bytes: int,
                 payloads: PayloadIndex | None = None, browser_version: str = "", mask_cookies: bool = False,
                 bodies: ResponseBodies | None = None) -> None:
        self.max_body_bytes = max_body_bytes
        self.bodies = bodies or ResponseBodies(readers=1)
        self.masked = masked_headers(mask_cookies)
        self.max_total_bytes = max_total_bytes
        self.payloads = payloads if payloads is not None else PayloadIndex()
        self._page = page
        self._spool: IO[bytes] = tempfile.TemporaryFile(prefix="busscrape-", suffix=".warc.gz")
        self._lock = threading.Lock()  # records are appended from the loop and from threads
        self._writer = _Writer(self._spool)
        self._responses: dict[Request, Response] = {}
        self._recording: dict[asyncio.Future[None], str] = {}
        self._settled = False
        """Whether ``settle`` has begun: network events after it are not this WARC's."""
        self._seen: dict[str, tuple[str, str]] = {}
        """digest → (URI, WARC-Date) of the full responses this WARC holds (``stored``)."""
        self.reserved = 0
        """Payload bytes the page's records hold or are about to (against ``max_total_bytes``)."""
        self.notes: list[dict[str, str]] = []
        self.counts = {"responses": 0, "revisits": 0, "truncated": 0, "skipped": 0}
        self.main_record_id: str | None = None
        """WARC-Record-ID of the main document's last response (what the page's metadata and
        resources are concurrent to)."""
        self._write(self._writer.create_warcinfo_record("page.warc.gz", {
            "software": f"busscrape/{__version__}", "format": "WARC File Format 1.1",
            "conformsTo": "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/",
            "browser": f"Chromium {browser_version}".strip()}))
        self._listeners: list[tuple[str, Any]] = [
            ("response", self._on_response), ("requestfinished", self._on_finished),
            ("requestfailed", self._on_failed), ("websocket", self._on_websocket)]
        for event, handler in self._listeners:
            listen(page, event, handler)

    def listeners(self) -> list[tuple[str, Any]]:
        """The page listeners this recorder added (to remove when the task leaves the tab)."""
        return list(self._listeners)

    @property
    def stored(self) -> dict[str, tuple[str, str]]:
        """The payloads this WARC holds in full: digest → (URI, WARC-Date) of the record."""
        return dict(self._seen)

    def close(self) -> None:
        """Drop the temporary file (when the render fails before ``finish``)."""
        with contextlib.suppress(Exception):
            self._spool.close()

    # -- events -----------------------------------------------------------------------------

    def _on_response(self, response: Response) -> None:
        if not self._settled and urlsplit(response.url).scheme in ("http", "https"):
            self._responses[response.request] = response

    def _on_finished(self, request: Request) -> None:
        response = self._responses.pop(request, None)  # None once settled: _responses is empty
        if response is not None:
            self._spawn(response.url, self._record(response, None, ""))

    def _on_failed(self, request: Request) -> None:
        if self._settled:  # a request cut by the capture itself (the tab closing): not the page's
            return
        failure = request.failure or "failed"
        response = self._responses.pop(request, None)
        if response is None:
            self.note(request.url, f"no response: {failure}")
            return
        self._spawn(response.url, self._record(response, "disconnect", f"body cut: {failure}"))

    def _on_websocket(self, socket: WebSocket) -> None:
        self.note(socket.url, "WebSocket: its messages are not recorded")

    def _spawn(self, url: str, coro: Any) -> None:
        job = asyncio.ensure_future(coro)
        self._recording[job] = url
        job.add_done_callback(lambda done: self._recording.pop(done, None))

    def note(self, url: str, why: str) -> None:
        """Say in the page's metadata why a body is not (fully) in the WARC (bounded)."""
        self.counts["skipped"] += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append({"url": bounds.cut(url, bounds.MAX_URL), "note": why[:300]})

    # -- records ----------------------------------------------------------------------------

    def _room(self, size: int) -> int:
        """Bytes of a body of ``size`` that fit (reserved at once: bodies arrive concurrently)."""
        fits = max(0, min(size, self.max_body_bytes, self.max_total_bytes - self.reserved))
        self.reserved += fits
        return fits

    async def _record(self, response: Response, truncated: str | None, why: str) -> None:
        try:
            body, truncated, why = await self._body(response, truncated, why)
            await self._store(response, body, truncated, why)
        except Exception as exc:  # a page closed under us, a response gone: a note, never a crash
            self.note(response.url, f"not recorded: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self.bodies.done(response)

    async def _body(self, response: Response, truncated: str | None, why: str) -> tuple[bytes, str | None, str]:
        """The body as far as it is kept, why it is cut (a WARC-Truncated reason), the note."""
        request = response.request
        if truncated is not None or request.method == "HEAD" or response.status in _NO_BODY:
            return b"", truncated, why
        if 300 <= response.status < 400:
            length = response.headers.get("content-length", "0")
            return (b"", None, "") if length in ("", "0") else (b"", "unspecified", "redirect: body not kept")
        length = response.headers.get("content-length", "")
        # The size before the body: a body that cannot fit is not even fetched from the browser.
        size = int(length) if length.isdigit() else await _encoded_size(request)
        room = self._room(max(size, 0))
        if room < size:
            self.reserved -= room
            return b"", "length", f"body of {size} bytes over the limit (max_warc_body_bytes, max_warc_bytes)"
        try:
            body = await self.bodies.read(response)
        except Exception as exc:
            self.reserved -= room
            return b"", "unspecified", f"body unavailable: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}"
        if len(body) > room:  # decoded bigger than its encoded size said: keep what fits
            extra = self._room(len(body) - room)
            if room + extra < len(body):
                return body[:room + extra], "length", f"body cut at {room + extra} of {len(body)} bytes"
        else:
            self.reserved -= room - len(body)
        return body, None, ""

    async def _store(self, response: Response, body: bytes, truncated: str | None, why: str) -> None:
        request = response.request
        url = bounds.cut(response.url, bounds.MAX_URL)
        status = response.status
        phrase = response.status_text or (HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_
                                          else "")
        headers = _header_list(await wire_headers(response), decoded=True, masked=self.masked)
        headers.append(("Content-Length", str(len(body))))
        http = StatusAndHeaders(f"{status} {phrase}".strip(), headers, protocol="HTTP/1.1")
        warc_headers = {}
        if truncated:
            warc_headers["WARC-Truncated"] = truncated
            self.counts["truncated"] += 1
            self.note(url, why or f"truncated: {truncated}")
        digest = payload_digest(body)
        first = None
        if not truncated and len(body) >= MIN_REVISIT:
            first = self._seen.get(digest) or self.payloads.get(digest)
        if first is not None:
            record = self._writer.create_revisit_record(url, digest, first[0], first[1], http_headers=http,
                                                        warc_headers_dict=warc_headers)
            self.counts["revisits"] += 1
        else:
            record = self._writer.create_warc_record(url, "response", payload=BytesIO(body), length=len(body),
                                                     http_headers=http, warc_headers_dict=warc_headers)
            if not truncated and len(body) >= MIN_REVISIT:
                self._seen.setdefault(digest, (url, record.rec_headers.get_header("WARC-Date") or ""))
        self.counts["responses"] += 1
        req = self._request_record(request, url, await wire_headers(request))
        if request.is_navigation_request() and request.frame == self._page.main_frame:
            self.main_record_id = record.rec_headers.get_header("WARC-Record-ID")
        if len(body) < _INLINE:
            self._write_pair(req, record)
        else:
            await asyncio.to_thread(self._write_pair, req, record)

    def _request_record(self, request: Request, url: str, sent: list[tuple[str, str]]) -> Any:
        parts = urlsplit(request.url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = _header_list(sent, decoded=False, masked=self.masked)
        if not any(name.lower() == "host" for name, _ in headers):
            headers.insert(0, ("Host", parts.netloc))
        body = request.post_data_buffer or b""
        post = body[: self._room(len(body))]  # a request body counts against the page's WARC as a response's does
        warc_headers = {}
        if len(post) < len(body):
            warc_headers["WARC-Truncated"] = "length"
            self.counts["truncated"] += 1
            self.note(url, f"request body cut at {len(post)} of {len(body)} bytes (max_warc_bytes)")
        http = StatusAndHeaders(bounds.cut(f"{request.method} {target} HTTP/1.1", bounds.MAX_URL + 20), headers,
                                is_http_request=True)
        return self._writer.create_warc_record(url, "request", payload=BytesIO(post), length=len(post),
                                               http_headers=http, warc_headers_dict=warc_headers)

    def _write_pair(self, request: Any, response: Any) -> None:
        with self._lock:
            self._writer.write_request_response_pair(request, response)

    def _write(self, record: Any) -> None:
        with self._lock:
            self._writer.write_record(record)

    # -- output -----------------------------------------------------------------------------

    async def settle(self, wait: float = 10.0) -> None:
        """Wait for the bodies being recorded; what is still loading is recorded without its body."""
        if self._recording:
            await asyncio.wait(set(self._recording), timeout=wait)
        for job, url in list(self._recording.items()):
            job.cancel()
            self.note(url, "not recorded: its body did not come in time")
        # From here on the WARC is the page as captured: a request that finishes while these are
        # written (or later) must not add a second record of itself behind them.
        self._settled = True
        loading = list(self._responses.values())
        self._responses.clear()
        for response in loading:
            await self._store(response, b"", "time", "still loading when the page was captured")

    async def finish(self, page: dict[str, Any], resources: list[Resource]) -> IO[bytes]:
        """Settle, add the page's metadata and resources, and return the WARC file (at its start).

        The page's payloads (``stored``) join the worker's ``PayloadIndex`` only once the
        page's result stands: that is for the worker to say, not the recorder.
        """
        await self.settle()
        concurrent = {"WARC-Concurrent-To": self.main_record_id} if self.main_record_id else {}
        url = bounds.cut(page.get("final_url") or page.get("url") or "", bounds.MAX_URL)
        meta = orjson.dumps({**page, "records": self.counts, "notes": self.notes,
                             "notes_left_out": max(0, self.counts["skipped"] - len(self.notes))})
        # Not under the page's own URI: indexes list metadata records too, and a replay tool that
        # took it for the latest capture of the page would show this JSON instead of the page.
        self._write(self._writer.create_warc_record(f"urn:pageinfo:{url}", "metadata", payload=BytesIO(meta),
                                                    length=len(meta),
                                                    warc_content_type="application/json",
                                                    warc_headers_dict=dict(concurrent)))
        for resource in resources:
            room = self._room(len(resource.data))
            data = resource.data[:room]
            headers = dict(concurrent)
            if room < len(resource.data):
                headers["WARC-Truncated"] = "length"
            record = self._writer.create_warc_record(resource.uri, "resource", payload=BytesIO(data),
                                                     length=len(data), warc_content_type=resource.content_type,
                                                     warc_headers_dict=headers)
            await asyncio.to_thread(self._write, record)
        self._spool.flush()
        self._spool.seek(0)
        return self._spool
