import asyncio
import itertools
import time

from busscrape.worker.politeness import HostGate


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
