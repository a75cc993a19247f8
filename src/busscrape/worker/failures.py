"""What a worker does with a task that failed: retry it later, or file its dead letter.

A nak carries no data and the next delivery may run on another host, so every failed attempt is
recorded in ATTEMPTS first (``attempts``). A retryable failure then naks the task with the
worker's backoff (at least what ``Retry-After`` asked); on the last allowed delivery, and for a
permanent failure at once, the task's dead letter is filed with the whole attempt history, the
objects its attempts stored are discarded, ``dead`` is recorded in STATUS, and only then is the
task acked. Each step that NATS does not take keeps the task (nak) for another go: the letter's
``Nats-Msg-Id`` makes a second filing a no-op.

An outage is neither (``outage``): a delivery that could not reach the page, or not store what it
rendered, because NATS, a bucket, the object store or S3 did not answer spends no attempt. Its
mark is taken back from the task's ledger (``attempts``; the delivery waits for ATTEMPTS to
take it), the worker stops fetching until the bus answers (``backpressure``), and the task is
nak'ed. Only ``worker.outage_budget`` ends such a task: ``outage_exceeded``, saying for how long
and what was unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from nats.aio.msg import Msg

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.retry import TRANSIENT, backoff, transient_or
from busscrape.deadletters import filing
from busscrape.errors import (
    BusscrapeError,
    MessageDecodeError,
    PermanentError,
    RetryableError,
    ShuttingDown,
    StorageUnavailable,
    said,
)
from busscrape.model.messages import AttemptRecord, DeadLetter, ScrapeTask, utcnow
from busscrape.settings import Settings
from busscrape.status.records import Transitions
from busscrape.worker.attempts import AttemptLog, Ledger, Tally
from busscrape.worker.backpressure import ResultsRoom
from busscrape.worker.results import ResultPublisher

if TYPE_CHECKING:
    # Annotations only: the daemons load the OpenTelemetry SDK, the short commands need not.
    from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.worker")


class DeliveriesExhausted(PermanentError):
    reason = "max_deliveries"


class OutageExceeded(PermanentError):
    """The task met outages for longer than ``worker.outage_budget``: not the page's failure,
    but the bound that keeps it from waiting for ever."""

    reason = "outage_exceeded"


_OUTAGE_WAIT = 5.0  # seconds between looks while an outage's record waits for ATTEMPTS


def outage_of(exc: BaseException) -> tuple[str, str]:
    """What was unavailable, and the error in words, for any outage a delivery met."""
    what = exc.what if isinstance(exc, StorageUnavailable) else "NATS"
    return what, (said(exc)) if isinstance(exc, BusscrapeError) else repr(exc)


class Failures:
    """The retry and dead-letter paths of one worker."""

    def __init__(self, bus: Bus, settings: Settings, attempts: AttemptLog, results: ResultPublisher,
                 room: ResultsRoom, count: Callable[[str], None], telemetry: Telemetry | None = None) -> None:
        self.bus = bus
        self.room = room
        self.settings = settings
        self.attempts = attempts
        self.results = results
        self.count = count
        self.telemetry = telemetry
        self.max_deliver = settings.streams.worker_max_deliver
        """Deliveries of a task (the consumer's own figure once the worker has read it)."""

    def retry_delay(self, attempt: int, retry_after: float | None = None) -> float:
        """The worker's backoff: ``retry_base_delay`` doubling up to ``retry_max_delay``, at least
        what Retry-After asked (capped the same)."""
        w = self.settings.worker
        return backoff(attempt, w.retry_base_delay, w.retry_max_delay, at_least=retry_after)

    def _record(self, attempt: int, exc: BusscrapeError) -> AttemptRecord:
        status = None
        if exc.reason.startswith("http_") and exc.reason[5:].isdigit():
            status = int(exc.reason[5:])
        return AttemptRecord(attempt=attempt, worker=self.settings.worker.name, at=utcnow(), reason=exc.reason,
                             error=str(exc)[:2000], retryable=isinstance(exc, RetryableError), status=status)

    async def retry(self, msg: Msg, story: Transitions, task: ScrapeTask, tally: Tally, exc: RetryableError) -> None:
        """Nak for another delivery, or file the letter when this was the last one."""
        attempt, seq = story.attempt, tally.seq
        await self.attempts.count(tally)
        history = await self.attempts.record(task.task_id, seq, self._record(attempt, exc))
        if 0 < self.max_deliver <= attempt:
            await self._file(msg, story, task, seq, history, exc, last=True)
            return
        delay = self.retry_delay(attempt, exc.retry_after)
        self.count("retried")
        await story.step("retrying", reason=exc.reason, error=str(exc)[:500])
        log.warning("task.retry", reason=exc.reason, error=str(exc)[:300], delay=round(delay, 2))
        await msg.nak(delay=delay)

    async def handed_back(self, running: asyncio.Future[Any], story: Transitions, task: ScrapeTask,
                          tally: Tally) -> None:
        """The worker stopped while the task ran: not the page's doing, so its mark is taken back
        (no attempt spent) and ``retrying`` recorded in STATUS before the service hands the
        message back, so the task's history says what happened to that delivery. Bounded: the
        way out must not hang on NATS (unrecorded, the delivery counts: one fewer try, only for a
        stop during an outage)."""
        exc = ShuttingDown(f"worker {self.settings.worker.name} stopped during the attempt; handed back to the queue")
        try:
            async with asyncio.timeout(5):
                with contextlib.suppress(Exception):
                    await running
                if tally.counted and tally.ledger is not None:
                    tally.ledger = await self.attempts.write(task.task_id, tally.seq,
                                                             tally.ledger.withdraw(tally.delivery))
                await story.step("retrying", reason=exc.reason, error=str(exc))
        except transient_or(TimeoutError, StorageUnavailable):
            log.warning("task.handed_back_unrecorded", reason=exc.reason)
            return
        log.info("task.handed_back", reason=exc.reason)

    async def exhausted(self, msg: Msg, story: Transitions, task: ScrapeTask, tally: Tally) -> None:
        """A delivery past the last attempt: ``max_deliver`` deliveries reached the page, and the
        last ones ended without an outcome (their worker died or went silent mid-attempt; one
        that failed would have filed the letter itself). The worker files it, as the consumer's
        own ``max_deliver`` leaves room for deliveries that did not reach the page."""
        assert tally.ledger is not None
        history = await self.attempts.history(task.task_id, tally.seq)
        # Each attempt failed (its letter could not be filed or recorded): the last one's reason.
        failed = history[-1].reason if history and len(history) >= tally.ledger.attempts else None
        reached = tally.ledger.attempts
        exc = DeliveriesExhausted(f"{reached} attempt{'' if reached == 1 else 's'} reached the page, none with "
                                  f"its outcome recorded (max_deliver {self.max_deliver}): "
                                  f"{tally.ledger.story(history, tally.delivery - 1)}", reason=failed)
        await self._file(msg, story, task, tally.seq, history, exc, last=False)

    async def outage_exceeded(self, msg: Msg, story: Transitions, task: ScrapeTask, tally: Tally) -> None:
        """The task met outages for longer than ``outage_budget``: its letter says so."""
        assert tally.ledger is not None
        ledger, budget = tally.ledger, self.settings.worker.outage_budget
        since = f"{ledger.outage_since:%Y-%m-%dT%H:%M:%SZ}" if ledger.outage_since else "?"
        history = await self.attempts.history(task.task_id, tally.seq)
        exc = OutageExceeded(f"outages for {ledger.outage_seconds():.0f}s since {since}, over worker.outage_budget "
                             f"{budget:.0f}s: {', '.join(ledger.unavailable)} did not answer; "
                             f"{ledger.story(history, tally.delivery - 1)}; last outage: {ledger.last_outage}")
        await self._file(msg, story, task, tally.seq, history, exc, last=False)

    async def outage(self, msg: Msg, story: Transitions | None, task: ScrapeTask, tally: Tally,
                     exc: BaseException) -> float:
        """The delivery met an outage: no attempt spent (its mark taken back, the outage counted,
        waiting for ATTEMPTS to take that), the worker paused until the bus answers, the task
        nak'ed; the delay."""
        what, error = outage_of(exc)
        self.room.unavailable(what, error)
        self.count("outage")
        log.warning("task.outage", unavailable=what, error=error[:300], delivery=tally.delivery)
        if tally.ledger is not None:  # an unread ledger is left as it is: nothing to take back
            await self.rewrite(tally, tally.ledger.outage(tally.delivery, what, error))
        if story is not None:
            with contextlib.suppress(*TRANSIENT):
                await story.step("retrying", reason="outage", error=f"{what} unavailable: {error}"[:500])
        delay = self.retry_delay(1)
        with contextlib.suppress(*TRANSIENT):
            await msg.nak(delay=delay)
        return delay

    async def rewrite(self, tally: Tally, ledger: Ledger) -> None:
        """Store ``ledger`` (a mark taken back), waiting for ATTEMPTS to take it while the
        delivery's heartbeats keep the task: unstored, the mark would spend an attempt."""
        while True:
            try:
                tally.ledger = await self.attempts.write(tally.task_id, tally.seq, ledger)
                return
            except StorageUnavailable as err:
                self.room.unavailable(err.what, str(err))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.room.wait(), _OUTAGE_WAIT)

    async def dead(self, msg: Msg, story: Transitions, task: ScrapeTask, tally: Tally, exc: PermanentError) -> None:
        """File the letter now: retrying cannot help."""
        await self.attempts.count(tally)
        history = await self.attempts.record(task.task_id, tally.seq, self._record(story.attempt, exc))
        await self._file(msg, story, task, tally.seq, history, exc, last=False)

    async def _file(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int,
                    history: tuple[AttemptRecord, ...], exc: BusscrapeError, *, last: bool) -> None:
        attempt = story.attempt
        # The attempts that reached the page (the ledger's count), not the records that survived.
        error = str(exc) if not last else f"gave up after {attempt} attempts; last: {exc}"
        letter = DeadLetter(task_id=task.task_id, stage="worker", reason=exc.reason, error=error[:4000],
                            url=task.url, host=filing.host_of(task.url), attempts=history, task=task,
                            source=filing.source_of(msg))
        try:
            await filing.file(self.bus.js, letter, msg_id=names.task_letter_id(task.task_id, seq),
                              telemetry=self.telemetry, limit=self.settings.streams.max_msg_size)
        except TRANSIENT as err:
            # Not filed, so not removed: try again later.
            log.warning("deadletter.unavailable", error=repr(err))
            await msg.nak(delay=self.retry_delay(1))
            return
        if msg.metadata.num_delivered > 1:  # this attempt's own objects too, should its clean-up have failed
            await self.results.sweep(task, seq, range(1, attempt + 1), keep=set())
        # Recorded before the ack, and the task kept until it is: `busscrape run` waits for this
        # record. A redelivery files the same letter again (deduplicated) and records again; the
        # last delivery's goes to the reaper, which does the same.
        if not await story.outcome("dead", attempt=len(history), reason=exc.reason, error=error[:500]):
            await msg.nak(delay=self.retry_delay(1))
            return
        await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        await self.attempts.clear(task.task_id, seq)
        self.count("dead")

    async def poison(self, msg: Msg, exc: MessageDecodeError) -> None:
        """A message that is not a task: its letter, then the ack."""
        letter = filing.poison("worker", msg, exc)
        seq = msg.metadata.sequence.stream
        try:
            await filing.file(self.bus.js, letter, msg_id=names.poison_letter_id(names.TASKS_STREAM, seq),
                              telemetry=self.telemetry, limit=self.settings.streams.max_msg_size)
        except TRANSIENT:
            await msg.nak(delay=self.retry_delay(1))
            return
        await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        self.count("poison")
