"""Whether a queued task is already done: the results RESULTS holds for it, read from the leader.

A delivery can end with its result stored and nobody knowing: the worker died between the PubAck
and the ack, or the PubAck itself was lost. The next delivery, the reaper and the clean-up of
leftover artifacts must all find that result, so they ask here, and ask the stream's leader
(``STREAM.MSG.GET``), never a direct get that any replica may answer before it has caught up.
"""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import ScrapeResult, decode


async def standing_results(js: JetStreamContext, task_id: str, task_seq: int) -> list[ScrapeResult] | None:
    """Every result RESULTS holds for the task queued at ``task_seq`` (usually none or one);
    None when RESULTS did not answer (then nothing may be concluded from it)."""
    subject = names.result_subject(task_id)
    found: list[ScrapeResult] = []
    cursor = 1
    while True:
        try:
            msg = await js.get_msg(names.RESULTS_STREAM, cursor, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return found
        except TRANSIENT:
            return None
        try:
            result = decode(ScrapeResult, msg.data or b"")
        except MessageDecodeError:
            result = None  # a poison message on the task's subject: not a result of it
        if result is not None and result.task_id == task_id and result.task_seq == task_seq:
            found.append(result)
        cursor = (msg.seq or cursor) + 1


def objects_of(results: list[ScrapeResult]) -> set[str]:
    """Every ARTIFACTS object the results point at: none of them may be discarded."""
    return {ref.object for result in results for ref in result.artifacts}
