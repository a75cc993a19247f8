"""The crawl's state in the CRAWLS bucket, shared by every process of the fleet.

Nothing of a crawl lives in one process's memory: its rules, its page budget, what each page's
links became and the robots.txt it fetched are keys here (``streams/crawls.toml`` lists them),
so any worker can take any page and ``busscrape crawl`` run again resumes where the last one
stopped. The budget is one counter raised with compare-and-set (``KeyValue.update`` with the
revision read): two workers granting the last slot at once cannot both win.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.js.errors
import orjson
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from busscrape.bus import names
from busscrape.crawl.spec import CrawlSpec
from busscrape.errors import StorageUnavailable
from busscrape.model.messages import decode, encode

SEEDS = "seeds"
"""The page record of the seeds (a page key that is not a task id)."""


class CrawlState:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None
        self._specs: dict[str, CrawlSpec] = {}

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

    # -- the budget -------------------------------------------------------------------------

    async def reserve(self, crawl_id: str, wanted: int, limit: int | None) -> int:
        """Take up to ``wanted`` page slots of the crawl's budget; how many were granted."""
        if wanted <= 0:
            return 0
        kv, key = await self.kv(), f"{crawl_id}.budget"
        while True:
            try:
                entry = await kv.get(key)
                used, revision = int(entry.value or b"0"), entry.revision
            except nats.js.errors.KeyNotFoundError:
                used, revision = 0, None
            granted = wanted if limit is None else max(0, min(wanted, limit - used))
            if granted == 0:
                return 0
            try:
                if revision is None:
                    await kv.create(key, str(used + granted).encode())
                else:
                    await kv.update(key, str(used + granted).encode(), last=revision)
                return granted
            except nats.js.errors.KeyWrongLastSequenceError:
                await asyncio.sleep(0)  # another process took slots first: read again

    async def release(self, crawl_id: str, count: int) -> None:
        """Give back slots reserved for links that turned out to be queued already."""
        if count <= 0:
            return
        kv, key = await self.kv(), f"{crawl_id}.budget"
        while True:
            entry = await kv.get(key)
            try:
                await kv.update(key, str(max(0, int(entry.value or b"0") - count)).encode(), last=entry.revision)
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                await asyncio.sleep(0)

    async def used(self, crawl_id: str) -> int:
        value = await self._get(f"{crawl_id}.budget")
        return int(value or b"0")

    # -- pages ------------------------------------------------------------------------------

    async def page(self, crawl_id: str, page: str) -> dict[str, Any] | None:
        value = await self._get(f"{crawl_id}.page.{page}")
        return orjson.loads(value) if value else None

    async def record_page(self, crawl_id: str, page: str, record: dict[str, Any]) -> None:
        """What a page's links became; the first record stands (a redelivery writes the same)."""
        kv = await self.kv()
        try:
            await kv.create(f"{crawl_id}.page.{page}", orjson.dumps(record))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass

    async def pages(self, crawl_id: str) -> dict[str, dict[str, Any]]:
        """Every page record of the crawl, by page key (one ordered read of the crawl's keys:
        ``KeyValue.keys`` would list every crawl's and filter by substring)."""
        kv = await self.kv()
        prefix = f"{crawl_id}.page."
        watcher = await kv.watch(prefix + ">", ignore_deletes=True)
        out = {}
        try:
            async for entry in watcher:
                if entry is None:  # caught up
                    break
                if entry.value:
                    out[entry.key.removeprefix(prefix)] = orjson.loads(entry.value)
        finally:
            await watcher.stop()
        return out

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
        kv = await self.kv()
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return entry.value or None
