"""A full RESULTS is back-pressure: workers stop fetching and hold what they rendered, spending nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from busscrape.bus import names, provision, topology
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import count, dead_letters, enqueue, wait_until

pytestmark = pytest.mark.browser


async def ingest(js) -> int:
    """Acknowledge what RESULTS holds, as the ingesters would, and trim it; how many."""
    from busscrape.ingest.trim import ResultsTrimmer

    sub = await js.pull_subscribe_bind(names.INGESTERS_CONSUMER, names.RESULTS_STREAM)
    try:
        msgs = await sub.fetch(10, timeout=1)
    except TimeoutError:
        msgs = []
    for msg in msgs:
        await msg.ack_sync()
    await sub.unsubscribe()
    await ResultsTrimmer(js, keep=0).trim()
    return len(msgs)


async def test_a_full_results_pauses_the_workers_without_spending_a_delivery(bus, wsettings, site):
    pages.install(site)
    s = wsettings.with_overrides(streams={"worker_ack_wait": "2s", "worker_max_deliver": 2},
                                 worker={"exit_when_idle": "2s"})
    await provision.apply(bus.js, topology.load(s))
    results_config = (await bus.js.stream_info(names.RESULTS_STREAM)).config
    await bus.js.update_stream(results_config.evolve(max_msgs=2))  # room for two results
    for i in range(5):
        await enqueue(bus.js, site.url(f"/static?n={i}"))
    async with Worker(bus, s) as worker:
        running = asyncio.create_task(worker.run())

        async def filled() -> bool:
            return await count(bus.js, names.RESULTS_STREAM) == 2

        await wait_until(filled, timeout=60)
        # Held past several ack_waits: heartbeats keep the task, and nothing is fetched meanwhile.
        await asyncio.sleep(6)
        assert await dead_letters(bus.js) == [] and worker.counters["retried"] == 0  # nothing spent on it
        info = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
        assert info.num_redelivered == 0 and info.num_ack_pending <= 2
        assert info.num_pending + info.num_ack_pending == 3  # the five less the two stored; no more fetched
        assert worker.room.full and worker.counters["held_for_room"] >= 1
        assert not running.done()  # a paused worker does not leave as idle
        # The ingesters catch up: the trim makes room and the workers go on by themselves.
        ingested, deadline = 0, time.monotonic() + 120
        while ingested < 5:
            assert time.monotonic() < deadline, f"only {ingested} of 5 results came"
            ingested += await ingest(bus.js)
        counters = await running
    assert counters["completed"] == 5 and counters["retried"] == 0 and counters.get("dead", 0) == 0
    info = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    assert info.num_redelivered == 0  # no delivery was spent on the full stream
    assert await count(bus.js, names.TASKS_STREAM) == 0 and await dead_letters(bus.js) == []
    assert worker.room.pauses >= 1
