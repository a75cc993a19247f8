"""The PullService core against a real nats-server: slots, heartbeats, shutdown, bounds."""

import asyncio
import time

import pytest

from busscrape.bus import names
from busscrape.bus.consumer import PullService
from busscrape.errors import StreamsMissing
from tests.support.bus import wait_until


class Recorder(PullService):
    kind = "recorder"
    stream = names.TASKS_STREAM
    durable = names.WORKERS_CONSUMER

    def __init__(self, bus, *, delay=0.0, crash_on=(), **kw):
        super().__init__(bus, **kw)
        self.delay = delay
        self.crash_on = set(crash_on)
        self.seen: list[bytes] = []
        self.peak = 0
        self.active = 0

    async def handle(self, msg):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            self.seen.append(msg.data)
            if msg.data in self.crash_on:
                raise RuntimeError("handler bug")
            await asyncio.sleep(self.delay)
            await msg.ack_sync()
            self.counters["completed"] += 1
        finally:
            self.active -= 1


async def queue(js, *payloads: bytes) -> None:
    for i, p in enumerate(payloads):
        await js.publish(names.task_subject(f"k{i}-{time.monotonic_ns()}"), p)


async def pending(js) -> tuple[int, int]:
    info = await js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    return info.num_pending, info.num_ack_pending


async def test_works_through_the_queue_within_its_concurrency(applied):
    await queue(applied.js, *[f"m{i}".encode() for i in range(12)])
    async with Recorder(applied, concurrency=3, delay=0.1, max_items=12) as svc:
        counters = await asyncio.wait_for(svc.run(), 30)
    assert counters["completed"] == 12
    assert sorted(svc.seen) == sorted(f"m{i}".encode() for i in range(12))
    assert svc.peak == 3
    assert await pending(applied.js) == (0, 0)


async def test_fetches_only_for_free_slots(applied):
    await queue(applied.js, *[f"m{i}".encode() for i in range(10)])
    svc = Recorder(applied, concurrency=2, delay=60, max_items=10)  # both slots stay busy
    async with svc:
        runner = asyncio.create_task(svc.run())
        await wait_until(lambda: asyncio.sleep(0, svc.in_flight == 2), timeout=30)
        num_pending, ack_pending = await pending(applied.js)
        assert ack_pending == 2 and num_pending == 8  # the rest stays available to other workers
        svc.stop()
        svc.stop()
        await asyncio.wait_for(runner, 20)


async def test_a_crashing_handler_naks_and_the_daemon_carries_on(applied):
    await queue(applied.js, b"bad", b"good")
    async with Recorder(applied, concurrency=1, crash_on={b"bad"}, exit_when_idle=1.0) as svc:
        counters = await asyncio.wait_for(svc.run(), 30)
    assert counters["crashed"] == 1 and counters["completed"] == 1
    num_pending, ack_pending = await pending(applied.js)
    assert num_pending + ack_pending == 1  # the crashed one waits for its redelivery, not lost


async def test_heartbeats_keep_a_long_message_from_being_redelivered(applied, settings):
    # ack_wait is 10s in the test settings; shrink it to 1s for this consumer.
    info = await applied.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    await applied.js.add_consumer(names.TASKS_STREAM, info.config.evolve(ack_wait=1.0, backoff=None))
    await queue(applied.js, b"slow")
    async with Recorder(applied, concurrency=2, delay=3.5, max_items=1) as svc:
        counters = await asyncio.wait_for(svc.run(), 30)
    assert svc.heartbeat_interval == pytest.approx(1 / 3, abs=0.01)
    assert svc.seen == [b"slow"]  # not handed to the second slot while the first still worked
    assert counters["completed"] == 1


