"""Filing dead letters: one place that turns a give-up into a DEADLETTER message.

Every stage that gives up on a message calls ``file`` and only then removes the message from
its own stream, so a crash between the two at worst files the same letter twice, and the
``Nats-Msg-Id`` (one per task delivery or poison message) makes the second one a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from busscrape.bus.compat import connection_of
from busscrape.bus.names import DEADLETTER_STREAM, MSG_ID, deadletter_subject
from busscrape.errors import BusscrapeError
from busscrape.model.bounds import fit_letter
from busscrape.model.messages import DeadLetter, MessageSource, preview
from busscrape.telemetry import tracing

if TYPE_CHECKING:
    # Annotations only: the daemons load the OpenTelemetry SDK, the short commands need not.
    from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.deadletters")

PAYLOAD_PREVIEW = 4096  # characters of an undecodable payload kept in its dead letter
DEFAULT_LIMIT = 1024 * 1024  # streams.max_msg_size's default; callers pass their own
ENVELOPE = 1024  # headers (msg id, trace context) and the protocol's own bytes


def host_of(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def source_of(msg: Msg) -> MessageSource:
    seq = msg.metadata.sequence.stream if msg.reply else None
    stream = msg.metadata.stream if msg.reply else "?"
    return MessageSource(stream=stream, subject=msg.subject, seq=seq)


def poison(stage: str, msg: Msg, error: BusscrapeError) -> DeadLetter:
    """The dead letter for a message that could not even be decoded."""
    return DeadLetter(
        stage=stage,  # type: ignore[arg-type]
        reason=error.reason,
        error=str(error),
        payload=preview(msg.data, PAYLOAD_PREVIEW),
        source=source_of(msg),
    )


async def file(js: JetStreamContext, letter: DeadLetter, *, msg_id: str, telemetry: Telemetry | None = None,
               limit: int = DEFAULT_LIMIT) -> None:
    """Publish ``letter`` to DEADLETTER and wait for its ack (raises if NATS refuses). A letter
    larger than ``limit`` bytes (the stream's ``max_msg_size``) or than the server takes is cut to
    fit first (``model.bounds.fit_letter``): a letter can always be filed."""
    subject = deadletter_subject(letter.stage, letter.task_id)
    room = min(limit, connection_of(js).max_payload or limit) - ENVELOPE
    letter, data = fit_letter(letter, room)
    if letter.truncated:
        log.warning("deadletter.truncated", task_id=letter.task_id, cut=letter.truncated, limit=room)
    ack = await js.publish(subject, data, stream=DEADLETTER_STREAM, headers=tracing.inject({MSG_ID: msg_id}))
    if telemetry is not None and not ack.duplicate:
        telemetry.dead_letters.add(1, {"stage": letter.stage, "reason": letter.reason})
    log.warning("deadletter.filed", stage=letter.stage, reason=letter.reason, task_id=letter.task_id,
                url=letter.url, error=letter.error[:300])
