"""Feeding the search index from the ingester, off its hot path, never failing an archive.

The ingester calls ``SearchFeed.archived(result, plan)`` once a result is archived and acked.
That only queues the page; one background task per ingester takes what is queued in batches,
reads each page's visible text back from the archive (``page.txt[.gz]``, the ``text``
artifact: the object store copy is released right after the ack), and writes the batch to the
index in one transaction. So the index costs the archiving path one queue put, and whatever
the index does (slow, down, misconfigured) the result stays archived and acked:

- queue full (the index is far behind): the page is not indexed, counted ``index_dropped``;
- the index cannot be opened or written: logged, counted ``index_failed``; opening is retried
  at most every ``REOPEN_DELAY`` seconds, so an unwritable file does not flood the log;
- indexed pages are counted ``indexed``.

The counters are the ingester's own, so they show in its shutdown summary. ``busscrape search
--reindex`` rebuilds an index from the archive's ``meta.json`` files when pages were missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson
import structlog

from busscrape.archive.layout import ArchivePlan
from busscrape.archive.storage import Storage
from busscrape.deadletters.filing import host_of
from busscrape.errors import BusscrapeError, ConfigurationError, said
from busscrape.extract import records
from busscrape.model.messages import ScrapeResult
from busscrape.search import open_index
from busscrape.search.index import IndexedPage, SearchIndex
from busscrape.settings import Settings

log = structlog.get_logger("busscrape.search")

BATCH = 50  # pages per index transaction
TEXT_NAMES = ("page.txt", "page.txt.gz")  # the text artifact in an archive folder, raw or compressed
REOPEN_DELAY = 30.0
_INLINE_INFLATE = 64 * 1024  # larger compressed texts are inflated in a thread


def inflate(data: bytes, limit: int, gzipped: bool) -> str:
    """The first ``limit`` bytes of a stored text object as text (gzip read as it is stored)."""
    if gzipped:
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, limit)
    return data[:limit].decode("utf-8", errors="replace")


async def page_from_archive(storage: Storage, plan: ArchivePlan, result: ScrapeResult, limit: int) -> IndexedPage:
    """The index row of an archived result; its text read back from the archive."""
    text = ""
    for planned in plan.objects:
        if planned.ref.kind == "text":
            data = await storage.get(planned.key) or b""
            gzipped = planned.content_encoding == "gzip"
            if len(data) > _INLINE_INFLATE:
                text = await asyncio.to_thread(inflate, data, limit, gzipped)
            else:
                text = inflate(data, limit, gzipped)
    extraction = result.extraction
    return IndexedPage(archive_key=plan.folder, task_id=result.task_id, url=result.url,
                       host=host_of(result.url) or "", title=result.title, text=text, scraped_at=result.scraped_at,
                       extractor=extraction.extractor if extraction else None,
                       record=extraction.record if extraction else None,
                       crawl_id=result.crawl.crawl_id if result.crawl else None, status=result.status)


class SearchFeed:
    """Queues archived pages and writes them to the index in the background (see the module doc)."""

    def __init__(self, settings: Settings, storage: Storage, counters: Counter[str] | None = None) -> None:
        self.settings = settings
        self.storage = storage
        self.enabled = settings.search.backend != "off"
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.limit = settings.search.max_text_bytes
        self._queue: asyncio.Queue[tuple[ScrapeResult, ArchivePlan]] = asyncio.Queue(settings.search.queue)
        self._index: SearchIndex | None = None
        self._next_open = 0.0
        self._writer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the background writer (the index is opened by it, so a start never fails on it)."""
        if self.enabled and self._writer is None:
            self._writer = asyncio.create_task(self._write_forever(), name="search-feed")

    def archived(self, result: ScrapeResult, plan: ArchivePlan) -> None:
        """Queue an archived page for the index; never blocks, never raises."""
        if not self.enabled:
            return
        try:
            self._queue.put_nowait((result, plan))
        except asyncio.QueueFull:
            self.counters["index_dropped"] += 1
            log.warning("search.dropped", task_id=result.task_id, queued=self._queue.qsize())

    async def close(self, timeout: float | None = None) -> None:
        """Index what is queued (for up to ``timeout``, default ``search.timeout``), then close the index."""
        if self._writer is not None:
            deadline = self.settings.search.timeout if timeout is None else timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), deadline)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        left = self._queue.qsize()
        if left:
            self.counters["index_dropped"] += left
            log.warning("search.unflushed", pages=left)
        if self._index is not None:
            index, self._index = self._index, None
            with contextlib.suppress(BusscrapeError, OSError):
                await index.close()

    # -- the writer ---------------------------------------------------------------------------

    async def _write_forever(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                self.counters["index_dropped"] += len(batch)  # closed mid-write: say so, as for the queued
                raise
            except Exception as exc:  # best effort: whatever the index does, the ingester goes on
                self.counters["index_failed"] += len(batch)
                log.warning("search.index_failed", pages=len(batch), error=said(exc))
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[tuple[ScrapeResult, ArchivePlan]]) -> None:
        index = await self._opened()
        if index is None:
            self.counters["index_failed"] += len(batch)
            return
        pages = await asyncio.gather(*(page_from_archive(self.storage, plan, result, self.limit)
                                       for result, plan in batch))
        await index.add(list(pages))
        self.counters["indexed"] += len(pages)
        log.debug("search.indexed", pages=len(pages))

    async def _opened(self) -> SearchIndex | None:
        """The open index, opening it when due; None while it cannot be opened."""
        if self._index is not None or time.monotonic() < self._next_open:
            return self._index
        index: SearchIndex | None = None
        try:
            index = open_index(self.settings)
            await index.__aenter__()
        except (ConfigurationError, OSError) as exc:
            self._next_open = time.monotonic() + REOPEN_DELAY
            log.warning("search.unavailable", error=str(exc), retry_in=REOPEN_DELAY)
            if index is not None:
                with contextlib.suppress(Exception):
                    await index.close()
            return None
        self._index = index
        log.info("search.opened", backend=index.backend, where=index.where)
        return index


