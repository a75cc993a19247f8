"""The console's read pages: Overview, Crawls (and the crawl form), Pages (search and one page).

Each reads what the matching command reads, through the API server's own handlers' code:
``busscrape status``'s ``Overview`` snapshot, ``ApiServer.crawl_progress`` / ``start_crawl``
(``GET``/``POST /crawls``), ``Searching.find`` (``GET /search``), ``ApiServer.task_history``
(``GET /tasks/{id}``) and the archive folder the search result names.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web
from multidict import MultiDict
from pydantic import ValidationError

from busscrape.api.answers import ApiError, unavailable_as_503
from busscrape.api.console.folders import DOWNLOADS, Folders
from busscrape.api.console.render import CONTEXT, page
from busscrape.api.schema import CrawlRequest, SearchResults
from busscrape.bus import names, topology
from busscrape.model.messages import describe_validation_error
from busscrape.ops.overview import Counters, Overview

if TYPE_CHECKING:
    from busscrape.api.server import ApiServer

RATE_WINDOW = 600.0  # seconds of rates the overview's chart shows
MIN_GAP = 1.0  # a refresh sooner than this after the last reuses its counters' base (rates need a gap)
SEARCH_LIMIT = 50  # results a page of the Pages view
ASKED = ("q", "host", "since", "where", "crawl", "status")  # the Pages view's form fields
CRAWL_FIELDS = ("seeds", "scope", "depth", "max_pages", "include", "exclude", "robots", "follow", "sitemaps")


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class Views:
    """The read pages of one server (``ApiServer``), with the overview's rate history."""

    def __init__(self, server: ApiServer, folders: Folders) -> None:
        self.server = server
        self.folders = folders
        self._overview: Overview | None = None
        self._last: Counters | None = None
        self._rates: deque[tuple[float, dict[str, float]]] = deque()
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._overview is not None:
            await self._overview.__aexit__(None, None, None)

    # -- overview ----------------------------------------------------------------------------

    async def _snapshot(self) -> dict[str, Any]:
        """``busscrape status``'s document; rates against the previous refresh (by anyone)."""
        s = self.server.settings
        async with self._lock:
            if self._overview is None:
                self._overview = await Overview(self.server.bus, topology.load(s), monitor_url=s.nats.monitor_url,
                                                account=s.nats.monitor_account).__aenter__()
            with unavailable_as_503("the bus's state"):
                if self._last is None:
                    self._last = await self._overview.counters()
                    await asyncio.sleep(MIN_GAP)
                before = self._last
                doc, counters = await self._overview.snapshot(before)
            if counters.at - before.at >= MIN_GAP:
                self._last = counters
                self._keep_rates(doc)
        return doc

    def _keep_rates(self, doc: dict[str, Any]) -> None:
        inflow = (doc.get("rates") or {}).get("messages_in") or {}
        now = time.time()
        self._rates.append((now, {stream: float(inflow.get(stream) or 0.0) for stream in
                                  (names.TASKS_STREAM, names.RESULTS_STREAM, names.DEADLETTER_STREAM)}))
        while self._rates and self._rates[0][0] < now - RATE_WINDOW:
            self._rates.popleft()

    def chart(self, width: int = 480, height: int = 90) -> dict[str, Any]:
        """The kept rates as SVG polyline points per stream (drawn by the template, no script)."""
        points = list(self._rates)
        if len(points) < 2:
            return {"series": {}, "peak": 0.0, "width": width, "height": height, "seconds": 0}
        start, end = points[0][0], points[-1][0]
        span = max(end - start, 1.0)
        peak = max(max(r.values()) for _, r in points)
        scale = peak or 1.0  # all zero: a flat line at the bottom
        series = {}
        for stream in points[0][1]:
            series[stream] = " ".join(f"{(t - start) / span * width:.1f},{height - r[stream] / scale * height:.1f}"
                                      for t, r in points)
        return {"series": series, "peak": peak, "width": width, "height": height, "seconds": round(span)}

    async def archived(self) -> int | None:
        """Pages in the search index (the archive's pages when search is on), or None."""
        try:
            index = await self.server.searching.index()
            return await index.count()
        except Exception:  # search off or not answering: the overview shows a dash, not an error
            return None

    async def overview(self, request: web.Request) -> web.Response:
        doc, archived = await asyncio.gather(self._snapshot(), self.archived())
        workers = doc["consumers"].get(f"{names.TASKS_STREAM}/{names.WORKERS_CONSUMER}", {})
        totals = {"queued": workers.get("num_pending", 0), "in_flight": workers.get("num_ack_pending", 0),
                  "archived": archived, "dead": doc["deadletters"]["total"]}
        return page("overview.html", doc=doc, totals=totals, workers=workers, chart=self.chart(), live=True,
                    **request[CONTEXT])

    # -- crawls ------------------------------------------------------------------------------

    async def crawls(self, request: web.Request, *, form: dict[str, Any] | None = None, error: str | None = None,
                     status: int = 200) -> web.Response:
        doc = await self._snapshot()
        return page("crawls.html", status=status, crawls=doc.get("crawls") or [], form=form or {}, error=error,
                    live=form is None, **request[CONTEXT])

    async def crawl(self, request: web.Request) -> web.Response:
        progress = await self.server.crawl_progress(request.match_info["crawl_id"])
        planned = progress.max_pages
        done = progress.archived + progress.dead
        total = max(planned or 0, progress.budget_used, done, 1)
        columns = [k for k, v in progress.links.items() if v or k in ("discovered", "queued")]
        return page("crawl.html", crawl=progress, columns=columns, percent=round(100 * done / total), live=True,
                    **request[CONTEXT])

    async def start_crawl(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        fields = {name: str(form.get(name, "")) for name in CRAWL_FIELDS}
        body: dict[str, Any] = {"seeds": lines(fields["seeds"]), "scope": fields["scope"] or "host",
                                "include": lines(fields["include"]), "exclude": lines(fields["exclude"]),
                                "robots": fields["robots"] or "obey", "sitemaps": fields["sitemaps"] == "on"}
        for name in ("depth", "max_pages"):
            if fields[name].strip():
                body[name] = fields[name].strip()
        if fields["follow"].strip():
            body["follow"] = fields["follow"].strip()
        try:
            wanted = CrawlRequest.model_validate(body)
            started = await self.server.start_crawl(wanted)
        except ValidationError as exc:
            return await self.crawls(request, form=fields, error=describe_validation_error(exc), status=400)
        except ApiError as exc:
            return await self.crawls(request, form=fields, error=f"{exc.reason}: {exc.message}", status=exc.status)
        raise web.HTTPSeeOther(f"/console/crawls/{started.crawl_id}")

    # -- pages -------------------------------------------------------------------------------

    async def pages(self, request: web.Request) -> web.Response:
        """A search (text and filters, either or both) through ``GET /search``'s own reading of its
        parameters, a page of results at a time: the filters are in the query, so every matching
        page is reachable, not only the best hits."""
        q = request.query
        asked = {name: q.get(name, "").strip() for name in ASKED}
        found: SearchResults | None = None
        error = None
        limit = min(SEARCH_LIMIT, self.server.settings.api.max_search_results)
        if any(asked.values()):
            query = MultiDict({k: v for k, v in asked.items() if v and k != "where"})
            for condition in lines(asked["where"].replace(",", "\n")):
                query.add("where", condition)
            query.update(limit=str(limit), offset=q.get("offset", "0"))
            try:
                found = await self.server.searching.find(query)
            except ApiError as exc:
                error = f"{exc.reason}: {exc.message}"
        pager = {}
        if found is not None:
            kept = {k: v for k, v in asked.items() if v}
            if found.offset:
                pager["previous"] = "/console/pages?" + urlencode({**kept, "offset": max(found.offset - limit, 0)})
            if found.more:
                pager["next"] = "/console/pages?" + urlencode({**kept, "offset": found.offset + limit})
        return page("pages.html", status=400 if error and "invalid" in error else 200, asked=asked, found=found,
                    pager=pager, error=error, **request[CONTEXT])

    async def page_view(self, request: web.Request) -> web.Response:
        folder = request.query.get("key", "")
        meta = await self.folders.meta(folder)
        task_id = folder.rsplit("/", 1)[-1]
        record = await self.folders.record(meta)
        try:
            history = await self.server.task_history(task_id, task_id)
        except ApiError:  # STATUS and SEEN forget; the archive keeps the page
            history = None
        objects = self.folders.objects(meta)
        shots = [o["name"] for o in objects if str(o.get("content_type", "")).startswith("image/")]
        downloads = [(o["name"], DOWNLOADS.get(_kind(o["name"]), "file"), o.get("size")) for o in objects]
        return page("page.html", key=folder, meta=meta, record=record, history=history, shots=shots,
                    downloads=downloads, **request[CONTEXT])

    async def file(self, request: web.Request) -> web.Response:
        return await self.folders.download(request.query.get("key", ""), request.query.get("name", ""))


def _kind(name: str) -> str:
    stem = name.removesuffix(".gz")
    for suffix, kind in ((".html", "html"), (".har", "har"), (".warc", "warc"), (".txt", "text"),
                         (".png", "screenshot"), (".jpg", "screenshot"), (".jpeg", "screenshot"),
                         (".json", "extracted")):
        if stem.endswith(suffix):
            return kind
    return "file"
