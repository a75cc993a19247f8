"""What each queued task's deliveries did, in the ATTEMPTS bucket: the count of its attempts.

A nak carries no data and the next delivery may run on another host, so two keys per task
(``<task_id>.<task_seq>``) carry its story from one delivery to the next:

- the **history** (that key itself): each attempt that failed, with its reason; the delivery that
  finally gives up puts it into the dead letter. A task that succeeds clears it.
- the **ledger** (``<key>.ledger``): which deliveries reached the page (``reached``), and the
  deliveries that could not because NATS, a bucket, the object store or S3 was unavailable
  (``outages``: how many, since when, what).

An attempt counts only what the page did: a task's attempt is the number of deliveries that
reached it, plus one. A delivery writes ``reached`` *before* it navigates, and navigates only once
that write is stored, so a worker killed mid-render still spends its attempt (a page that kills its
worker every time ends). A delivery that then meets an outage (its artifacts or result not stored)
takes its mark back. Every failed write errs towards one more try, never one fewer: an unwritten
``reached`` means no navigation; an unreadable ledger means the delivery waits (``outages``).
Deferrals (a busy host, ``fleet_gate``) and outages write no ``reached``: they spend no attempt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

import nats.errors
import nats.js.errors
import orjson
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, TypeAdapter

from busscrape.bus.names import ATTEMPTS_BUCKET
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import StorageUnavailable
from busscrape.model.messages import AttemptRecord, utcnow

_HISTORY = TypeAdapter(tuple[AttemptRecord, ...])
_WHAT_KEPT = 8  # distinct names of what was unavailable, kept in a ledger


def attempts_key(task_id: str, task_seq: int) -> str:
    return f"{task_id}.{task_seq}"


def ledger_key(task_id: str, task_seq: int) -> str:
    return f"{task_id}.{task_seq}.ledger"


class Ledger(BaseModel):
    """Which deliveries of one queued task reached its page, and which met an outage."""

    model_config = ConfigDict(frozen=True)

    reached: tuple[int, ...] = ()
    """Delivery numbers whose attempt reached the page (and did not end in an outage)."""
    outages: int = 0
    """Deliveries that could not reach the page or finish with it: something was unavailable."""
    outage_since: datetime | None = None
    """When the first of those began."""
    unavailable: tuple[str, ...] = ()
    """What was unavailable (stream and bucket names, ``S3``, ``NATS``), first seen first."""
    last_outage: str = ""

    @property
    def attempts(self) -> int:
        return len(self.reached)

    def reach(self, delivery: int) -> Ledger:
        return self.model_copy(update={"reached": tuple(sorted({*self.reached, delivery}))})

    def withdraw(self, delivery: int) -> Ledger:
        """The delivery's ``reached`` mark taken back: its attempt did not count."""
        return self.model_copy(update={"reached": tuple(d for d in self.reached if d != delivery)})

    def outage(self, delivery: int, what: str, error: str) -> Ledger:
        """The delivery met an outage: it takes back its ``reached`` mark, if it made one."""
        names = self.unavailable if what in self.unavailable else (*self.unavailable, what)[-_WHAT_KEPT:]
        return self.withdraw(delivery).model_copy(update={
            "outages": self.outages + 1,
            "outage_since": self.outage_since or utcnow(), "unavailable": names, "last_outage": error[:500]})

    def outage_seconds(self) -> float:
        """How long the task has been meeting outages (since the first one), 0 when never."""
        return (utcnow() - self.outage_since).total_seconds() if self.outage_since else 0.0

    def story(self, history: tuple[AttemptRecord, ...], deliveries: int) -> str:
        """What the task's deliveries did, in words, for a dead letter: how many reached the page,
        how many of those failed (and with what), how many ended without an outcome (their
        worker died or went silent), how many were lost to outages or deferred."""
        failed = list(history)
        silent = max(self.attempts - len(failed), 0)
        parts = [f"{deliveries} deliver{'y' if deliveries == 1 else 'ies'}, {self.attempts} of them reached the page"]
        if failed:
            parts.append(f"{len(failed)} failed (last: {failed[-1].reason}: {failed[-1].error[:300]})")
        if silent:
            parts.append(f"{silent} ended without an outcome (the worker died or went silent mid-attempt)")
        if self.outages:
            parts.append(f"{self.outages} lost to outages ({', '.join(self.unavailable)} unavailable), not counted")
        rest = deliveries - self.attempts - self.outages
        if rest > 0:
            parts.append(f"{rest} deferred or handed back, not counted")
        return "; ".join(parts)


@dataclass
class Tally:
    """One delivery's hold on its task's ledger, kept up to date as the delivery writes it."""

    task_id: str
    seq: int
    delivery: int
    """The delivery's number (JetStream's count, deferrals and outages included)."""
    ledger: Ledger | None
    """None when ATTEMPTS could not be read: the delivery must not reach the page."""

    @property
    def attempt(self) -> int:
        """This delivery's attempt: the deliveries that reached the page before it, plus one."""
        return (self.ledger.attempts if self.ledger else 0) + 1

    @property
    def counted(self) -> bool:
        return self.ledger is not None and self.delivery in self.ledger.reached


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

    async def ledger(self, task_id: str, task_seq: int) -> Ledger:
        """The task's ledger (empty when none). Raises ``StorageUnavailable`` when ATTEMPTS does
        not answer: without the count, the delivery must not reach the page."""
        try:
            entry = await (await self._bucket()).get(ledger_key(task_id, task_seq))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return Ledger()
        except TRANSIENT as exc:
            raise _unavailable("cannot read the task's attempts", exc) from None
        try:
            return Ledger.model_validate_json(entry.value or b"{}")
        except ValueError:
            return Ledger()  # unreadable: counted from nothing (one more try, never one fewer)

    async def write(self, task_id: str, task_seq: int, ledger: Ledger) -> Ledger:
        """Store ``ledger``; ``StorageUnavailable`` when ATTEMPTS does not take it. Deliveries of one
        task do not overlap (but a frozen worker's, which may overwrite a later one's mark: one
        more try), so a plain put is enough."""
        try:
            await (await self._bucket()).put(ledger_key(task_id, task_seq), ledger.model_dump_json().encode())
        except TRANSIENT as exc:
            raise _unavailable("cannot record the task's attempt", exc) from None
        return ledger

    async def reach(self, tally: Tally) -> None:
        """Mark the delivery as reaching the page: before it navigates. ``StorageUnavailable``
        when ATTEMPTS does not take it (then the delivery must not navigate)."""
        if tally.ledger is None:
            raise StorageUnavailable(f"the task's attempts in {ATTEMPTS_BUCKET} are unknown", what=ATTEMPTS_BUCKET)
        if not tally.counted:
            tally.ledger = await self.write(tally.task_id, tally.seq, tally.ledger.reach(tally.delivery))

    async def count(self, tally: Tally) -> None:
        """A delivery that failed for the page's sake before it navigated (a login page, the
        browser): counted too, best effort (unrecorded, it is one more try)."""
        if tally.ledger is not None and not tally.counted:
            with contextlib.suppress(StorageUnavailable):
                await self.reach(tally)

    async def clear(self, task_id: str, task_seq: int, *, history: bool = True) -> None:
        """Forget the task's ledger (and its history, unless it never had one): best effort."""
        with contextlib.suppress(*TRANSIENT):
            kv = await self._bucket()
            await kv.purge(ledger_key(task_id, task_seq))
            if history:
                await kv.purge(attempts_key(task_id, task_seq))


def _unavailable(doing: str, exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"{doing} in {ATTEMPTS_BUCKET}: {exc!r}", what=ATTEMPTS_BUCKET)