async def reindex(storage: Storage, index: SearchIndex, *, limit: int, prefix: str = "",
                  batch: int = BATCH) -> int:
    """Index every complete folder of the archive (those with a ``meta.json``); returns the page count."""
    from busscrape.archive import layout

    done = 0
    pending: list[IndexedPage] = []
    for key in await storage.keys(prefix):
        if not key.endswith("/" + layout.META_NAME) or f"/{layout.DEADLETTER_FOLDER}/" in f"/{key}":
            continue
        page = await _page_from_meta(storage, key, limit)
        if page is not None:
            pending.append(page)
        if len(pending) >= batch:
            await index.add(pending)
            done, pending = done + len(pending), []
    await index.add(pending)
    return done + len(pending)


async def _page_from_meta(storage: Storage, meta_key: str, limit: int) -> IndexedPage | None:
    raw = await storage.get(meta_key)
    try:
        meta = orjson.loads(raw or b"")
        objects: Iterable[dict[str, Any]] = meta["objects"]
        text, extracted = "", None
        for obj in objects:
            if obj["name"] in TEXT_NAMES:
                data = await storage.get(obj["key"]) or b""
                text = await asyncio.to_thread(inflate, data, limit, obj.get("content_encoding") == "gzip")
            elif obj["name"] == records.EXTRACTED_NAME:
                extracted = orjson.loads(await storage.get(obj["key"]) or b"null")
        return IndexedPage(archive_key=meta_key.rsplit("/", 1)[0], task_id=meta["task_id"], url=meta["url"],
                           host=host_of(meta["url"]) or "", title=meta.get("title") or "", text=text,
                           scraped_at=datetime.fromisoformat(meta["scraped_at"]),
                           extractor=extracted["extractor"] if extracted else None,
                           record=extracted["record"] if extracted else None,
                           crawl_id=(meta.get("crawl") or {}).get("crawl_id"), status=meta.get("status"))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        log.warning("search.unreadable_meta", key=meta_key, error=str(exc))
        return None
