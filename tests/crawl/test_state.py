"""CRAWLS read whole: a crawl's summary is made of all its page records, however busy the bus."""

from __future__ import annotations

import asyncio

from busscrape.crawl.state import CrawlState


async def test_every_page_record_is_read_while_the_connection_is_busy(applied):
    # nats-py's KeyValue.watch said "caught up" before the first entry when the server pushed the
    # entries before it answered the watch's consumer info (so a crawl summary counted nothing
    # queued; seen in CI as `budget_used 40, queued 0`), or never, when its callback dropped one.
    state = CrawlState(applied.js)
    kv = await state.kv()
    await asyncio.gather(*(kv.put(f"c1.page.p{i}", b'{"queued": ["t%d"]}' % i) for i in range(300)))
    await kv.put("c1.page.gone", b"{}")
    await kv.delete("c1.page.gone")
    await kv.put("c2.page.other", b"{}")

    async def busy() -> None:  # other traffic on the same connection, as a run's tracker makes
        while True:
            await asyncio.gather(*(kv.get(f"c1.page.p{i}") for i in range(20)))

    noise = asyncio.create_task(busy())
    try:
        reads = await asyncio.wait_for(asyncio.gather(*(state.pages("c1") for _ in range(40))), timeout=120)
    finally:
        noise.cancel()
    assert [len(r) for r in reads] == [300] * 40
    assert reads[0]["p7"] == {"queued": ["t7"]} and "gone" not in reads[0]
    assert await state.pages("nothing") == {}
