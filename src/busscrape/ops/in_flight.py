"""Taking back at once the tasks a killed run's workers were rendering.

A run killed with SIGKILL takes its embedded nats-server and its workers with it; the tasks
they held stay pending on the workers' consumer and would come back only after ``ack_wait``
(a minute of a re-run doing nothing). The next run on the same state dir knows the earlier
one died (its pid files are left, ``ops.lifeline``) and that nobody else uses that server, so
it naks those deliveries for the workers it has just started.

Only deliveries whose task's last STATUS record says a worker had it (``running``, or
``rendered``: its result published, its ack not) are nak'ed: a task nak'ed with a delay
(a retry with backoff, a Retry-After, a deferral for a busy host) keeps its delay. A nak is a
redelivery like the one ``ack_wait`` would have made: its delivery count goes up, so the next
delivery finds a result that stands and does not render twice (``worker.daemon``).

The nak names the delivery by the consumer's last delivery sequence, not its own (which only
the dead worker knew): the server accepts any sequence between the ack floor and the last
delivery for a stream sequence that is pending (``names.ack_subject``).
"""

from __future__ import annotations

import nats.js.errors
import structlog

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import ScrapeTask, decode
from busscrape.status.records import StatusBoard

log = structlog.get_logger("busscrape.run")

HELD = ("running", "rendered")
"""The STATUS states of a task a worker holds (its delivery pending without a delay of its own)."""
HANDED_BACK = "shutting_down"
"""A ``retrying`` record with this reason: a worker that stopped as the run died handed the task
back, but its nak may not have reached the dying server (the delivery then stays pending)."""


async def reclaim(bus: Bus, timeout: float = 5.0) -> list[str]:
    """Nak every pending delivery of the workers' consumer whose task a worker held; the task ids."""
    js = bus.js
    try:
        info = await js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    except nats.js.errors.NotFoundError:
        return []
    if not info.num_ack_pending or info.delivered is None:
        return []
    last_stream, last_consumer = info.delivered.stream_seq or 0, info.delivered.consumer_seq or 0
    board, taken, seq = StatusBoard(js), [], 1
    while seq <= last_stream:
        try:
            msg = await js.get_msg(names.TASKS_STREAM, seq, subject=names.TASKS_ALL, next=True)
        except nats.js.errors.NotFoundError:
            break
        seq = (msg.seq or seq) + 1
        if not msg.data or (msg.seq or 0) > last_stream:
            continue  # a SEEN delete marker, or not delivered yet
        try:
            task_id = decode(ScrapeTask, msg.data).task_id
        except MessageDecodeError:
            continue  # the worker that takes it dead-letters it
        latest = await board.latest(task_id)
        if latest is None or not (latest[0].state in HELD
                                  or (latest[0].state == "retrying" and latest[0].reason == HANDED_BACK)):
            continue
        subject = names.ack_subject(names.TASKS_STREAM, names.WORKERS_CONSUMER, msg.seq or 0, last_consumer)
        try:
            await bus.nc.request(subject, b"-NAK", timeout=timeout)
        except TimeoutError:  # no longer pending (the stopping worker's own nak landed): nothing to take
            continue
        taken.append(task_id)
    if taken:
        log.warning("run.in_flight_reclaimed", tasks=len(taken))
    return taken
