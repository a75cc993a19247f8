"""``KvWatch`` on a real nats-server: what it feeds, and that it stops while entries pour in."""

from __future__ import annotations

import asyncio

from nats.js.api import KeyValueConfig

from busscrape.bus.kv_watch import KvWatch


async def test_a_watch_stops_while_entries_pour_in(bus):
    kv = await bus.js.create_key_value(KeyValueConfig(bucket="WATCHED", history=1))
    seen: list[str] = []

    async def pour() -> None:  # puts, as a crawl's workers write page records, without pause
        n = 0
        while True:
            await asyncio.gather(*(kv.put(f"k{(n + i) % 50}", b"v") for i in range(10)))
            n += 10

    pouring = asyncio.create_task(pour())
    try:
        for _ in range(60):
            watch = KvWatch(lambda key, value: seen.append(key), name="test-watch")
            await watch.start(kv)
            await asyncio.sleep(0.01)
            # Before, a stop whose cancel met an entry arriving was lost in asyncio.wait_for and
            # the watch waited for the next one for ever (an interrupted crawl that never ended).
            stopping = asyncio.ensure_future(watch.stop())
            done, _ = await asyncio.wait({stopping}, timeout=10)  # (wait_for would cancel, and hang)
            assert stopping in done, "the watch did not stop"
    finally:
        pouring.cancel()
    assert len(seen) > 60  # it did feed entries (each watch starts with the bucket's 50 keys)
