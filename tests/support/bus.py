"""Putting tasks on a real bus and reading what came out, the way the services do it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext, api

from busscrape.bus import names
from busscrape.model.messages import DeadLetter, ScrapeResult, ScrapeTask, TaskOptions, decode, encode, task_key


async def enqueue(js: JetStreamContext, url: str, *, steps: tuple = (), options: TaskOptions | None = None,
                  labels: dict[str, str] | None = None) -> ScrapeTask:
    """Queue one task exactly as the dispatcher does: an atomic create in SEEN, sourced into TASKS."""
    options = options or TaskOptions()
    task = ScrapeTask(task_id=task_key(url, steps, options), url=url, original_url=url, steps=steps,
                      options=options, labels=labels or {})
    # No Nats-Msg-Id: TASKS would de-duplicate a later re-queue of the same task id by it.
    await js.publish(names.seen_key_subject(task.task_id), encode(task),
                     headers={names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
    return task


async def stream_messages(js: JetStreamContext, stream: str) -> list:
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            out.append(await js.get_msg(stream, seq))
        except Exception:
            continue
    return out


async def results(js: JetStreamContext) -> list[ScrapeResult]:
    return [decode(ScrapeResult, m.data) for m in await stream_messages(js, names.RESULTS_STREAM)]


async def dead_letters(js: JetStreamContext) -> list[DeadLetter]:
    return [decode(DeadLetter, m.data) for m in await stream_messages(js, names.DEADLETTER_STREAM)]


async def count(js: JetStreamContext, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def has_messages(js: JetStreamContext, stream: str) -> bool:
    return await count(js, stream) > 0


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 60, every: float = 0.2) -> None:
    """Poll ``check`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")


async def lagging_replica(js: JetStreamContext, stream: str, *, keeps: str) -> None:
    """A copy of ``stream`` that answers its direct gets but holds only ``keeps`` (a subject
    filter): what a replica that has not caught up looks like to a reader (a mirror with
    mirror_direct, the stream's own replicas no longer answering direct gets)."""
    lagging = f"{stream}_LAGGING"
    await js.add_stream(api.StreamConfig(
        name=lagging, mirror=api.StreamSource(name=stream, filter_subject=keeps),
        mirror_direct=True, allow_direct=True, storage=api.StorageType.MEMORY))
    own = (await js.stream_info(stream)).config
    await js.update_stream(own.evolve(allow_direct=False))
    wanted = sum(((await js.stream_info(stream, subjects_filter=keeps)).state.subjects or {}).values())

    async def synced() -> bool:
        return (await js.stream_info(lagging)).state.messages >= wanted

    await wait_until(synced, timeout=10)


async def two_workers(bus, s):
    """Two workers in this process (``w1`` on ``bus``, ``w2`` on a connection of its own) run the
    queue dry side by side; both are returned for their counters."""
    from busscrape.bus.connection import Bus
    from busscrape.worker.daemon import Worker

    other = await Bus.connect(s, name="second-worker")
    try:
        async with Worker(bus, s.with_overrides(worker={"name": "w1"})) as one, \
                Worker(other, s.with_overrides(worker={"name": "w2"})) as two:
            await asyncio.gather(one.run(), two.run())
    finally:
        await other.close()
    return one, two
