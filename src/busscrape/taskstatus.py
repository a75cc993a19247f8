"""Task status: every transition of every task, in the STATUS key-value bucket.

Each service records the transitions it makes (the worker: running, retrying, rendered, dead;
the reaper: dead; the ingester: archived, dead). Every record is a new revision of the key
``<task_id>``, so the key's history is the task's story, and a watcher on the bucket sees
tasks finish as it happens (``busscrape run`` waits on it).

A task can be dispatched again later (a recrawl, ``--force``, a dead-letter replay) under the
same id; ``dispatched_at`` tells the generations apart.

Recording is best effort: the bus's guarantees never depend on it, so a STATUS write that
fails is logged and skipped rather than failing the task.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Literal

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import Field

from .messages import Message, decode, encode, utcnow
from .subjects import STATUS_BUCKET

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


class StatusBoard:
    """Writes and reads STATUS records."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(STATUS_BUCKET)
        return self._kv

    async def record(self, status: TaskStatus) -> bool:
        """Add a transition. Whether it was stored: callers for whom it matters (the ingester's
        ``archived``, which ``busscrape run`` waits for) retry; for the others it is best effort."""
        try:
            await asyncio.wait_for((await self._bucket()).put(status.task_id, encode(status)), 5)
        except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as exc:
            log.warning("status.unrecorded", task_id=status.task_id, state=status.state, error=repr(exc))
            return False
        return True

    async def latest(self, task_id: str) -> TaskStatus | None:
        try:
            entry = await (await self._bucket()).get(task_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return decode(TaskStatus, entry.value or b"")

    async def history(self, task_id: str) -> list[TaskStatus]:
        """Every recorded transition of ``task_id``, oldest first.

        Read message by message (``next_by_subj``), not through nats-py's ``KeyValue.history``:
        its watcher can signal "no more" before the first entry when the server pushes the
        entries after answering its consumer-info request, and then returns nothing at all.
        """
        stream, subject = f"KV_{STATUS_BUCKET}", f"$KV.{STATUS_BUCKET}.{task_id}"
        records, seq = [], 1
        while True:
            try:
                msg = await self._js.get_msg(stream, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return records
            if msg.data:  # a delete or purge marker has none
                records.append(decode(TaskStatus, msg.data))
            seq = (msg.seq or seq) + 1
