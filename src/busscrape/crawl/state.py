"""The crawl's state in the CRAWLS bucket, shared by every process of the fleet.

Nothing of a crawl lives in one process's memory: its rules, its page budget, what each page's
links became and the robots.txt it fetched are keys here (``streams/crawls.toml`` lists them),
so any worker can take any page and ``busscrape crawl`` run again resumes where the last one
stopped. The budget is one counter raised with compare-and-set (``KeyValue.update`` with the
revision read): two workers granting the last slot at once cannot both win. The same key holds
the reservations not yet settled, by page, so a worker killed between reserving and creating
loses no slot (``reserve``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats.js.errors
import orjson
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from busscrape.bus import names, payloads
from busscrape.bus.retry import TRANSIENT
from busscrape.bus.scan import kv_latest
from busscrape.crawl.spec import CrawlSpec
from busscrape.errors import StorageUnavailable, said
from busscrape.lru import Lru
from busscrape.model.messages import decode, encode

MAX_CRAWLS = 256  # crawls whose rules, scope and task-id tail one process keeps at hand
SEEDS = "seeds"
"""The page record of the seeds (a page key that is not a task id)."""


RECENT_SETTLES = 64
"""Holders of the last settles a budget names (``Budget.recent``): how far back a go that lost a
budget write can tell whether its census still stands without reading SEEN again."""


@dataclass
class Budget:
    """A crawl's budget key as read: pages queued or held (``used``), the holds not settled, how
    many holds were ever settled and the holders of the last ``RECENT_SETTLES`` of them."""

    used: int
    holds: dict[str, list[int]]
    settles: int
    recent: list[str]
    revision: int | None

    def settled(self, holder: str) -> None:
        self.settles += 1
        self.recent = [*self.recent, holder][-RECENT_SETTLES:]

    def settled_since(self, settles: int, holder: str) -> bool:
        """Whether a hold of ``holder`` may have been settled since the budget counted
        ``settles`` (True when more were settled than ``recent`` remembers)."""
        since = self.settles - settles
        if since <= 0:
            return False
        return since > len(self.recent) or holder in self.recent[-since:]


class CrawlState:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None
        self._specs: Lru[str, CrawlSpec] = Lru(MAX_CRAWLS)
        self._room: int | None = None

    async def kv(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(names.CRAWLS_BUCKET)
            except nats.js.errors.BucketNotFoundError:
                raise StorageUnavailable(f"no {names.CRAWLS_BUCKET} bucket: run `busscrape streams apply`",
                                         reason="crawls_bucket_missing") from None
        return self._kv

    # -- rules ------------------------------------------------------------------------------

    async def start(self, spec: CrawlSpec) -> bool:
        """Store the crawl's rules; False when they were there already (the crawl resumes)."""
        kv = await self.kv()
        try:
            await kv.create(f"{spec.crawl_id}.spec", encode(spec))
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def stored(self, crawl_id: str) -> bool:
        """Whether the crawl's rules are stored (it was started)."""
        return await self._get(f"{crawl_id}.spec") is not None

    async def spec(self, crawl_id: str) -> CrawlSpec:
        """The crawl's rules (cached: they never change under one id)."""
        spec = self._specs.get(crawl_id)
        if spec is None:
            entry = await self._get(f"{crawl_id}.spec")
            if entry is None:
                raise StorageUnavailable(f"crawl {crawl_id} has no rules in {names.CRAWLS_BUCKET}",
                                         reason="crawl_unknown")
            spec = self._specs[crawl_id] = decode(CrawlSpec, entry)
        return spec

    # -- where seeds redirected ----------------------------------------------------------------

    async def redirected_seeds(self, crawl_id: str) -> tuple[str, ...]:
        """Where the crawl's seeds redirected to: seeds of its scope too (``Frontier.follow``)."""
        value = await self._get(f"{crawl_id}.seeds")
        return tuple(orjson.loads(value)) if value else ()

    async def add_redirected_seed(self, crawl_id: str, url: str) -> tuple[str, ...]:
        """Add ``url`` to them (compare-and-set: two seeds redirecting at once both stay); all of them."""
        kv, key = await self.kv(), f"{crawl_id}.seeds"
        while True:
            value, revision = await _entry(kv, key)
            seeds = list(orjson.loads(value or b"[]"))
            if url in seeds:
                return tuple(seeds)
            seeds.append(url)
            if await _write_at(kv, key, orjson.dumps(seeds), revision):
                return tuple(seeds)
            await asyncio.sleep(0)  # another seed's redirect came first: read again

    # -- the budget -------------------------------------------------------------------------

    async def reserve(self, crawl_id: str, holder: str, limit: int | None,
                      census: Callable[[], Awaitable[tuple[int, int]]]) -> tuple[int, bool]:
        """Take page slots of the crawl's budget for ``holder`` (the page whose links they are):
        how many it may still create, and whether it holds slots (then ``settle`` must follow).
        ``census()`` reads SEEN now: ``(wanted, mine)``, the holder's links not in SEEN and its
        tasks that are.

        The grant is recorded in the budget key itself, in the same compare-and-set as the count
        (a *hold*: ``[granted, mine]``, ``mine`` = the holder's tasks that existed already), until
        ``settle``. A holder that died in between (its worker killed after reserving, before or
        while creating) finds its hold on its redelivery and re-uses it instead of taking new
        slots: the slots it had are never lost, nor counted twice. ``mine`` now (the holder's
        tasks in SEEN) tells how many of the hold are spent already.

        SEEN is read after the budget and before the write that makes a new hold: another go of
        the page may have reserved, created its links and settled before, and a census taken
        earlier would count them as this hold's to make (the crawl would stop short of its
        budget). When the write loses to another page's, the census still stands unless a hold
        of this holder was settled since it was taken (``Budget.settled_since``): a page of
        thousands of links is not read again each time a busy fleet moves the budget first."""
        kv, key = await self.kv(), f"{crawl_id}.budget"
        budget = await self._budget(kv, key)
        wanted, mine = await census()
        taken_at = budget.settles
        while True:
            if holder in budget.holds:
                granted, before = budget.holds[holder]
                return max(0, granted - max(0, mine - before)), True
            if budget.settled_since(taken_at, holder):
                wanted, mine = await census()
                taken_at = budget.settles
            granted = wanted if limit is None else max(0, min(wanted, limit - budget.used))
            if granted <= 0:
                return 0, False
            budget.holds[holder] = [granted, mine]
            budget.used += granted
            if await self._write_budget(kv, key, budget):
                return granted, True
            await asyncio.sleep(0)  # another process moved the budget first: read again
            budget = await self._budget(kv, key)

    async def settle(self, crawl_id: str, holder: str, mine: int) -> None:
        """End ``holder``'s hold: its tasks are created, ``mine`` of them in SEEN now (read there
        after the creates, whichever go of the page made them); the slots of the hold they did
        not take (links another page created in between) go back to the budget.

        What goes back is derived from those durable facts, never from what this go created: two
        goes of one page at once (a redelivery after ``ack_wait`` while the first worker still
        runs) share one hold, and each of its slots is counted once, by whichever go made the task."""
        kv, key = await self.kv(), f"{crawl_id}.budget"
        while True:
            budget = await self._budget(kv, key)
            hold = budget.holds.pop(holder, None)
            if hold is None:
                return  # settled already (by an earlier go of the same page): give nothing back twice
            granted, before = hold
            budget.used = max(0, budget.used - max(0, granted - max(0, mine - before)))
            budget.settled(holder)
            if await self._write_budget(kv, key, budget):
                return
            await asyncio.sleep(0)

    async def used(self, crawl_id: str) -> int:
        return (await self._budget(await self.kv(), f"{crawl_id}.budget")).used

    async def holds(self, crawl_id: str) -> dict[str, list[int]]:
        """Reservations not settled yet, by holder (pages whose links are being queued)."""
        return (await self._budget(await self.kv(), f"{crawl_id}.budget")).holds

    @staticmethod
    async def _budget(kv: KeyValue, key: str) -> Budget:
        raw, revision = await _entry(kv, key)
        if revision is None:
            return Budget(0, {}, 0, [], None)
        value = orjson.loads(raw or b"0")
        if isinstance(value, int):  # a budget written before holds: the bare count
            return Budget(value, {}, 0, [], revision)
        return Budget(int(value["used"]), dict(value.get("holds") or {}), int(value.get("settles") or 0),
                      list(value.get("recent") or ()), revision)

    @staticmethod
    async def _write_budget(kv: KeyValue, key: str, budget: Budget) -> bool:
        value = {"used": budget.used, "holds": budget.holds, "settles": budget.settles, "recent": budget.recent}
        return await _write_at(kv, key, orjson.dumps(value), budget.revision)

    # -- pages ------------------------------------------------------------------------------

    async def page(self, crawl_id: str, page: str) -> dict[str, Any] | None:
        """A page record, its ``queued`` whole (read back from its parts when it has some)."""
        value = await self._get(f"{crawl_id}.page.{page}")
        if not value:
            return None
        record: dict[str, Any] = orjson.loads(value)
        for n in range(1, int(record.get("parts") or 1)):
            part = await self._get(f"{crawl_id}.page.{page}.{n}")
            record["queued"] = [*record.get("queued", ()), *(orjson.loads(part)["queued"] if part else ())]
        return record

    async def record_page(self, crawl_id: str, page: str, record: dict[str, Any]) -> None:
        """What a page's links became; the first record stands (a redelivery writes the same).

        A record larger than a CRAWLS value (the seeds of 100,000 sitemap URLs list 3.5 MB of
        task ids) is written in parts: the ids that do not fit go to ``<page>.<n>`` records
        (``{"part": n, "queued": […]}``), written before the head, which says how many
        parts there are. A watcher that has the head has every part before it (one stream)."""
        kv = await self.kv()
        head, parts = _split(record, await self.room())
        for n, part in enumerate(parts, 1):
            await kv.put(f"{crawl_id}.page.{page}.{n}", orjson.dumps(part))
        try:
            await kv.create(f"{crawl_id}.page.{page}", orjson.dumps(head))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass

    async def room(self) -> int:
        """Bytes a CRAWLS value may take (the bucket's own limit, and the server's)."""
        if self._room is None:
            self._room = await payloads.kv_room(self._js, await self.kv())
        return self._room

    async def page_at(self, crawl_id: str, page: str) -> tuple[dict[str, Any] | None, int | None]:
        """A page record and its revision (for ``rewrite_page``)."""
        value, revision = await _entry(await self.kv(), f"{crawl_id}.page.{page}")
        return (orjson.loads(value) if value else None), revision

    async def rewrite_page(self, crawl_id: str, page: str, record: dict[str, Any], revision: int) -> bool:
        """Replace a page record still at ``revision``; False when another process wrote it first.
        Only the seeds' record is ever rewritten: seeds the network policy refused are checked
        again when the crawl is asked for again (``Frontier.seed``)."""
        return await _write_at(await self.kv(), f"{crawl_id}.page.{page}", orjson.dumps(record), revision)

    async def pages(self, crawl_id: str) -> dict[str, dict[str, Any]]:
        """Every page record of the crawl, by page key (``bus.scan.kv_latest``: a crawl's summary
        is all of its records, never what nats-py's watch had caught up with)."""
        prefix = f"{crawl_id}.page."
        try:
            found = await kv_latest(self._js, names.CRAWLS_BUCKET, prefix + ">")
        except TRANSIENT as exc:
            raise StorageUnavailable(f"cannot read crawl {crawl_id}'s pages in {names.CRAWLS_BUCKET}: "
                                     f"{said(exc)}") from None
        return {key.removeprefix(prefix): orjson.loads(value) for key, value in found.items()}

    async def save_links(self, crawl_id: str, page: str, links: dict[str, Any]) -> None:
        await (await self.kv()).put(f"{crawl_id}.links.{page}", orjson.dumps(links))

    async def links(self, crawl_id: str, page: str) -> dict[str, Any] | None:
        value = await self._get(f"{crawl_id}.links.{page}")
        return orjson.loads(value) if value else None

    async def drop_links(self, crawl_id: str, page: str) -> None:
        await (await self.kv()).delete(f"{crawl_id}.links.{page}")

    # -- robots.txt -------------------------------------------------------------------------

    async def robots(self, crawl_id: str, origin_key: str) -> dict[str, Any] | None:
        value = await self._get(f"{crawl_id}.robots.{origin_key}")
        return orjson.loads(value) if value else None

    async def save_robots(self, crawl_id: str, origin_key: str, record: dict[str, Any]) -> None:
        await (await self.kv()).put(f"{crawl_id}.robots.{origin_key}", orjson.dumps(record))

    async def _get(self, key: str) -> bytes | None:
        value, _ = await _entry(await self.kv(), key)
        return value or None


