"""Too large is an answer, not a passing failure: every publish and KV write that NATS would
refuse for its size raises ``PayloadTooLarge`` (a ``PermanentError``), never something
``bus.retry.TRANSIENT`` catches.

nats-py raises ``MaxPayloadError`` (a ``nats.errors.Error``, so "transient" to every
``except TRANSIENT``) when the payload alone is over the server's ``max_payload``, and sends a
message whose payload fits but whose headers push it over, which the server answers by closing
the connection (a reconnect, then the same again). JetStream answers a message over a stream's
``max_msg_size`` (a bucket's ``max_value_size``) with API error 10054, a ``nats.js.errors.Error``.
``BusClient`` and ``BusJetStream`` turn all three into ``PayloadTooLarge`` at the one place every
write passes (the connection ``bus.connection`` makes and the JetStream context it hands out,
whose KV buckets publish through it), so no call site can retry one by forgetting a case.

Code that stores what a page controls bounds it first (``fit``) and records what it cut; this is
the backstop, and its error names the subject and both sizes.
"""

from __future__ import annotations

from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from busscrape.bus.compat import TlsEnforcingClient, encode_headers
from busscrape.errors import PayloadTooLarge

MESSAGE_TOO_LARGE = 10054
"""JetStream's err_code for "message size exceeds maximum allowed"."""


def check(subject: str, payload: bytes, header_bytes: int, max_payload: int) -> None:
    """``PayloadTooLarge`` when the message (headers and payload, as the server counts it) is
    over ``max_payload``."""
    size = len(payload) + header_bytes
    if max_payload and size > max_payload:
        raise PayloadTooLarge(f"a {size}-byte message on {subject} is over the server's max_payload "
                              f"({max_payload} bytes)")


class BusJetStream(JetStreamContext):
    """nats-py's JetStream context, with the stream's size refusal made ``PayloadTooLarge``."""

    async def publish(self, subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().publish(subject, payload, *args, **kwargs)
        except nats.js.errors.APIError as exc:
            if exc.err_code == MESSAGE_TOO_LARGE:
                raise PayloadTooLarge(f"a {len(payload)}-byte message on {subject}: {exc.description}") from None
            raise


class BusClient(TlsEnforcingClient):
    """nats-py's client, refusing an over-size message with ``PayloadTooLarge`` before it is sent."""

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:
        check(subject, payload, len(encode_headers(headers).encode()) if headers else 0, self.max_payload)
        await super().publish(subject, payload, reply=reply, headers=headers)

    def jetstream(self, **opts: Any) -> BusJetStream:
        return BusJetStream(self, **opts)


HEADROOM = 1024
"""Bytes left for a write's subject and headers (expected revision, TTL, message id)."""


def room(js: JetStreamContext, configured: int) -> int:
    """Bytes a KV value or message may take: the smaller of the stream's ``configured`` limit
    (``streams.max_msg_size``, which buckets take as ``max_value_size``) and the server's
    ``max_payload``, less ``HEADROOM``. What a page controls is cut to this before it is written."""
    from busscrape.bus.compat import connection_of

    server = connection_of(js).max_payload or configured
    return max(min(configured, server) - HEADROOM, 0)


async def kv_room(js: JetStreamContext, kv: KeyValue) -> int:
    """Bytes a value of bucket ``kv`` may take: its own ``max_value_size`` and the server's."""
    configured = (await kv.status()).stream_info.config.max_msg_size or 0
    return room(js, configured if configured > 0 else 1 << 62)
