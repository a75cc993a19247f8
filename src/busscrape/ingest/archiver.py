"""Archiving one result: its artifacts streamed from ARTIFACTS into the storage, then meta.json.

Keys come from the result alone (``archive.layout``), so a redelivered result writes the same
keys with the same bytes. Artifacts are copied concurrently, each streamed and checked against its
claim check on the way, gzip-compressed where the layout says so, and written not durable on their
own: ``meta.json``, written last into the same folder, makes them durable together and marks the
folder complete. A permanent failure (an artifact gone, a checksum wrong) leaves no half folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from busscrape.archive import layout
from busscrape.archive.storage import Storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.errors import PermanentError, RetryableError
from busscrape.model.messages import ScrapeResult
from busscrape.telemetry import tracing

JSON = "application/json"


@dataclass(frozen=True)
class Archived:
    """What archiving one result did."""

    plan: layout.ArchivePlan
    objects: tuple[layout.StoredObject, ...]
    reused: bool
    """meta.json already described this result (a redelivery after a crash): nothing was written."""

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)


class Archiver:
    """Writes one result's objects and then its meta.json."""

    def __init__(self, storage: Storage, artifacts: ArtifactStore, *, prefix: str = "", compress: bool = True,
                 gzip_level: int = layout.GZIP_LEVEL) -> None:
        self.storage = storage
        self.artifacts = artifacts
        self.prefix = prefix
        self.compress = compress
        self.gzip_level = gzip_level
        # Two results of one task on one day share a folder: one at a time in this process.
        self._folders: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def archive(self, result: ScrapeResult, *, first_try: bool = False) -> Archived:
        """Archive ``result``. Raises ``PermanentError`` (dead-letter) or ``RetryableError`` (nak).

        ``first_try``: the first delivery of a first attempt, which cannot have written anything
        yet, so the folder is not inspected first (one request less per result on the hot path).
        A folder that another scrape of the same task wrote earlier the same day is then simply
        overwritten, meta.json last; what it listed and the new scrape lacks stays unlisted.
        """
        plan = layout.plan(result, prefix=self.prefix, compress=self.compress)
        lock = self._folders.setdefault(plan.folder, asyncio.Lock())
        async with lock:
            existing = None if first_try else await self.storage.get(plan.meta_key)
            if existing is not None and layout.describes(existing, result, plan):
                return Archived(plan, (), reused=True)
            if existing is not None:
                await self._replace(plan, existing)
            try:
                stored = await _all(self._copy(o) for o in plan.objects)
            except PermanentError:
                await self._discard(plan)
                raise
            await self.storage.put_bytes(plan.meta_key, layout.meta_document(result, stored), content_type=JSON)
        return Archived(plan, tuple(stored), reused=False)

    async def _replace(self, plan: layout.ArchivePlan, meta: bytes) -> None:
        """Make way for another result of the same task and day. Its meta.json goes first, so
        the folder never claims to be complete while it holds a mix of both."""
        await self.storage.delete(plan.meta_key)
        ours = {o.key for o in plan.objects}
        for key in sorted(layout.listed_keys(meta) - ours):
            if key.startswith(plan.folder + "/"):
                await self.storage.delete(key)

    async def _copy(self, planned: layout.PlannedObject) -> layout.StoredObject:
        with tracing.span("copy artifact", **{"busscrape.artifact": planned.name, "busscrape.key": planned.key}):
            return await self._copy_one(planned)

    async def _copy_one(self, planned: layout.PlannedObject) -> layout.StoredObject:
        ref = planned.ref
        async with aclosing(self.artifacts.stream(ref)) as source:
            # Not durable on their own: meta.json, written last into the same folder, makes them so.
            if planned.content_encoding is None:
                await self.storage.put(planned.key, source, content_type=ref.content_type, durable=False)
                # The stream checked size and sha256 before it ended, and the bytes are stored as they came.
                size, sha256 = ref.size, ref.sha256
            else:
                measured = _Measured(layout.gzip_stream(source, self.gzip_level))
                await self.storage.put(planned.key, measured, content_type=ref.content_type,
                                       content_encoding=planned.content_encoding, durable=False)
                size, sha256 = measured.size, measured.sha256
        return layout.StoredObject(
            key=planned.key, name=planned.name, size=size, sha256=sha256, content_type=ref.content_type,
            content_encoding=planned.content_encoding, original_size=ref.size, original_sha256=ref.sha256,
        )

    async def _discard(self, plan: layout.ArchivePlan) -> None:
        """After a permanent failure, remove what this result wrote (best effort): no half folder.
        A meta.json there is another scrape's, whose objects these may have replaced: it goes too."""
        for planned in (*plan.objects, plan.meta_key):
            with contextlib.suppress(RetryableError):
                await self.storage.delete(planned if isinstance(planned, str) else planned.key)


class _Measured:
    """Passes chunks through, counting and hashing them: the stored object's size and sha256."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks
        self._digest = hashlib.sha256()
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            self.size += len(chunk)
            self._digest.update(chunk)
            yield chunk

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


async def _all(coros: Iterable[Any]) -> list[Any]:
    """``gather`` that cancels the rest as soon as one fails (no point finishing the others)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
