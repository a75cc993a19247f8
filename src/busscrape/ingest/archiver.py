"""Archiving one result: its artifacts streamed from ARTIFACTS into the storage, then meta.json.

Keys come from the result alone (``archive.layout``), so a redelivered result writes the same
keys with the same bytes. Artifacts are copied concurrently, each streamed and checked against its
claim check on the way, gzip-compressed where the layout says so, and written not durable on their
own: ``meta.json``, written last into the same folder, makes them durable together and marks the
folder complete.

One folder holds one task's scrape of one UTC day; two results can want it (a recrawl the same
day). So, under a lease on the folder (``leases``: no two ingesters write it at once)::

    meta.json there, describing this result ───────────────► nothing to write (a redelivery)
    meta.json there, describing a later scrape ────────────► nothing to write (that one stays)
    meta.json there, describing an earlier scrape ─────────► stage this result's files beside it
         (in <folder>/.staging/), then swap: meta.json out,       (a failure on the way removes the
          staged files in, the earlier scrape's extra files out,   staged files only: the complete
          meta.json in                                             folder stays complete)
    no meta.json ──────────────────────────────────────────► write the files, then meta.json
                                                               (a failure removes what this wrote)
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
from busscrape.ingest.leases import FolderLeases, Lease
from busscrape.model.messages import ScrapeResult
from busscrape.telemetry import tracing

JSON = "application/json"


@dataclass(frozen=True)
class Archived:
    """What archiving one result did."""

    plan: layout.ArchivePlan
    objects: tuple[layout.StoredObject, ...]
    reused: bool
    """Nothing was written: meta.json already described this result (a redelivery after a
    crash), or a later scrape of the same task and day (``superseded``)."""
    superseded: bool = False

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)


class Archiver:
    """Writes one result's objects and then its meta.json."""

    def __init__(self, storage: Storage, artifacts: ArtifactStore, leases: FolderLeases | None = None, *,
                 prefix: str = "", compress: bool = True, gzip_level: int = layout.GZIP_LEVEL) -> None:
        self.storage = storage
        self.artifacts = artifacts
        self.leases = leases
        self.prefix = prefix
        self.compress = compress
        self.gzip_level = gzip_level
        # Without leases (one process alone on its archive): one writer per folder in this process.
        self._folders: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def archive(self, result: ScrapeResult) -> Archived:
        """Archive ``result``. Raises ``PermanentError`` (dead-letter) or ``RetryableError`` (nak)."""
        plan = layout.plan(result, prefix=self.prefix, compress=self.compress)
        async with self._hold(plan.folder) as lease:
            existing = await self.storage.get(plan.meta_key)
            if existing is not None and layout.describes(existing, result, plan):
                return Archived(plan, (), reused=True)
            if existing is not None and layout.supersedes(existing, result):
                return Archived(plan, (), reused=True, superseded=True)
            if existing is None:
                stored = await self._write(plan)
            else:
                stored = await self._swap(plan, existing, lease)
            if lease is not None:
                lease.check()  # the commit: only while the folder is still ours
            await self.storage.put_bytes(plan.meta_key, layout.meta_document(result, stored), content_type=JSON)
        return Archived(plan, tuple(stored), reused=False)

    @contextlib.asynccontextmanager
    async def _hold(self, folder: str) -> AsyncIterator[Lease | None]:
        if self.leases is not None:
            async with self.leases.hold(folder) as lease:
                yield lease
        else:
            async with self._folders.setdefault(folder, asyncio.Lock()):
                yield None

    async def _write(self, plan: layout.ArchivePlan) -> list[layout.StoredObject]:
        """Every object under its key; after a permanent failure, only what this wrote is removed."""
        written: list[str] = []
        try:
            return await _all(self._copy(o, o.key, written) for o in plan.objects)
        except PermanentError:
            await self._remove(written)
            raise

    async def _swap(self, plan: layout.ArchivePlan, meta: bytes, lease: Lease | None) -> list[layout.StoredObject]:
        """Replace an earlier complete scrape in the folder without ever breaking it: stage first."""
        staged = {o.key: layout.staged_key(plan.folder, o.key) for o in plan.objects}
        written: list[str] = []
        try:
            stored = await _all(self._copy(o, staged[o.key], written) for o in plan.objects)
        except PermanentError:
            await self._remove(written)
            raise
        if lease is not None:
            lease.check()
        # From here until meta.json is written the folder does not claim to be complete: a crash
        # leaves no meta.json, and the redelivery writes the whole folder again from ARTIFACTS.
        await self.storage.delete(plan.meta_key)
        for o in plan.objects:
            await self.storage.move(staged[o.key], o.key)
        ours = {o.key for o in plan.objects}
        for key in sorted(layout.listed_keys(meta) - ours):
            if key.startswith(plan.folder + "/"):
                await self.storage.delete(key)
        return stored

    async def _remove(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(RetryableError):  # best effort: unlisted leftovers are invisible
                await self.storage.delete(key)

    async def _copy(self, planned: layout.PlannedObject, key: str, written: list[str]) -> layout.StoredObject:
        # Noted before it starts: a write cut short by another's failure may still land (a file's
        # rename in its thread), and removing a key that never came is harmless.
        written.append(key)
        with tracing.span("copy artifact", **{"busscrape.artifact": planned.name, "busscrape.key": key}):
            return await self._copy_one(planned, key)

    async def _copy_one(self, planned: layout.PlannedObject, key: str) -> layout.StoredObject:
        ref = planned.ref
        if planned.inline is not None:  # made from the result (extracted.json): nothing to stream
            await self.storage.put_bytes(key, planned.inline, content_type=ref.content_type, durable=False)
            return layout.StoredObject(key=planned.key, name=planned.name, size=ref.size, sha256=ref.sha256,
                                       content_type=ref.content_type, content_encoding=None,
                                       original_size=ref.size, original_sha256=ref.sha256)
        async with aclosing(self.artifacts.stream(ref)) as source:
            # Not durable on their own: meta.json, written last into the same folder, makes them so.
            if planned.content_encoding is None:
                await self.storage.put(key, source, content_type=ref.content_type, durable=False)
                # The stream checked size and sha256 before it ended, and the bytes are stored as they came.
                size, sha256 = ref.size, ref.sha256
            else:
                measured = _Measured(layout.gzip_stream(source, self.gzip_level))
                await self.storage.put(key, measured, content_type=ref.content_type,
                                       content_encoding=planned.content_encoding, durable=False)
                size, sha256 = measured.size, measured.sha256
        return layout.StoredObject(
            key=planned.key, name=planned.name, size=size, sha256=sha256, content_type=ref.content_type,
            content_encoding=planned.content_encoding, original_size=ref.size, original_sha256=ref.sha256,
        )


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