def _split(record: dict[str, Any], room: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The head of a page record and the parts its ``queued`` overflows into, each within ``room``."""
    queued = list(record.get("queued") or ())
    if len(orjson.dumps(record)) <= room or not queued:
        return record, []
    chunks: list[list[str]] = [[]]
    left = room - len(orjson.dumps({**record, "queued": [], "parts": 1 << 20}))  # the head's own fields
    for task_id in queued:
        cost = len(orjson.dumps(task_id)) + 1
        if cost > left and chunks[-1]:
            chunks.append([])
            left = room - 64  # {"part": n, "queued": […]}
        chunks[-1].append(task_id)
        left -= cost
    head = {**record, "queued": chunks[0], "parts": len(chunks)}
    return head, [{"part": n, "queued": chunk} for n, chunk in enumerate(chunks[1:], 1)]


# -- compare-and-set on one key -------------------------------------------------------------


async def _entry(kv: KeyValue, key: str) -> tuple[bytes | None, int | None]:
    """The key's value and revision; (None, None) when it is absent or deleted."""
    try:
        entry = await kv.get(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None, None
    return entry.value, entry.revision


async def _write_at(kv: KeyValue, key: str, value: bytes, revision: int | None) -> bool:
    """Write ``value`` if the key is still at ``revision`` (None: still absent); False when
    another process wrote it first (read again and retry)."""
    try:
        if revision is None:
            await kv.create(key, value)
        else:
            await kv.update(key, value, last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        return False
    return True
