"""Attempt history per queued task, in the ATTEMPTS bucket.

A nak carries no data and the next delivery may run on another host, so each failed attempt
is written here (key ``<task_id>.<task_seq>``) and the delivery that finally gives up puts the
whole history into the dead letter. A task that succeeds after failures clears its entry.

Deferrals (deliveries nak'ed because the task's host was at its limit, ``fleet_gate``) are counted
beside it (key ``<task_id>.<task_seq>.deferred``): a task's attempt is its delivery count less
its deferrals, so waiting for a busy host spends no attempt.
"""

from __future__ import annotations

import contextlib

import nats.errors
import nats.js.errors
import orjson
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import TypeAdapter

from busscrape.bus.names import ATTEMPTS_BUCKET
from busscrape.bus.retry import TRANSIENT, transient_or
from busscrape.model.messages import AttemptRecord

_HISTORY = TypeAdapter(tuple[AttemptRecord, ...])


def attempts_key(task_id: str, task_seq: int) -> str:
    return f"{task_id}.{task_seq}"


def deferrals_key(task_id: str, task_seq: int) -> str:
    return f"{task_id}.{task_seq}.deferred"


class AttemptLog:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(ATTEMPTS_BUCKET)
        return self._kv

    async def history(self, task_id: str, task_seq: int) -> tuple[AttemptRecord, ...]:
        """Earlier failed attempts (empty when none, or when the bucket cannot be read)."""
        try:
            entry = await (await self._bucket()).get(attempts_key(task_id, task_seq))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return ()
        except TRANSIENT:
            return ()
        try:
            return _HISTORY.validate_json(entry.value or b"[]")
        except ValueError:
            return ()

    async def record(self, task_id: str, task_seq: int, attempt: AttemptRecord) -> tuple[AttemptRecord, ...]:
        """Append ``attempt`` and return the whole history (best effort: history is advisory)."""
        history = (*[a for a in await self.history(task_id, task_seq) if a.attempt != attempt.attempt], attempt)
        with contextlib.suppress(*TRANSIENT):
            payload = orjson.dumps([a.model_dump(mode="json") for a in history])
            await (await self._bucket()).put(attempts_key(task_id, task_seq), payload)
        return history

    async def deferrals(self, task_id: str, task_seq: int) -> int:
        """How many deliveries of the task were deferrals (0 when none or unreadable)."""
        try:
            entry = await (await self._bucket()).get(deferrals_key(task_id, task_seq))
            return int(entry.value or b"0")
        except transient_or(nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, ValueError):
            return 0

    async def defer(self, task_id: str, task_seq: int, deferrals: int) -> bool:
        """Record one more deferral on top of ``deferrals`` (known from this delivery's start:
        deliveries of one task do not overlap). False when NATS did not take it."""
        try:
            await (await self._bucket()).put(deferrals_key(task_id, task_seq), str(deferrals + 1).encode())
        except TRANSIENT:
            return False
        return True

    async def clear(self, task_id: str, task_seq: int) -> None:
        with contextlib.suppress(*TRANSIENT):
            kv = await self._bucket()
            await kv.purge(attempts_key(task_id, task_seq))
            await kv.purge(deferrals_key(task_id, task_seq))
