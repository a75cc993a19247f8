"""The pipelined publisher against a real nats-server: windows, PubAcks, retries and give-ups."""

import asyncio
import time

import pytest
from nats.js import api

from busscrape.bus import names
from busscrape.bus.publisher import ABANDONED, NO_ANSWER, WRONG_LAST_SEQUENCE, Publisher, PublishFailed


async def test_publish_returns_the_pub_ack(applied):
    async with Publisher(applied.nc) as pub:
        first = await pub.publish(names.task_subject("a" * 32), b"one")
        second = await pub.publish(names.task_subject("b" * 32), b"two")
    assert (first.stream, first.seq, second.seq) == (names.TASKS_STREAM, 1, 2)
    assert (await applied.js.get_msg(names.TASKS_STREAM, 2)).data == b"two"


async def test_an_encoded_header_block_arrives_as_the_headers_it_spells(applied):
    block = b"NATS/1.0\r\nNats-Msg-Id: one-1\r\ntraceparent: 00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01\r\n\r\n"
    subject = names.seen_key_subject("d" * 32)
    async with Publisher(applied.nc) as pub:
        await pub.publish(subject, b"first", block)
        again = await pub.publish(subject, b"first", block)  # the stream de-duplicates by the header
        refused = pub.publish(subject, b"x", b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n")
        with pytest.raises(PublishFailed) as caught:
            await refused
    assert again.duplicate is True
    assert caught.value.err_code == WRONG_LAST_SEQUENCE  # a header the server acted on
    stored = await applied.js.get_last_msg(names.SEEN_STREAM, subject)
    assert (stored.data, stored.headers["Nats-Msg-Id"]) == (b"first", "one-1")
    assert stored.headers["traceparent"] == f"00-{'1' * 32}-{'2' * 16}-01"


async def test_the_window_bounds_what_is_in_flight(applied):
    acked: list[int] = []
    peak = 0
    async with Publisher(applied.nc, window=5) as pub:
        for i in range(200):
            await pub.submit(names.task_subject(f"{i:032x}"), b"x", None, lambda p: acked.append(p.ack.seq))
            peak = max(peak, pub.in_flight)
        assert pub.in_flight <= 5
        await pub.wait()
    assert peak == 5
    assert sorted(acked) == list(range(1, 201))


async def test_a_refused_publish_is_final_and_says_why(applied):
    subject = names.seen_key_subject("c" * 32)
    create = {names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
    outcomes = []
    async with Publisher(applied.nc, retries=3) as pub:
        await pub.publish(subject, b"first", create)
        await pub.submit(subject, b"second", create, outcomes.append)
    (second,) = outcomes
    assert second.ack is None and second.attempts == 1  # a refusal is not retried
    assert second.error.err_code == WRONG_LAST_SEQUENCE and second.error.code == 400
    assert "wrong last sequence" in second.error.description


async def test_no_responders_is_retried_then_given_up(applied):
    started = time.monotonic()
    async with Publisher(applied.nc, retries=2, backoff=0.05) as pub:
        with pytest.raises(PublishFailed) as info:
            await pub.publish("busscrape.nowhere.x", b"x")
    assert info.value.code == 503 and "no responders" in info.value.description
    assert "after 3 attempts" in str(info.value)
    assert time.monotonic() - started < 5


async def test_no_answer_times_out_and_is_retried(applied):
    requests = []

    async def silent(msg):  # subscribed, so no "no responders", but never answers
        requests.append(msg.reply)

    await applied.nc.subscribe("silent.x", cb=silent)
    async with Publisher(applied.nc, timeout=0.2, retries=1, backoff=0.01) as pub:
        with pytest.raises(PublishFailed) as info:
            await pub.publish("silent.x", b"x")
    assert info.value.code == NO_ANSWER
    assert len(requests) == 2 and requests[0] == requests[1]  # one retry, on the same reply token


async def test_a_retry_gets_through_after_a_lost_answer(applied):
    seen = []

    async def flaky(msg):  # a stand-in stream that drops the first request on the floor
        seen.append(msg.data)
        if len(seen) > 1:
            await applied.nc.publish(msg.reply, b'{"stream": "FLAKY", "seq": 7}')

    await applied.nc.subscribe("flaky.x", cb=flaky)
    outcomes = []
    async with Publisher(applied.nc, timeout=0.2, retries=2, backoff=0.01) as pub:
        await pub.submit("flaky.x", b"payload", None, outcomes.append)
    (outcome,) = outcomes
    assert (outcome.ack.stream, outcome.ack.seq, outcome.attempts) == ("FLAKY", 7, 2)
    assert seen == [b"payload", b"payload"]


async def test_a_stream_that_appears_during_the_retries_gets_the_message(bus):
    async def create_later():
        await asyncio.sleep(0.3)
        await bus.js.add_stream(api.StreamConfig(name="LATE", subjects=["late.>"]))

    creator = asyncio.create_task(create_later())
    async with Publisher(bus.nc, retries=8, backoff=0.1, max_backoff=0.2) as pub:
        ack = await pub.publish("late.x", b"x")
    await creator
    assert (ack.stream, ack.seq) == ("LATE", 1)


async def test_an_outage_longer_than_the_retries_is_waited_out_within_outage_wait(bus):
    # No stream answers (as while an R3 stream elects a leader after a node died) for longer than
    # the retries last: within outage_wait the publish goes on trying and lands once one answers.
    outcomes = []
    async with Publisher(bus.nc, retries=1, backoff=0.05, max_backoff=0.1, outage_wait=120) as pub:
        publication = await pub.submit("late.x", b"x", None, outcomes.append)
        while publication.attempts < 4 and not publication.done:  # noqa: ASYNC110 - polls the publisher
            await asyncio.sleep(0.02)
        assert not publication.done, f"given up during the outage: {publication.error}"
        await bus.js.add_stream(api.StreamConfig(name="LATE", subjects=["late.>"]))
        await pub.wait()
    (outcome,) = outcomes
    assert outcome.error is None and (outcome.ack.stream, outcome.ack.seq) == ("LATE", 1)
    assert outcome.attempts > 2


async def test_closing_abandons_what_is_unconfirmed(applied):
    async def silent(msg):
        pass

    await applied.nc.subscribe("silent.y", cb=silent)
    outcomes = []
    pub = Publisher(applied.nc, timeout=30)
    async with pub:
        for _ in range(3):
            await pub.submit("silent.y", b"x", None, outcomes.append)
        await pub.close()
        with pytest.raises(PublishFailed) as info:
            await pub.submit("silent.y", b"x")
    assert info.value.code == ABANDONED
    assert [o.error.code for o in outcomes] == [ABANDONED] * 3


async def test_a_publisher_is_entered_once(applied):
    pub = Publisher(applied.nc)
    async with pub:
        with pytest.raises(RuntimeError, match="once"):
            await pub.__aenter__()
