"""Too large is a permanent, named outcome on a real nats-server, wherever the write goes: a KV
value or message over the server's max_payload, one whose headers push it over, one over a
bucket's max_value_size, and one through the pipelined publisher: ``PayloadTooLarge``, which no
``except TRANSIENT`` catches (nats-py's ``MaxPayloadError`` and JetStream's 10054 both were)."""

from __future__ import annotations

import pytest
from nats.js import api

from busscrape.bus import names
from busscrape.bus.publisher import Publisher, PublishFailed
from busscrape.bus.retry import TRANSIENT, passing
from busscrape.errors import PayloadTooLarge, PermanentError


def transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


async def test_a_kv_value_over_max_payload_is_payload_too_large(applied):
    kv = await applied.js.key_value(names.CRAWLS_BUCKET)
    big = b"x" * (applied.nc.max_payload + 1)
    with pytest.raises(PayloadTooLarge) as caught:
        await kv.put("c.links.t", big)
    assert isinstance(caught.value, PermanentError) and not transient(caught.value) and not passing(caught.value)
    assert "max_payload" in str(caught.value)
    # The headers count: a value that fits alone but not with them is refused before it is sent
    # (the server would close the connection, and the client reconnect and send it again).
    with pytest.raises(PayloadTooLarge):
        await applied.nc.publish("busscrape.test.size", b"x" * (applied.nc.max_payload - 10),
                                 headers={"Nats-Msg-Id": "y" * 64})
    assert applied.nc.is_connected


async def test_a_value_over_the_buckets_max_value_size_is_payload_too_large(applied):
    kv = await applied.js.create_key_value(api.KeyValueConfig(bucket="SMALLVALUES", max_value_size=1000))
    try:
        await kv.put("fits", b"x" * 900)
        with pytest.raises(PayloadTooLarge) as caught:
            await kv.put("too-big", b"x" * 2000)
        assert not transient(caught.value)
    finally:
        await applied.js.delete_key_value("SMALLVALUES")


async def test_the_publisher_gives_up_at_once_on_a_message_too_large(applied):
    async with Publisher(applied.nc) as pub:
        with pytest.raises(PublishFailed) as caught:
            await pub.publish(names.task_subject("a" * 32), b"x" * (applied.nc.max_payload + 1))
    assert caught.value.retryable is False and caught.value.code == 413
    assert "max_payload" in str(caught.value)
