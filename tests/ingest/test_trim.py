"""RESULTS is trimmed below every durable consumer's ack floor, once that has been so for a while."""

import contextlib

from nats.js import api

from busscrape.bus import names
from busscrape.ingest.trim import ResultsTrimmer


async def publish_results(js, n: int) -> None:
    for i in range(n):
        await js.publish(names.result_subject(f"{i:032x}"), b"{}", stream=names.RESULTS_STREAM)


async def ack(js, durable: str, n: int) -> None:
    sub = await js.pull_subscribe_bind(durable, names.RESULTS_STREAM)
    for msg in await sub.fetch(n, timeout=5):
        await msg.ack_sync()
    await sub.unsubscribe()


async def first_seq(js) -> int:
    return (await js.stream_info(names.RESULTS_STREAM)).state.first_seq


async def test_results_stay_while_any_durable_consumer_needs_them(applied):
    js = applied.js
    await publish_results(js, 5)
    await js.add_consumer(names.RESULTS_STREAM, api.ConsumerConfig(
        durable_name="my-reader", ack_policy=api.AckPolicy.EXPLICIT))  # a user's own reader
    trimmer = ResultsTrimmer(js, keep=0)
    assert await trimmer.trim() == 0 and await first_seq(js) == 1  # nobody acked anything
    await ack(js, names.INGESTERS_CONSUMER, 3)
    await ack(js, "my-reader", 1)
    assert await trimmer.trim() == 2 and await first_seq(js) == 2  # the slowest reader holds the rest
    await ack(js, "my-reader", 4)
    assert await trimmer.trim() == 4 and await first_seq(js) == 4  # now the ingesters are the slowest
    # An ephemeral reader (a `nats stream view`) holds nothing back.
    await js.add_consumer(names.RESULTS_STREAM, api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT))
    await ack(js, names.INGESTERS_CONSUMER, 2)
    assert await trimmer.trim() == 6 and (await js.stream_info(names.RESULTS_STREAM)).state.messages == 0


async def test_acknowledged_results_stay_for_the_keep_window(applied):
    js = applied.js
    await publish_results(js, 4)
    await ack(js, names.INGESTERS_CONSUMER, 4)
    trimmer = ResultsTrimmer(js, keep=60)
    assert await trimmer.trim(now=1000) == 0
    assert await trimmer.trim(now=1059) == 0 and await first_seq(js) == 1  # acked 59 s ago: kept
    assert await trimmer.trim(now=1060) == 5 and (await js.stream_info(names.RESULTS_STREAM)).state.messages == 0
    await publish_results(js, 2)
    await ack(js, names.INGESTERS_CONSUMER, 2)
    assert await trimmer.trim(now=1070) == 5  # the floor moved 0 s ago
    assert await trimmer.trim(now=1130) == 7


async def test_a_full_results_gives_up_the_acknowledged_results_it_keeps_so_workers_get_room(bus, settings):
    """results_keep_acked (1 h) is a courtesy to readers without a durable consumer: when the
    results it keeps are what fills RESULTS (discard new: every worker waits for room), they go."""
    import nats.js.errors

    from busscrape.bus import provision, topology

    small = settings.with_overrides(streams={"results_max_bytes": "16KiB"})
    await provision.apply(bus.js, topology.load(small))
    js, sent = bus.js, 0
    with contextlib.suppress(nats.js.errors.APIError):
        while sent < 10_000:
            await js.publish(names.result_subject(f"{sent:032x}"), b"x" * 500, stream=names.RESULTS_STREAM)
            sent += 1
    assert 0 < sent < 10_000  # full: the stream refused the next result
    sub = await js.pull_subscribe_bind(names.INGESTERS_CONSUMER, names.RESULTS_STREAM)
    acked = 0
    while acked < sent:
        for msg in await sub.fetch(min(100, sent - acked), timeout=5):
            await msg.ack_sync()
            acked += 1
    await sub.unsubscribe()
    trimmer = ResultsTrimmer(js, keep=3600)
    assert await trimmer.trim() == sent + 1  # every acknowledged result went, within the keep window
    assert (await js.stream_info(names.RESULTS_STREAM)).state.messages == 0
    await js.publish(names.result_subject("f" * 32), b"x" * 500, stream=names.RESULTS_STREAM)  # room again


async def test_acknowledged_results_are_kept_while_results_has_room(applied):
    js = applied.js
    await publish_results(js, 3)
    await ack(js, names.INGESTERS_CONSUMER, 3)
    trimmer = ResultsTrimmer(js, keep=3600)
    assert await trimmer.trim() == 0 and await first_seq(js) == 1
