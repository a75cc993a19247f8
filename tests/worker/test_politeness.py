import asyncio
import itertools
import time

import pytest

from busscrape.bus import provision, topology
from busscrape.worker.daemon import Worker
from busscrape.worker.politeness import HostGate
from tests.support import pages
from tests.support.bus import enqueue, results
from tests.worker.test_daemon import wsettings  # noqa: F401 - fixture


async def test_host_concurrency_is_bounded_per_host_not_globally():
    gate = HostGate(concurrency=2, delay=0)
    active = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}

    async def visit(host):
        async with gate.enter(host):
            active[host] += 1
            peak[host] = max(peak[host], active[host])
            await asyncio.sleep(0.05)
            active[host] -= 1

    await asyncio.gather(*[visit("a") for _ in range(6)], *[visit("b") for _ in range(6)])
    assert peak == {"a": 2, "b": 2}


async def test_minimum_delay_between_starts_on_one_host():
    gate = HostGate(concurrency=4, delay=0.2)
    starts = []

    async def visit():
        async with gate.enter("example.test"):
            await gate.pace("example.test")
            starts.append(time.monotonic())

    await asyncio.gather(*[visit() for _ in range(4)])
    starts.sort()
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(starts))


async def test_a_waiter_that_gives_up_gives_its_start_back():
    gate = HostGate(concurrency=4, delay=5.0)
    await gate.pace("example.test")  # the first start: at once; the next one reserved 5 s later
    host = gate._hosts["example.test"]
    reserved = host.next_start
    waiter = asyncio.create_task(gate.pace("example.test"))
    await asyncio.sleep(0.05)
    assert host.next_start == reserved + 5.0
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert host.next_start == reserved  # the next task waits for the first one's gap only


@pytest.mark.browser
async def test_waiting_for_a_busy_host_does_not_count_against_task_timeout(bus, wsettings, site):  # noqa: F811
    """Three two-second pages on one host, one at a time, a three-second task_timeout: each task's
    clock starts when the host lets it in, so none times out waiting for the others."""
    pages.install(site)
    s = wsettings.with_overrides(worker={"concurrency": 3, "host_concurrency": 1, "task_timeout": "3s",
                                         "exit_when_idle": "2s"})
    await provision.apply(bus.js, topology.load(s))
    for i in range(3):
        await enqueue(bus.js, site.url(f"/slow?s=2&n={i}"))
    async with Worker(bus, s) as worker:
        counters = await worker.run()
    assert counters["completed"] == 3 and counters.get("retried", 0) == 0, dict(counters)
    assert len(await results(bus.js)) == 3
