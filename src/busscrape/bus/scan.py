"""Reading every message a filter selects, through a short-lived consumer the stream's leader serves.

Direct gets are quicker, but any replica of a clustered stream may answer them, also one still
catching up after a restart; where missing a message would be wrong (the names in ARTIFACTS, whose
absence would make live chunks look like strays; the letters ``busscrape dlq`` acts on), reading
goes through an ephemeral consumer instead: memory storage, no acks, deleted at the end.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import StorageUnavailable

IDLE = 60.0  # seconds after which the server removes a scan consumer whose reader died
STALLS = 3  # fetches in a row that time out before a scan gives up


class ScanStalled(StorageUnavailable):
    """Messages stopped arriving before the scan read everything it counted (some were deleted
    under it, or the server stopped answering): what was read is not the whole picture."""

    reason = "scan_stalled"


def scan_config(**fields: object) -> api.ConsumerConfig:
    """An ephemeral, ack-less, in-memory consumer (``fields`` add the filter and start)."""
    base = api.ConsumerConfig(name=f"scan-{uuid.uuid4().hex[:16]}", ack_policy=api.AckPolicy.NONE,
                              mem_storage=True, num_replicas=1, inactive_threshold=IDLE)
    return base.evolve(**fields)


async def scan(js: JetStreamContext, stream: str, config: api.ConsumerConfig, *, batch: int = 1000,
               timeout: float = 10.0) -> AsyncGenerator[Msg, None]:
    """Every message ``config`` selects, in order; raises ``ScanStalled`` when they stop coming
    before the last. Use inside ``contextlib.aclosing`` (the consumer is deleted at the end)."""
    info = await js.add_consumer(stream, config, timeout=timeout)
    sub = None
    try:
        sub = await js.pull_subscribe_bind(consumer=info.name, stream=stream)
        pending, stalls = info.num_pending or 0, 0  # nats-py types it optional; the server always sends it
        while pending > 0:
            try:
                msgs = await sub.fetch(min(batch, pending), timeout=timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                # Messages deleted under the scan leave num_pending stale: ask again.
                stalls += 1
                pending = (await js.consumer_info(stream, info.name)).num_pending or 0
                if stalls >= STALLS and pending:
                    raise ScanStalled(f"scan of {stream} stalled with {pending} messages to go") from None
                continue
            for msg in msgs:
                pending = msg.metadata.num_pending
                yield msg
    finally:
        if sub is not None:
            with contextlib.suppress(*TRANSIENT):
                await sub.unsubscribe()
        with contextlib.suppress(*TRANSIENT):
            await js.delete_consumer(stream, info.name)


async def kv_latest(js: JetStreamContext, bucket: str, keys: str = ">", *, timeout: float = 10.0) -> dict[str, bytes]:
    """Every live key of ``bucket`` that ``keys`` (a subject filter) selects, with its value.

    Not nats-py's ``KeyValue.keys`` or ``watch``: their "caught up" marker can come before the
    first entry (an empty answer for a full bucket) or never (a read that hangs); a scan counts
    what it reads against the consumer's own number. Delete and purge markers (no body) are left out.
    """
    prefix = names.kv_subject(bucket, "")
    config = scan_config(filter_subject=prefix + keys, deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
    found = {}
    async with contextlib.aclosing(scan(js, names.kv_stream(bucket), config, timeout=timeout)) as entries:
        async for msg in entries:
            if msg.data:
                found[msg.subject.removeprefix(prefix)] = msg.data
    return found


NO_MESSAGE = 10057
"""JetStream's err_code ("no message found") for deleting a message that is gone already
(nats-py raises it as a ``ServerError``, not ``NotFoundError``)."""
DELETE_FAILED = 10043
"""JetStream's err_code for a failed delete; its description says "sequence N not found" when the
message went in a concurrent delete (a ``BadRequestError``)."""


async def remove(js: JetStreamContext, stream: str, seq: int) -> bool:
    """Delete message ``seq`` of ``stream``: False when it was gone already (another replay, a
    purge, an ack of a work-queue message, a concurrent reaper removed it first). Raises what
    NATS raises when it does not answer."""
    try:
        await js.delete_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        return False
    except nats.js.errors.APIError as exc:
        if exc.err_code == NO_MESSAGE or (exc.err_code == DELETE_FAILED and "not found" in (exc.description or "")):
            return False
        raise
    return True
