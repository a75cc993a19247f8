"""Leases on archive folders, so that two ingesters never write one folder at once.

Two results of one task scraped on one UTC day (a recrawl the same day, a ``--force``, a replay)
share a folder. Written at the same time by two ingesters, their files could interleave and leave
a ``meta.json`` whose digests do not match the files beside it. So an ingester holds the folder's
key in the FOLDERS bucket while it writes: created atomically (first writer wins), renewed while
the write goes on, deleted when it is done. A lease a killed ingester left expires with the
bucket's TTL (``streams/folders.toml``); a renewal that fails for that long gives the folder up
and the write is abandoned before its ``meta.json`` (the result is retried). The lease is a
``bus.leases.Lease``: it names its holder, and a renewal whose reply was lost does not lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator

import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from busscrape.bus import leases, names
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import StorageUnavailable

log = structlog.get_logger("busscrape.ingester")

WAIT = 30.0  # how long a result waits for a folder another ingester writes, before it is retried later
POLL = 0.2


class FolderLost(StorageUnavailable):
    """The lease could not be renewed in time: another ingester may hold the folder now."""

    reason = "folder_lease_lost"


class FolderLeases:
    def __init__(self, js: JetStreamContext, holder: str, *, ttl: float = 30.0) -> None:
        self._js = js
        self.holder = holder.encode()
        self.ttl = ttl
        self._kv: KeyValue | None = None
        self.waited = 0
        """How often a folder was busy when this ingester wanted it."""

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(names.FOLDERS_BUCKET)
            self.ttl = (await self._kv.status()).ttl or self.ttl
        return self._kv

    @staticmethod
    def key(folder: str) -> str:
        """A folder's key: its digest (folder names hold characters keys may not)."""
        return hashlib.sha256(folder.encode()).hexdigest()[:40]

    @contextlib.asynccontextmanager
    async def hold(self, folder: str) -> AsyncIterator[Lease]:
        """Hold ``folder`` for the block. Raises ``StorageUnavailable`` when another ingester
        keeps it longer than ``WAIT`` or NATS does not answer (the result is retried later)."""
        try:
            kv = await self._bucket()
            lease = Lease(kv, self.key(folder), *await self._acquire(kv, self.key(folder), folder), self.ttl)
        except TRANSIENT as exc:
            raise StorageUnavailable(f"cannot lease archive folder {folder}: {exc!r}") from None
        try:
            yield lease
        finally:
            await lease.release()

    async def _acquire(self, kv: KeyValue, key: str, folder: str) -> tuple[int, bytes]:
        deadline = time.monotonic() + WAIT
        busy = False
        while True:
            if (taken := await leases.take(kv, key, self.holder)) is not None:
                return taken
            if not busy:
                busy = True
                self.waited += 1
                log.info("folder.busy", folder=folder)
            if time.monotonic() >= deadline:
                raise StorageUnavailable(f"archive folder {folder} is being written by another ingester",
                                         reason="folder_busy")
            await asyncio.sleep(POLL)


class Lease(leases.Lease):
    """One held folder (``bus.leases``: it names its holder, survives a renewal whose reply was
    lost). ``check()`` before committing: raises ``FolderLost`` if it was lost, or was not
    confirmed renewed for most of the TTL (it may be expiring while NATS is away)."""

    def lost_error(self) -> Exception:
        return FolderLost(f"the lease on archive folder key {self.key} was lost or not renewed in time")

    def check(self) -> None:
        if time.monotonic() - self.confirmed >= self.ttl * 0.75:
            raise self.lost_error()
        super().check()
