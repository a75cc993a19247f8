"""The archive's storage interface: keyed like S3, streamed puts, bounded uploads.

``Storage`` is keyed like S3 (``dt=…/host=…/<task_id>/page.html.gz``). Every backend is an
async context manager: entering checks that the storage is reachable (and creates the bucket or
folder), so a misconfiguration stops the process at start with ``ConfigurationError`` (or
``AuthenticationFailed``), while any error after that is ``StorageUnavailable``: the caller naks
and tries again later, nothing is lost. Errors raised by the chunks being written
(``ArtifactUnusable`` …) pass through unchanged, and the key is not written. Uploads are bounded
per storage by ``max_uploads``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator


class Storage(ABC):
    """An object store by key: put (streamed), get (small objects), delete, list."""

    url: str
    """Where it points (``s3://bucket``, ``file:///srv/archive``), for logs and messages."""

    def __init__(self, *, max_uploads: int = 8) -> None:
        self.max_uploads = max_uploads
        self._uploads: asyncio.Semaphore | None = None
        self._entered = False

    async def __aenter__(self) -> Storage:
        if self._entered:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        self._entered = True
        self._uploads = asyncio.Semaphore(self.max_uploads)
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def put(self, key: str, chunks: AsyncIterable[bytes], *, content_type: str,
                  content_encoding: str | None = None, durable: bool = True) -> None:
        """Store the chunks under ``key``, replacing what is there, once all of them arrived.

        At most ``max_uploads`` writes hold an upload slot at once; an implementation may read
        ahead a bounded amount of the chunks before it waits for one.

        ``durable=False``: the key's bytes are durable, its name only once a later durable put
        in the same folder returns (a folder syncs all its names at once). The archive writes
        a result's files so and ``meta.json`` last: one folder sync per result, not one per
        file, and a folder without its ``meta.json`` is incomplete anyway. S3 puts are always
        durable.
        """
        if self._uploads is None:
            raise RuntimeError(f"enter the {type(self).__name__} (async with) before using it")
        await self._put(key, chunks, content_type=content_type, content_encoding=content_encoding, durable=durable)

    def key_of(self, location: str) -> str:
        """The key of ``location``: this storage's URL and a key, as results record where they were
        archived (``s3://bucket/prefix/dt=…/<task_id>``)."""
        base = self.url.rstrip("/") + "/"
        return location[len(base):] if location.startswith(base) else location.strip("/")

    @property
    def upload_slot(self) -> asyncio.Semaphore:
        """Taken by ``_put`` for the part of a write that occupies the storage."""
        assert self._uploads is not None, "entered before use"
        return self._uploads

    async def put_bytes(self, key: str, data: bytes, *, content_type: str, durable: bool = True) -> None:
        """Store a small object held in memory."""
        await self.put(key, _once(data), content_type=content_type, durable=durable)

    @abstractmethod
    async def open(self) -> None:
        """Check that the storage is reachable; create the bucket or folder when missing."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections."""

    @abstractmethod
    async def _put(self, key: str, chunks: AsyncIterable[bytes], *, content_type: str,
                   content_encoding: str | None, durable: bool) -> None: ...

    @abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The whole object, or ``None`` when there is none under ``key``."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key`` (a missing key is fine)."""

    @abstractmethod
    async def move(self, source: str, key: str) -> None:
        """Put the object under ``source`` under ``key`` instead (replacing what is there), its
        content type and encoding kept; durable like a ``put``."""

    @abstractmethod
    async def keys(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
