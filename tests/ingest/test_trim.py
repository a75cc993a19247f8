"""RESULTS is trimmed below every durable consumer's ack floor, once that has been so for a while."""

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
