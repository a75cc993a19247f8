"""Where the archive lives: a small async storage interface, and the local-folder implementation.

``Storage`` is keyed like S3 (``dt=…/host=…/<task_id>/page.html.gz``). Two implementations:

- ``FileStorage`` — a local folder (the embedded default). A write goes to a temporary file
  in ``<root>/.partial/``, is fsynced, then renamed onto its key, and the folder is fsynced
  (or, for ``durable=False``, left to the next durable write in it): a key either holds the
  complete object or does not exist, whenever the process dies.
- ``S3Storage`` (``storage_s3``) — any S3-compatible endpoint (MinIO first) through
  miniopy-async; large objects go up in parts.

Both are async context managers: entering checks that the storage is reachable (and creates
the bucket or folder), so a misconfiguration stops the process at start with
``ConfigurationError`` (or ``AuthenticationFailed``), while any error after that is
``StorageUnavailable``: the caller naks and tries again later, nothing is lost. Errors raised
by the chunks being written (``ArtifactUnusable`` …) pass through unchanged, and the key
is not written. Uploads are bounded per storage by ``max_uploads``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from busscrape.errors import ConfigurationError, StorageUnavailable

if TYPE_CHECKING:
    from busscrape.settings import Settings

PARTIAL_DIR = ".partial"  # dot-named: Spark, Hive and DuckDB globs skip it
STALE_PARTIAL = 3600.0  # seconds after which a temporary file is a crashed writer's leftover
WRITE_BUFFER = 256 * 1024  # bytes gathered before a write to the file (per upload in flight)


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

    @property
    def upload_slot(self) -> asyncio.Semaphore:
        """Taken by ``_put`` for the part of a write that occupies the storage."""
        assert self._uploads is not None, "entered before use"
        return self._uploads

    async def put_bytes(self, key: str, data: bytes, *, content_type: str) -> None:
        """Store a small object held in memory."""
        await self.put(key, _once(data), content_type=content_type)

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
    async def keys(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def open_storage(settings: Settings, archive_dir: Path | str | None = None) -> Storage:
    """The configured storage (not yet entered): ``archive_dir`` if given, else S3 when an
    endpoint is set, else the local archive folder."""
    uploads = settings.ingester.upload_concurrency
    if archive_dir is None and settings.s3.endpoint:
        from busscrape.archive.storage.s3 import S3Storage

        return S3Storage(settings.s3, max_uploads=uploads)
    folder = str(archive_dir) if archive_dir is not None else str(settings.archive_dir())
    if folder.startswith("file://"):
        folder = folder.removeprefix("file://")
    return FileStorage(Path(folder).expanduser(), max_uploads=uploads)


class FileStorage(Storage):
    """A local folder with the same keys as the bucket, written atomically."""

    def __init__(self, root: Path, *, max_uploads: int = 8) -> None:
        super().__init__(max_uploads=max_uploads)
        self.root = Path(root).absolute()
        self.partial = self.root / PARTIAL_DIR
        self.url = self.root.as_uri()

    async def open(self) -> None:
        try:
            await asyncio.to_thread(self._prepare)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write to the archive folder {self.root} ({exc.strerror or exc}); fix its permissions, "
                "or choose another with --archive or BUSSCRAPE_ARCHIVE__DIR"
            ) from None

    def _prepare(self) -> None:
        self.partial.mkdir(parents=True, exist_ok=True)
        probe = self.partial / f"probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
        # Leftovers of writers that died mid-write: never visible under a key, only space.
        cutoff = time.time() - STALE_PARTIAL
        for leftover in self.partial.iterdir():
            try:
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
            except OSError:
                pass  # another process cleaned it first

    def path(self, key: str) -> Path:
        """The file that holds ``key``. Refuses keys that would leave the root or hide."""
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise ValueError(f"not an archive key: {key!r}")
        return self.root.joinpath(*parts)

    async def _put(self, key: str, chunks: AsyncIterable[bytes], *, content_type: str,
                   content_encoding: str | None, durable: bool) -> None:
        async with self.upload_slot:  # the whole write: the file is open from first chunk to rename
            await self._write(key, chunks, durable)

    async def _write(self, key: str, chunks: AsyncIterable[bytes], durable: bool) -> None:
        # Chunks are gathered in memory up to WRITE_BUFFER and written in one thread hop: most
        # archive files are smaller, so each costs a single hop (open, write, fsync, rename), not
        # one per chunk; on a busy machine every hop waits for a core. Memory stays bounded.
        final = self.path(key)
        temp = self.partial / f"{uuid.uuid4().hex}-{final.name}"
        handle: BinaryIO | None = None
        pending: list[bytes] = []
        size = 0
        try:
            async for chunk in chunks:
                pending.append(chunk)
                size += len(chunk)
                if size >= WRITE_BUFFER:
                    if handle is None:
                        handle = await asyncio.to_thread(open, temp, "wb")
                    await asyncio.to_thread(handle.writelines, pending)
                    pending, size = [], 0
            await asyncio.to_thread(self._commit, handle, pending, temp, final, durable)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write {final}: {exc}") from None
        finally:
            if handle is not None and not handle.closed:
                handle.close()
            if temp.exists():
                temp.unlink(missing_ok=True)

    def _commit(self, handle: BinaryIO | None, rest: list[bytes], temp: Path, final: Path, durable: bool) -> None:
        with handle or open(temp, "wb") as out:
            out.writelines(rest)
            out.flush()
            os.fsync(out.fileno())  # always: a name that survives must never point at lost bytes
        _make_dirs(final.parent)
        os.replace(temp, final)
        if durable:
            _fsync_dir(final.parent)  # the rename itself must survive a power cut, not just the bytes

    async def get(self, key: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self.path(key).read_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {self.path(key)}: {exc}") from None

    async def delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self.path(key).unlink, missing_ok=True)
        except OSError as exc:
            raise StorageUnavailable(f"cannot delete {self.path(key)}: {exc}") from None

    async def keys(self, prefix: str = "") -> list[str]:
        def walk() -> list[str]:
            found = []
            for folder, dirs, files in os.walk(self.root):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                rel = Path(folder).relative_to(self.root).as_posix()
                found += [f if rel == "." else f"{rel}/{f}" for f in files if not f.startswith(".")]
            return sorted(k for k in found if k.startswith(prefix))

        return await asyncio.to_thread(walk)


def _make_dirs(folder: Path) -> None:
    """``mkdir -p`` that also fsyncs the parent of every folder it creates."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)  # another writer may create it at the same moment
        _fsync_dir(created.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
