"""The archive in a local folder (the embedded default), written atomically.

A write goes to a temporary file in ``<root>/.partial/``, is fsynced, then renamed onto its key,
and the folder is fsynced (or, for ``durable=False``, left to the next durable write in it): a key
either holds the complete object or does not exist, whenever the process dies.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
import uuid
from collections.abc import AsyncIterable
from pathlib import Path
from typing import BinaryIO

from busscrape.archive.layout import STAGING
from busscrape.archive.storage.base import Storage
from busscrape.errors import ConfigurationError, StorageRefused, StorageUnavailable

PARTIAL_DIR = ".partial"  # dot-named: Spark, Hive and DuckDB globs skip it
STALE_PARTIAL = 3600.0  # seconds after which a temporary file is a crashed writer's leftover
WRITE_BUFFER = 256 * 1024  # bytes gathered before a write to the file (per upload in flight)


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
        """The file that holds ``key``. Refuses keys that would leave the root or hide (but in a
        folder's staging area, which the archive's readers are to skip)."""
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or (p.startswith(".") and p != STAGING) for p in parts):
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
            raise _failure(f"cannot write {final}", exc) from None
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
            raise _failure(f"cannot read {self.path(key)}", exc) from None

    async def delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self.path(key).unlink, missing_ok=True)
        except OSError as exc:
            raise _failure(f"cannot delete {self.path(key)}", exc) from None

    async def move(self, source: str, key: str) -> None:
        src, final = self.path(source), self.path(key)

        def rename() -> None:
            _make_dirs(final.parent)
            os.replace(src, final)
            _fsync_dir(final.parent)

        try:
            await asyncio.to_thread(rename)
        except OSError as exc:
            raise _failure(f"cannot move {src} to {final}", exc) from None

    async def keys(self, prefix: str = "") -> list[str]:
        def walk() -> list[str]:
            found = []
            for folder, dirs, files in os.walk(self.root):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                rel = Path(folder).relative_to(self.root).as_posix()
                found += [f if rel == "." else f"{rel}/{f}" for f in files if not f.startswith(".")]
            return sorted(k for k in found if k.startswith(prefix))

        return await asyncio.to_thread(walk)


# What the file system says of a name or an object, not of its own state: retrying cannot help.
_REFUSALS = {errno.ENAMETOOLONG, errno.EFBIG, errno.EINVAL}


def _failure(what: str, exc: OSError) -> StorageUnavailable | StorageRefused:
    if exc.errno in _REFUSALS:
        return StorageRefused(f"{what}: {exc.strerror}", reason="storage_refused")
    return StorageUnavailable(f"{what}: {exc}")


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