async def test_graceful_stop_hands_unfinished_work_back_at_once(applied):
    # A 10-minute ack_wait: whatever comes back within the test was nak'ed, however slow the stop.
    info = await applied.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    await applied.js.add_consumer(names.TASKS_STREAM, info.config.evolve(ack_wait=600.0, backoff=None))
    await queue(applied.js, b"a", b"b")
    svc = Recorder(applied, concurrency=2, delay=60, grace_period=0.5)
    async with svc:
        runner = asyncio.create_task(svc.run())
        await wait_until(lambda: asyncio.sleep(0, svc.in_flight == 2), timeout=30)
        svc.stop()
        counters = await asyncio.wait_for(runner, 20)  # the handlers' 60 s were not waited for
    assert counters["released"] == 2
    # Back in the queue at once (not after ack_wait): another worker fetches both right away.
    sub = await applied.js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    again = await sub.fetch(2, timeout=10)
    assert sorted(m.data for m in again) == [b"a", b"b"]
    assert all(m.metadata.num_delivered == 2 for m in again)


async def test_a_stop_now_withdraws_the_waiting_fetches_before_it_hands_work_back(applied):
    """Two stops at once (``run``'s Ctrl-C): the message in flight goes back to the queue, not
    into this service's other slot, whose pull request is still waiting at the server."""
    info = await applied.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    await applied.js.add_consumer(names.TASKS_STREAM, info.config.evolve(ack_wait=600.0, backoff=None))
    await queue(applied.js, b"a")
    svc = Recorder(applied, concurrency=2, delay=60, fetch_timeout=30)
    async with svc:
        runner = asyncio.create_task(svc.run())
        await wait_until(lambda: asyncio.sleep(0, svc.in_flight == 1 and len(svc._fetching) == 1), timeout=30)
        await asyncio.sleep(0.2)  # the idle slot's pull request has reached the server
        svc.stop()
        svc.stop()
        counters = await asyncio.wait_for(runner, 20)
    assert counters["released"] == 1
    sub = await applied.js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    [again] = await sub.fetch(1, timeout=10)
    assert again.data == b"a"
    assert again.metadata.num_delivered == 2  # one delivery to the service, none to its idle slot


async def test_exit_when_idle(applied):
    started = time.monotonic()
    async with Recorder(applied, concurrency=1, exit_when_idle=0.5) as svc:
        await asyncio.wait_for(svc.run(), 10)
    assert time.monotonic() - started < 5


async def test_missing_consumer_is_a_fix_it_error(bus):
    with pytest.raises(StreamsMissing, match="streams apply"):
        async with Recorder(bus, concurrency=1) as svc:
            await svc.run()


class ReplyAtCancel(asyncio.Task):
    """A task whose awaited reply arrives in the loop iteration its cancel does: on Python 3.11
    ``asyncio.wait_for`` (nats-py awaits every reply that way) then returns the reply and the
    cancel is lost (cpython gh-86296)."""

    reply: asyncio.Future[None] | None = None

    def cancel(self, msg=None) -> bool:
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(None)
        return super().cancel(msg)


class Requester(Recorder):
    """A service with a background loop of requests (as the consumer-lag poll is)."""

    def __init__(self, bus, **kw):
        super().__init__(bus, **kw)
        self.looping: ReplyAtCancel | None = None
        self.lost = asyncio.Event()

    async def background(self):
        self.looping = ReplyAtCancel(self._requests())
        return [self.looping]

    async def _requests(self) -> None:
        while not self.lost.is_set():
            assert self.looping is not None
            self.looping.reply = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self.looping.reply, 30)
            if self.looping.cancelling():
                self.lost.set()  # the cancel was lost, and the loop goes on
                await asyncio.sleep(3600)


async def test_a_stop_ends_the_service_even_when_a_loops_cancel_is_lost(applied, monkeypatch):
    monkeypatch.setattr("busscrape.bus.consumer.STOP_GRACE", 0.5)
    svc = Requester(applied, concurrency=1, grace_period=0.1)
    async with svc:
        running = asyncio.create_task(svc.run())
        await wait_until(lambda: asyncio.sleep(0, svc.looping is not None), timeout=30)
        svc.stop()
        # A liveness check, not a speed one: before, run() waited for the loop for ever.
        done, _ = await asyncio.wait({running}, timeout=60)
        assert done, "the service did not end: it waited on a loop whose cancel was lost"
        running.result()
    assert svc.lost.is_set()  # the cancel was lost indeed: what the bound is for
    assert svc.looping is not None and not svc.looping.done()
    svc.looping.reply = None
    svc.looping.cancel()
    await asyncio.gather(svc.looping, return_exceptions=True)
