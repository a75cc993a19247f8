"""Leases on keys of the HOSTS bucket: held by one worker of the fleet at a time, renewed while
held, gone with the bucket's TTL (``streams.host_lease_ttl``) when their holder dies.

``take`` *creates* the key (atomic, first writer wins); the holder renews it every third of the
TTL by compare-and-set on its revision and deletes it when done. A host's page slots
(``fleet_gate.Slot``) and a session's login (``sessions``) are such leases.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from busscrape.bus.retry import TRANSIENT

log = structlog.get_logger("busscrape.worker")


class Lease:
    """One held key, renewed until released (release is idempotent)."""

    def __init__(self, kv: KeyValue, key: str, revision: int, ttl: float) -> None:
        self._kv, self.key, self.revision, self.ttl = kv, key, revision, ttl
        self._renewing = asyncio.create_task(self._keep(), name=f"lease {key}")
        self._released = False

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                self.revision = await self._kv.update(self.key, b"held", last=self.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                # Expired (NATS unreachable for a TTL) and taken by another worker: it is theirs now.
                log.warning("lease.lost", key=self.key)
                return
            except TRANSIENT as exc:
                log.warning("lease.renew_failed", key=self.key, error=repr(exc))

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._renewing.cancel()
        await asyncio.gather(self._renewing, return_exceptions=True)
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError, *TRANSIENT):
            await self._kv.delete(self.key, last=self.revision)


async def take(kv: KeyValue, key: str, holder: bytes) -> int | None:
    """Create ``key`` (the revision), or None when another worker holds it."""
    try:
        return await kv.create(key, holder)
    except nats.js.errors.KeyWrongLastSequenceError:
        return None
