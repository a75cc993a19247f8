"""A result whose PubAck is lost keeps its artifacts: the page it points at is never lost.

A TCP relay between the worker and nats-server withholds every PubAck of a publish to RESULTS
for a while, past ``request_timeout`` and its re-sends: the server has stored the result, the
worker cannot know. The ingester must still archive that result, with every object it names.
"""

from __future__ import annotations

import asyncio

import pytest

from busscrape.archive.storage.local import FileStorage
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.ingest.daemon import Ingester
from busscrape.worker.daemon import Worker
from tests.conftest import make_settings
from tests.support import pages
from tests.support.bus import count, dead_letters, enqueue, results, wait_until
from tests.support.relay import Relay, results_puback

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("window", ["10m", "5s"], ids=["within-duplicate-window", "after-duplicate-window"])
async def test_a_lost_puback_never_costs_the_stored_result_its_artifacts(bus, site, tmp_path, nats_server, window):
    pages.install(site)
    base = make_settings(
        tmp_path, nats_server.url, network={"allow": [f"{h}/32" for h in site.hosts]},
        # The re-sends of one delivery land within the window; the redelivery (3-6 s later) after it.
        worker={"concurrency": 1, "navigation_timeout": "5s", "retry_base_delay": "6s", "retry_max_delay": "6s"},
        streams={"worker_ack_wait": "5s", "worker_max_deliver": 3, "duplicate_window": window},
        nats={"request_timeout": 1})
    await provision.apply(bus.js, topology.load(base))
    task = await enqueue(bus.js, site.url("/static"))
    async with Relay(nats_server.port) as relay:
        relay.withhold = results_puback
        s = base.with_overrides(nats={"url": relay.url})
        async with await Bus.connect(s, name="worker-through-relay") as wbus:
            async with Worker(wbus, s.with_overrides(worker={"exit_when_idle": "10s"})) as worker:
                running = asyncio.create_task(worker.run())

                async def first_delivery_gave_up() -> bool:  # an outage: RESULTS did not answer
                    return worker.counters["outage"] == 1

                await wait_until(first_delivery_gave_up, timeout=60)
                assert relay.withheld >= 1 and len(await results(bus.js)) == 1  # stored, never confirmed
                relay.withhold = None  # the network heals; the task comes back after its retry delay
                counters = await running
    async with FileStorage(tmp_path / "archive") as storage:
        ingester = Ingester(bus, storage, base.with_overrides(ingester={"exit_when_idle": "2s"}))
        async with ingester:
            await ingester.run()
        keys = await storage.keys()
    assert await dead_letters(bus.js) == []  # no artifact_missing: every object the result names is there
    assert ingester.counters["archived"] == 1 and sum(key.endswith("/meta.json") for key in keys) == 1
    assert {key.rsplit("/", 1)[-1] for key in keys} >= {"page.html.gz", "screenshot.png", "page.har.gz"}
    [result] = await results(bus.js)  # one result: the redelivery found it and rendered nothing
    assert result.task_id == task.task_id and result.attempt == 1
    assert counters.get("retried", 0) == 0  # the unconfirmed result spent no attempt
    assert counters["already_done"] == 1 and counters.get("completed", 0) == 0
    assert await count(bus.js, names.TASKS_STREAM) == 0
