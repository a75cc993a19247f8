"""The pages of a run as they land: each task's outcome, turned into a ``Page``.

A run's tracker (``status.tracker``) records each task's first outcome once; ``PageFeed.outcome``
is its listener. Outcomes recorded before the feed began belong to an earlier run of the same
input or crawl (a resumed one): that run yielded them, so they are skipped, and a resumed crawl
gives the rest of its pages, not the first ones again. Archived pages are read back from their
folder (``meta.json``, ``extracted.json``) once their outcome is there: ``meta.json`` is written
last, before the ingester records ``archived``, so the folder is complete.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

if TYPE_CHECKING:
    from busscrape.archive.storage import Storage
    from busscrape.settings import Settings
    from busscrape.status.records import TaskStatus

T = TypeVar("T")

ROW_FIELDS = ("url", "final_url", "status", "title", "task_id", "archived_at", "folder", "extracted", "dead_reason")
"""The dataset's columns (``-o``), in order."""


@dataclass(frozen=True)
class Page:
    """One page of a run: archived (``dead`` is None) or dead-lettered (``dead`` is the reason)."""

    url: str
    task_id: str
    final_url: str | None = None
    status: int | None = None
    title: str | None = None
    folder: str | None = None
    """Where it is archived: a local path, or an ``s3://`` URL."""
    extracted: dict[str, Any] | None = None
    """The extractor's record, or None."""
    dead: str | None = None
    """None for an archived page, else the dead-letter reason (``http_404`` …)."""
    error: str | None = None
    """A dead page's error text."""
    archived_at: datetime | None = None
    """When its outcome was recorded."""
    _settings: Settings | None = field(default=None, repr=False, compare=False)
    """The run's settings, for ``read`` of a folder in cloud storage (the archive it was written to)."""

    def read(self, name: str) -> bytes:
        """An artifact of the archived folder, decompressed (``page.html``, ``page.txt``,
        ``screenshot.png``, ``extracted.json``, ``meta.json`` …); ``FileNotFoundError`` when the
        folder has no such file. A folder in cloud storage (``s3://``, ``gs://``, ``az://``) is read
        through the run's archive settings (those the ingester wrote it with)."""
        if self.folder is None:
            raise FileNotFoundError(f"{self.url}: dead-lettered ({self.dead}), nothing archived")
        # The archive stores text gzip-compressed under NAME.gz, images as they are under NAME.
        names = (name, f"{name}.gz")
        if "://" in self.folder and not self.folder.startswith("file://"):
            if self._settings is None:
                raise FileNotFoundError(f"{self.folder}: no archive settings to read it with")
            found = _blocking(_first_in_cloud(self._settings, self.folder, names))
        else:
            found = next(((n, (Path(self.folder) / n).read_bytes()) for n in names
                          if (Path(self.folder) / n).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"{self.folder}: no {name}")
        stored_name, data = found
        return gzip.decompress(data) if stored_name != name else data

    def row(self) -> dict[str, Any]:
        """The page's dataset row (``ROW_FIELDS``)."""
        doc = {name: getattr(self, name) for name in ROW_FIELDS if name != "dead_reason"}
        doc["dead_reason"] = self.dead
        doc["archived_at"] = self.archived_at.isoformat() if self.archived_at else None
        return {name: doc[name] for name in ROW_FIELDS}


class PageFeed:
    """The pages of one run, each once, in the order their outcomes were recorded."""

    def __init__(self, settings: Settings, *, dead: bool = True) -> None:
        self.settings = settings
        self.dead = dead
        self.began = datetime.now(UTC)
        self._outcomes: asyncio.Queue[TaskStatus | None] = asyncio.Queue()
        self._seen: set[str] = set()
        self._storage: Storage | None = None

    def outcome(self, status: TaskStatus) -> None:
        """The tracker's listener: a task's first outcome in this run."""
        if status.at < self.began or status.task_id in self._seen:
            return  # an earlier run's (it yielded it), or already fed
        if status.state == "dead" and not self.dead:
            return
        self._seen.add(status.task_id)
        self._outcomes.put_nowait(status)

    def close(self) -> None:
        """No more outcomes: ``pages()`` ends once the queued ones are read."""
        self._outcomes.put_nowait(None)

    async def pages(self) -> Any:
        """Each queued outcome as a ``Page`` (an async iterator ending after ``close()``)."""
        try:
            while (status := await self._outcomes.get()) is not None:
                yield await self.page(status)
        finally:
            if self._storage is not None:
                await self._storage.close()

    async def page(self, status: TaskStatus) -> Page:
        if status.state != "archived":
            return Page(url=status.url or "", task_id=status.task_id, dead=status.reason or "unknown",
                        error=status.error, status=status.status, archived_at=status.at)
        folder = _where(status.archive or "")
        meta = orjson.loads(await self._get(folder, "meta.json") or b"{}")
        extracted = None
        if meta.get("extraction"):
            raw = await self._get(folder, meta["extraction"].get("file") or "extracted.json")
            extracted = orjson.loads(raw)["record"] if raw else None
        return Page(url=meta.get("url") or status.url or "", task_id=status.task_id, final_url=meta.get("final_url"),
                    status=meta.get("status", status.status), title=meta.get("title"), folder=folder,
                    extracted=extracted, archived_at=status.at,
                    _settings=self.settings)

    async def _get(self, folder: str, name: str) -> bytes | None:
        from busscrape.archive.storage import CLOUD_SCHEMES, open_storage

        if folder.split("://", 1)[0] not in CLOUD_SCHEMES:
            path = Path(folder) / name
            return await asyncio.to_thread(path.read_bytes) if path.is_file() else None
        if self._storage is None:  # the configured archive: s3://, gs:// or az://
            self._storage = open_storage(self.settings)
            await self._storage.__aenter__()
        return await self._storage.get(f"{self._storage.key_of(folder)}/{name}")


async def _first_in_cloud(settings: Settings, folder: str, names: tuple[str, ...]) -> tuple[str, bytes] | None:
    """The first of ``names`` the archive's cloud folder has, with its stored bytes."""
    from busscrape.archive.storage import open_storage

    async with open_storage(settings) as storage:
        base = storage.key_of(folder)
        for name in names:
            if (data := await storage.get(f"{base}/{name}")) is not None:
                return name, data
    return None


def _blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end from synchronous code, in or out of a running event loop: on its
    own loop in a thread (``Page.read`` is called from inside ``async for page in run``)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()


def _where(archive: str) -> str:
    """A folder URI as the user reads it: a local path, or the ``s3://`` URL as it is."""
    from urllib.parse import unquote

    # Path.as_uri() percent-encodes: a host folder's own %3A is %253A in the URI.
    return unquote(archive.removeprefix("file://")) if archive.startswith("file://") else archive
