"""Per-host politeness across the whole worker fleet, on NATS KV (the HOSTS and COOLING buckets).

A task may start at a host when three things hold, checked in this order right before it renders:

1. the host is not cooling (COOLING, which every worker watches: a 429/503 put it there);
2. one of the host's ``concurrency`` slots is free: ``slot.<host>.<i>`` is *created* (atomic,
   first writer wins) by the worker that takes it, renewed every third of the bucket's TTL while
   the page renders, deleted when it is done. A worker killed while holding one stops renewing,
   and the bucket's TTL (``streams.host_lease_ttl``) removes the key: the slot is free again;
3. the host's next start time (``next.<host>``, wall clock) has come: right before the
   navigation (``Slot.start``: page set-up time does not shift the start) the worker moves it on
   with a compare-and-set, so two workers never take one start. The delay is a floor between
   starts as the site sees them, so it is counted from when the navigation request went out
   (``Slot.sent``), not from the start's write (the write and the browser's trip to the request
   take a while, and not the same while for every worker): until the request is sent, the start
   is held for one more delay (``delay`` + jitter + ``delay`` from the write), and the sent
   request sets the next start to its own time + ``delay`` + jitter.

When one of them does not hold, ``enter`` answers how long to wait instead of waiting: the worker
naks the task with that delay (a *deferral*, see ``daemon``), so the task holds no browser slot
and no worker slot meanwhile, and the worker renders other hosts' tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT, transient_or
from busscrape.bus.scan import kv_latest
from busscrape.worker.host_rules import HostRules, Limit
from busscrape.worker.leases import Deferred, Lease, Wait, take

log = structlog.get_logger("busscrape.worker")
T = TypeVar("T")

_PLAIN = re.compile(r"[a-z0-9-]")


def host_token(host: str) -> str:
    """A host as KV key tokens (keys allow ``[-/_=.a-zA-Z0-9]``): other characters as ``_xx``,
    so ``[::1]`` and every hostname map to one key each, reversibly (``host_of``)."""
    host = host.lower().rstrip(".") or "_"
    dots_ok = ".." not in host and not host.startswith(".")
    return "".join(c if _PLAIN.match(c) or (c == "." and dots_ok) else "".join(f"_{b:02x}" for b in c.encode())
                   for c in host)


def host_of(token: str) -> str:
    return re.sub(rb"_([0-9a-f]{2})", lambda m: bytes([int(m[1], 16)]), token.encode()).decode(errors="replace")


async def _read_due(kv: KeyValue, key: str) -> tuple[int, float]:
    """The revision of a host's next-start key and the time it names (0, 0 when there is none)."""
    try:
        entry = await kv.get(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return 0, 0.0
    try:
        return entry.revision or 0, float(entry.value or b"0")
    except ValueError:
        return entry.revision or 0, 0.0  # not a time (written by something else): taken over


async def _nothing() -> None:
    return None


class Slot(Lease):
    """One held host slot (a lease on ``slot.<host>.<i>``) and the host's limit."""

    def __init__(self, kv: KeyValue, key: str, revision: int, value: bytes, ttl: float, *, token: str,
                 limit: Limit) -> None:
        super().__init__(kv, key, revision, value, ttl)
        self.token, self.limit = token, limit
        self._taken: tuple[int, float] | None = None
        """The start this slot took and not yet counted from its request: (revision, gap)."""

    async def start(self) -> float:
        """Take the host's next start (moving it on by the delay and a jitter, compare-and-set):
        0 when taken, else the seconds until it is due (another worker took it meanwhile)."""
        if self.limit.delay <= 0 and self.limit.jitter <= 0:
            return 0.0
        key = f"next.{self.token}"
        while True:
            revision, due = await _read_due(self._kv, key)
            now = time.time()
            if due > now:
                return due - now
            gap = self.limit.delay + random.uniform(0, self.limit.jitter)
            held = repr(now + gap + self.limit.delay).encode()  # until ``sent`` counts from the request
            try:
                if revision:
                    taken = await self._kv.update(key, held, last=revision)
                else:
                    taken = await self._kv.create(key, held)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another worker took this start: look again
            self._taken = (taken, gap)
            return 0.0

    async def sent(self, at: float) -> None:
        """The navigation request of the start taken went out at ``at`` (wall clock, read when the
        browser reported it: never before the site saw it): the host's next start is ``at`` + the
        gap drawn in ``start``, compare-and-set on that start's revision. Should that not be
        written (NATS away), the held start stays: a longer gap, never a shorter one."""
        if self._taken is None:
            return
        (revision, gap), self._taken = self._taken, None
        try:
            await self._kv.update(f"next.{self.token}", repr(at + gap).encode(), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            # Another worker took the next start: this request went out over a delay after its start.
            log.warning("host.start_overtaken", host=host_of(self.token), late=round(time.time() - at, 3))
        except TRANSIENT as exc:
            log.warning("host.start_not_moved", host=host_of(self.token), error=repr(exc))

    async def start_or_defer(self) -> None:
        """``start``, raising ``Deferred`` when the start is not this worker's to take now (nor
        the slot: ``LeaseLost``)."""
        self.check()
        if (left := await self.start()) > 0:
            raise Deferred(Wait(left, "delay"))

    async def __aenter__(self) -> Slot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class Unlimited:
    """The slot of a worker without fleet politeness (``worker.fleet_politeness = false``)."""

    async def start_or_defer(self) -> None:
        return None

    async def sent(self, at: float) -> None:
        return None

    async def guard(self, work: Awaitable[T]) -> T:
        return await work

    async def release(self) -> None:
        return None

    async def __aenter__(self) -> Unlimited:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class FleetGate:
    def __init__(self, js: JetStreamContext, rules: HostRules, *, holder: str, busy_retry: float,
                 ttl: float = 15.0) -> None:
        self._js = js
        self.rules = rules
        self.holder = holder.encode()
        self.busy_retry = busy_retry
        self.ttl = ttl
        self.cooling: dict[str, Cooling] = {}
        """Hosts cooling now, by host (kept current by ``watch_cooling``; a cooling that ran out
        is forgotten by ``_forget_cooled``: COOLING's ``max_age`` expiry sends no delete event)."""
        self._hosts: KeyValue | None = None
        self._cool: KeyValue | None = None
        self.deferred = 0

    async def _buckets(self) -> tuple[KeyValue, KeyValue]:
        if self._hosts is None or self._cool is None:
            self._hosts = await self._js.key_value(names.HOSTS_BUCKET)
            self.ttl = (await self._hosts.status()).ttl or self.ttl
            self._cool = await self._js.key_value(names.COOLING_BUCKET)
        return self._hosts, self._cool

    # -- entering ------------------------------------------------------------------------------

    async def enter(self, host: str) -> Slot | Wait:
        """A held slot on ``host``, or how long to wait before asking again. The slot's start is
        taken later, right before the navigation (``Slot.start``); here it is only looked at, so
        a task whose start is not due yet is deferred before it takes a browser tab. Raises what
        NATS raises when it does not answer (the task is retried like any outage)."""
        hosts, _ = await self._buckets()
        host = host.lower()
        if (left := self._cooling_left(host)) > 0:
            return Wait(left, "cooling")
        limit = self.rules.limit(host)
        token = host_token(host)
        paced = limit.delay > 0 or limit.jitter > 0
        slot, due = await asyncio.gather(self._take_slot(hosts, token, limit),
                                         self._due(hosts, token) if paced else _nothing())
        if slot is None:
            return Wait(self.busy_retry * random.uniform(0.5, 1.5), "busy")
        cooling = self._cooling_left(host)
        left = max(cooling, due[1] - time.time() if due else 0.0)
        if left > 0:
            # Cooled while the slot was taken (the worker that cooled it did so before its own
            # slot went), or the next start is not due yet.
            await slot.release()
            return Wait(left, "cooling" if cooling > 0 else "delay")
        return slot

    async def _due(self, kv: KeyValue, token: str) -> tuple[int, float]:
        return await _read_due(kv, f"next.{token}")

    def _cooling_left(self, host: str) -> float:
        cooling = self.cooling.get(host)
        if cooling is None:
            return 0.0
        left = cooling.until - time.time()
        if left <= 0:
            self.cooling.pop(host, None)
        return left

    def _forget_cooled(self) -> None:
        """Drop the coolings that ran out (on every change: the map holds only hosts cooling now)."""
        now = time.time()
        for host in [h for h, c in self.cooling.items() if c.until <= now]:
            del self.cooling[host]

    async def _take_slot(self, kv: KeyValue, token: str, limit: Limit) -> Slot | None:
        # From a random slot on, so workers do not all fight over slot 0 first.
        first = random.randrange(limit.concurrency)
        for i in range(limit.concurrency):
            key = f"slot.{token}.{(first + i) % limit.concurrency}"
            if (taken := await take(kv, key, self.holder)) is not None:
                return Slot(kv, key, *taken, self.ttl, token=token, limit=limit)
        return None

    # -- cooling -------------------------------------------------------------------------------

    async def cool(self, host: str, seconds: float, *, status: int | None, worker: str) -> None:
        """Cool ``host`` for the whole fleet for ``seconds`` (never shortening a longer cooling)."""
        if seconds <= 0:
            return
        _, kv = await self._buckets()
        host = host.lower()
        cooling = Cooling(host, time.time() + seconds, status, worker)
        current = self.cooling.get(host)
        if current is not None and current.until >= cooling.until:
            return
        self._forget_cooled()
        self.cooling[host] = cooling  # this worker at once, the others through their watch
        with contextlib.suppress(*TRANSIENT):
            await kv.put(host_token(host), cooling.encode())
        log.warning("host.cooling", host=host, seconds=round(seconds, 2), status=status)

    async def watch_cooling(self) -> None:
        """Keep ``cooling`` current from the COOLING bucket, for as long as the worker runs."""
        _, kv = await self._buckets()
        while True:
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None:  # the end of the initial values
                        continue
                    host = host_of(entry.key)
                    cooling = Cooling.decode(host, entry.value) if entry.operation is None else None
                    self._forget_cooled()
                    if cooling is None:
                        self.cooling.pop(host, None)
                    else:
                        self.cooling[host] = cooling
            except TRANSIENT as exc:
                log.warning("host.cooling_watch_failed", error=repr(exc))
                await asyncio.sleep(1.0)

    def cooling_now(self) -> list[Cooling]:
        now = time.time()
        return sorted((c for c in self.cooling.values() if c.until > now), key=lambda c: c.host)


@dataclass(frozen=True)
class Cooling:
    host: str
    until: float
    status: int | None
    worker: str

    def encode(self) -> bytes:
        return orjson.dumps({"until": self.until, "status": self.status, "worker": self.worker})

    @classmethod
    def decode(cls, host: str, value: bytes | None) -> Cooling | None:
        try:
            raw = orjson.loads(value or b"")
            return cls(host, float(raw["until"]), raw.get("status"), str(raw.get("worker", "")))
        except (ValueError, TypeError, KeyError):
            return None


async def cooling_hosts(js: JetStreamContext) -> list[Cooling]:
    """Hosts cooling now, read from COOLING (for ``busscrape status``); empty when it cannot be read."""
    try:
        entries = await kv_latest(js, names.COOLING_BUCKET)
    except transient_or(nats.js.errors.NotFoundError):
        return []
    now = time.time()
    found = [c for key, value in entries.items() if (c := Cooling.decode(host_of(key), value)) and c.until > now]
    return sorted(found, key=lambda c: c.host)


async def slots_by_worker(js: JetStreamContext) -> dict[str, dict[str, int]]:
    """The host slots each worker holds now, read from HOSTS (for ``busscrape status``): worker
    name → host → slots. A slot is held for each page a worker renders (with fleet politeness on)
    and its key goes with the bucket's TTL when the worker dies, so this is the fleet's live view;
    empty when HOSTS cannot be read."""
    try:
        entries = await kv_latest(js, names.HOSTS_BUCKET, "slot.>")
    except transient_or(nats.js.errors.NotFoundError):
        return {}
    held: dict[str, dict[str, int]] = {}
    for key, value in entries.items():
        token = key.removeprefix("slot.").rpartition(".")[0]
        worker = value.decode(errors="replace").rpartition(" ")[0]  # "<holder> <take token>" (leases.take)
        if token and worker:
            hosts = held.setdefault(worker, {})
            hosts[host_of(token)] = hosts.get(host_of(token), 0) + 1
    return held
