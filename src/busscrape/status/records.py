"""Task status: every transition of every task, in the STATUS key-value bucket.

Each service records the transitions it makes (the worker: running, retrying, rendered, dead;
the reaper: dead; the ingester: archived, dead). Every record is a new revision of the key
``<task_id>``, so the key's history is the task's story, and a watcher on the bucket sees
tasks finish as it happens (``busscrape run`` waits on it).

The latest record of a key is what ``busscrape run`` (resuming), ``status`` and the API take
for the task's state, so it must never step back from an outcome. Services run side by side
(the ingester archives a result while the worker that published it is still recording), so a
worker's delivery records each of its steps on top of its own previous record
(``Transitions``): once another service has recorded in between, the story has moved on and
that delivery records no more steps. Outcomes (archived, dead) are always recorded.

A task can be dispatched again later (a recrawl, ``--force``, a dead-letter replay) under the
same id; ``dispatched_at`` tells the generations apart.

Recording is best effort: the bus's guarantees never depend on it, so a STATUS write that
fails is logged and skipped rather than failing the task.
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import Field

from busscrape.bus.names import STATUS_BUCKET, STATUS_STREAM, kv_subject
from busscrape.bus.retry import TRANSIENT, transient_or
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import Message, decode, encode, utcnow

log = structlog.get_logger("busscrape.taskstatus")

State = Literal["queued", "running", "retrying", "rendered", "archived", "dead"]
FINAL: frozenset[str] = frozenset({"archived", "dead"})


class TaskStatus(Message):
    """One transition of one task."""

    task_id: str
    state: State
    at: datetime = Field(default_factory=utcnow)
    url: str | None = None
    dispatched_at: datetime | None = None
    """Which dispatch of this task id the record belongs to."""
    attempt: int | None = None
    worker: str | None = None
    status: int | None = None
    """HTTP status of the page, once rendered."""
    reason: str | None = None
    error: str | None = None
    archive: str | None = None
    """Where the task's folder (or dead letter) is in the archive."""

    # Three records per finished task, each kept for status_ttl: left out while unset (issue #19).
    omit_when_default: ClassVar[tuple[str, ...]] = (
        "url", "dispatched_at", "attempt", "worker", "status", "reason", "error", "archive")


class StatusBoard:
    """Writes and reads STATUS records."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(STATUS_BUCKET)
        return self._kv

    async def record(self, status: TaskStatus, *, after: int | None = None) -> int | None:
        """Add a transition; its revision, or None when it was not stored. Callers for whom it
        matters (the ingester's ``archived``, which ``busscrape run`` waits for) retry; for the
        others it is best effort. With ``after``, stored only if that revision is still the
        key's latest."""
        value = encode(status)
        try:
            bucket = await self._bucket()
            put = bucket.put(status.task_id, value) if after is None else bucket.update(status.task_id, value, after)
            return await asyncio.wait_for(put, 5)
        except nats.js.errors.KeyWrongLastSequenceError:
            log.debug("status.superseded", task_id=status.task_id, state=status.state)
        except TRANSIENT as exc:
            log.warning("status.unrecorded", task_id=status.task_id, state=status.state, error=repr(exc))
        return None

    async def latest(self, task_id: str) -> tuple[TaskStatus, int] | None:
        """The latest record of ``task_id`` and its revision."""
        try:
            entry = await asyncio.wait_for((await self._bucket()).get(task_id), 5)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return decode(TaskStatus, entry.value or b""), entry.revision or 0

    async def history(self, task_id: str) -> list[TaskStatus]:
        """Every recorded transition of ``task_id``, oldest first.

        Read message by message (``next_by_subj``), not through nats-py's ``KeyValue.history``:
        its watcher can signal "no more" before the first entry when the server pushes the
        entries after answering its consumer-info request, and then returns nothing at all.
        """
        stream, subject = STATUS_STREAM, kv_subject(STATUS_BUCKET, task_id)
        records: list[TaskStatus] = []
        seq = 1
        while True:
            try:
                msg = await self._js.get_msg(stream, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return records
            if msg.data:  # a delete or purge marker has none
                records.append(decode(TaskStatus, msg.data))
            seq = (msg.seq or seq) + 1


@dataclass
class Transitions:
    """The records one delivery of a task makes, each on top of the one before.

    The first (``running``) goes on top of whatever the key holds, except an outcome of the
    same dispatch: a redelivery of a task whose result was archived (its worker died before
    the ack) must not make it look unfinished again, so such a delivery records nothing. When
    another service records in between (the ingester archiving the result while this worker
    records ``rendered``, or a later delivery after ack-wait ran out), the later steps of this
    delivery are left out.
    """

    board: StatusBoard
    _: KW_ONLY
    task_id: str
    url: str
    dispatched_at: datetime | None
    attempt: int
    worker: str
    _last: int | None = field(default=None, init=False)
    """The revision of this delivery's latest record (None: it records no more steps)."""
    resumed: bool = False
    """The delivery follows a deferral (``worker.fleet_gate``): the same attempt may have been
    recorded ``running`` by the delivery that was deferred."""
    settled: bool = field(default=False, init=False)
    """The key already held this dispatch's outcome when the delivery started."""

    async def start(self) -> None:
        after = None
        if self.attempt > 1 or self.resumed:  # only a redelivery can find records of this dispatch
            try:
                found = await self.board.latest(self.task_id)
            except transient_or(MessageDecodeError):
                found = None
            if found is not None:
                status, after = found
                if status.dispatched_at == self.dispatched_at:
                    if status.state in FINAL:
                        self.settled = True
                        return
                    if status.state == "running" and status.attempt == self.attempt:
                        self._last = after  # this attempt, deferred after it started: one `running`
                        return
        self._last = await self.board.record(self._status("running"), after=after)

    async def step(self, state: State, **fields: Any) -> None:
        """A step within the delivery (retrying, rendered): best effort, and only in order."""
        if self._last is not None:
            self._last = await self.board.record(self._status(state, **fields), after=self._last)

    async def outcome(self, state: State, **fields: Any) -> bool:
        """The delivery's outcome (dead), recorded unless the task had one already. Whether
        the task's outcome is now stored."""
        return self.settled or await self.board.record(self._status(state, **fields)) is not None

    def _status(self, state: State, **fields: Any) -> TaskStatus:
        return TaskStatus(state=state, **{"task_id": self.task_id, "url": self.url, "dispatched_at": self.dispatched_at,
                                          "worker": self.worker, "attempt": self.attempt, **fields})
