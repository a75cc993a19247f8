"""Leases on KV keys: held by one process of the fleet at a time, renewed while held, gone with
the bucket's TTL when their holder dies (HOSTS: a worker's host slots and session logins,
``worker.leases``; FOLDERS: an ingester's archive folders, ``ingest.leases``).

``take`` *creates* the key (atomic, first writer wins) with a value naming its holder: the
worker's name and a token of this one take, so a holder can tell its lease from one another
worker (or another task of the same worker) took after it expired. The holder renews it every
third of the TTL by compare-and-set on its revision, and deletes it when done. A host's page
slots (``fleet_gate.Slot``) and a session's login (``sessions``) are such leases.

What the holder knows of its lease is checked against the key, never assumed:

- a renewal whose reply was lost (a timeout) may have been applied: the next compare-and-set
  then fails on a revision the holder never saw. The key is read again: still naming this
  holder, it is this holder's at the revision read (renewed, released as usual); naming another,
  or gone, the lease is *lost*;
- a holder that could not renew for a whole TTL has lost it too (the bucket removed the key, and
  another worker may hold it now).

A lost lease stops the work it guards (``guard`` cancels it and raises ``lost_error()``, which
each kind of lease names) and work not started yet does not start (``check``): two workers never
render in "one" slot, nor log one session in twice, nor two ingesters write one folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from busscrape.bus.retry import TRANSIENT

log = structlog.get_logger("busscrape.leases")
T = TypeVar("T")


class Lease:
    """One held key, renewed until released (release is idempotent)."""

    def __init__(self, kv: KeyValue, key: str, revision: int, value: bytes, ttl: float) -> None:
        self._kv, self.key, self.revision, self.ttl, self.value = kv, key, revision, ttl, value
        self.lost = asyncio.Event()
        self.confirmed = time.monotonic()
        """When the key was last known to be this holder's (``time.monotonic``)."""
        self._released = False
        self._renewing = asyncio.create_task(self._keep(), name=f"lease {key}")
        self._renewing.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: not logged unseen

    def lost_error(self) -> Exception:
        """What ``check`` and ``guard`` raise once the lease is lost (each kind of lease says)."""
        return RuntimeError(f"the lease on {self.key} was lost")

    def check(self) -> None:
        """Raise ``lost_error()`` when the lease is not this holder's any more (before starting work)."""
        if self.lost.is_set():
            raise self.lost_error()

    async def guard(self, work: Awaitable[T]) -> T:
        """``work``'s outcome, or ``lost_error()`` as soon as the lease is lost (``work`` cancelled)."""
        self.check()
        doing = asyncio.ensure_future(work)
        losing = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait((doing, losing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not doing.done():
                doing.cancel()
            losing.cancel()
            await asyncio.gather(doing, losing, return_exceptions=True)
        if doing.cancelled() and self.lost.is_set():
            log.warning("lease.work_stopped", key=self.key)
            self.check()
        return doing.result()

    async def _keep(self) -> None:
        # The flag, not only the cancel, ends the renewals: on Python 3.11 a cancel that lands as
        # a renewal's reply arrives is swallowed by ``asyncio.wait_for`` inside nats-py (cpython
        # gh-86296), and the loop would renew a released lease for ever.
        while not self.lost.is_set() and not self._released:
            await asyncio.sleep(self.ttl / 3)
            await self._renew()

    async def _renew(self) -> None:
        try:
            self.revision = await self._kv.update(self.key, self.value, last=self.revision)
            self.confirmed = time.monotonic()
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # expired and taken, or an earlier renewal of ours applied though its reply was lost
        except TRANSIENT as exc:
            log.warning("lease.renew_failed", key=self.key, error=repr(exc))
        await self._verify()

    async def _verify(self) -> None:
        """Read the key again: adopt its revision while it names this holder, else the lease is lost."""
        try:
            entry = await self._kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return self._lose("gone")
        except TRANSIENT as exc:
            if time.monotonic() - self.confirmed >= self.ttl:
                return self._lose(f"not renewed for the TTL: {exc!r}")
            return None
        if entry.value != self.value:
            return self._lose("another holder")
        if entry.revision != self.revision:
            log.info("lease.revision_adopted", key=self.key, revision=entry.revision)
            self.revision = entry.revision or self.revision
            self.confirmed = time.monotonic()
        return None

    def _lose(self, why: str) -> None:
        log.warning("lease.lost", key=self.key, why=why)
        self.lost.set()

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._renewing.cancel()
        # Bounded: should the cancel be swallowed (see ``_keep``), the renewal under way ends on
        # its own request timeout and the loop stops at the flag; never wait on it for ever.
        await asyncio.wait({self._renewing}, timeout=self.ttl)
        if self.lost.is_set():
            return  # not ours: never delete another holder's key
        with contextlib.suppress(*TRANSIENT):
            try:
                await self._kv.delete(self.key, last=self.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._verify()  # a renewal applied unseen: delete at the revision read
                if not self.lost.is_set():
                    await self._kv.delete(self.key, last=self.revision)


async def take(kv: KeyValue, key: str, holder: bytes) -> tuple[int, bytes] | None:
    """Create ``key`` naming ``holder`` and this take: (its revision, the value written), or None
    when another worker holds it."""
    value = holder + b" " + uuid.uuid4().hex[:16].encode()
    try:
        return await kv.create(key, value), value
    except nats.js.errors.KeyWrongLastSequenceError:
        return None
    except nats.js.errors.KeyNotFoundError:
        # nats-py's create reads a refused key again (a delete marker would be free): the holder's
        # key expired in between. Held a moment ago, free now: the caller's next ask takes it.
        return None
