"""The archivist: copies every dead letter from DEADLETTER into the archive.

It runs beside each ingester (a companion on ``DEADLETTER/archivist``) and writes each letter to
``<prefix>/deadletter/dt=…/<task_id>.json``, so the archive alone tells what became of every task.
A letter that cannot be decoded is archived as a letter about it; it is never filed to
DEADLETTER again, which could loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from nats.aio.msg import Msg

from busscrape.archive import layout
from busscrape.archive.storage import Storage
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService, quietly
from busscrape.bus.names import ARCHIVIST_CONSUMER, DEADLETTER_STREAM
from busscrape.deadletters import filing
from busscrape.errors import MessageDecodeError, RetryableError
from busscrape.model.messages import DeadLetter, decode, encode

if TYPE_CHECKING:
    # Annotations only: the daemons load the OpenTelemetry SDK, the short commands need not.
    from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.archivist")

JSON = "application/json"
LETTER_SLOTS = 2  # dead letters are few and small


class Archivist(PullService):
    """Copies every dead letter into the archive; runs inside each ingester."""

    kind = "archivist"
    stream = DEADLETTER_STREAM
    durable = ARCHIVIST_CONSUMER

    def __init__(self, bus: Bus, storage: Storage, *, prefix: str, backoff: tuple[float, float],
                 grace_period: float, telemetry: Telemetry | None = None) -> None:
        super().__init__(bus, concurrency=LETTER_SLOTS, grace_period=grace_period, backoff=backoff,
                         telemetry=telemetry)
        self.storage = storage
        self.prefix = prefix

    async def handle(self, msg: Msg) -> None:
        try:
            letter = decode(DeadLetter, msg.data)
            data = msg.data
        except MessageDecodeError as exc:
            # Archive a letter about the unreadable one, dated by the stream (so a redelivery writes
            # the same bytes). It is never filed to DEADLETTER again: that could loop.
            letter = filing.poison("ingester", msg, exc).model_copy(update={"dead_at": msg.metadata.timestamp})
            data = encode(letter)
            self.counters["unreadable"] += 1
        key = layout.deadletter_key(letter, prefix=self.prefix, stream=DEADLETTER_STREAM,
                                     seq=msg.metadata.sequence.stream)
        try:
            existing = await self.storage.get(key)
            newer = existing is not None and _dead_at_after(existing, letter)
            if not newer:
                await self.storage.put_bytes(key, data, content_type=JSON)
        except RetryableError as exc:
            await self.retry_later(msg, exc, "deadletter.not_archived", key=key)
            return
        await quietly(msg.ack_sync())
        self.counters["superseded" if newer else "archived"] += 1
        log.info("deadletter.archived", key=key, task_id=letter.task_id, reason=letter.reason, superseded=newer)


def _dead_at_after(stored: bytes, letter: DeadLetter) -> bool:
    """Whether the stored letter is a later one for the same key (the latest word stays)."""
    try:
        return decode(DeadLetter, stored).dead_at > letter.dead_at
    except MessageDecodeError:
        return False
