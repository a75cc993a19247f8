"""What a worker does with a task that failed: retry it later, or file its dead letter.

A nak carries no data and the next delivery may run on another host, so every failed attempt is
recorded in ATTEMPTS first (``attempts``). A retryable failure then naks the task with the
worker's backoff (at least what ``Retry-After`` asked); on the last allowed delivery, and for a
permanent failure at once, the task's dead letter is filed with the whole attempt history, the
objects its attempts stored are discarded, ``dead`` is recorded in STATUS, and only then is the
task acked. Each step that NATS does not take keeps the task (nak) for another go: the letter's
``Nats-Msg-Id`` makes a second filing a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog
from nats.aio.msg import Msg

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.retry import TRANSIENT, backoff, transient_or
from busscrape.deadletters import filing
from busscrape.errors import BusscrapeError, MessageDecodeError, PermanentError, RetryableError, ShuttingDown
from busscrape.model.messages import AttemptRecord, DeadLetter, ScrapeTask, utcnow
from busscrape.settings import Settings
from busscrape.status.records import Transitions
from busscrape.telemetry.metrics import Telemetry
from busscrape.worker.attempts import AttemptLog
from busscrape.worker.results import ResultPublisher

log = structlog.get_logger("busscrape.worker")


class DeliveriesExhausted(PermanentError):
    reason = "max_deliveries"


class Failures:
    """The retry and dead-letter paths of one worker."""

    def __init__(self, bus: Bus, settings: Settings, attempts: AttemptLog, results: ResultPublisher,
                 count: Callable[[str], None], telemetry: Telemetry | None = None) -> None:
        self.bus = bus
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

    async def retry(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int, exc: RetryableError) -> None:
        """Nak for another delivery, or file the letter when this was the last one."""
        attempt = story.attempt
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
                          seq: int) -> None:
        """The worker stopped while the task ran: its attempt is recorded (ATTEMPTS, and
        ``retrying`` in STATUS) before the service hands the message back, so its history says
        what happened to that delivery. Bounded: the way out must not hang on NATS."""
        exc = ShuttingDown(f"worker {self.settings.worker.name} stopped during the attempt; handed back to the queue")
        try:
            async with asyncio.timeout(5):
                with contextlib.suppress(Exception):
                    await running
                await self.attempts.record(task.task_id, seq, self._record(story.attempt, exc))
                await story.step("retrying", reason=exc.reason, error=str(exc))
        except transient_or(TimeoutError):
            log.warning("task.handed_back_unrecorded", reason=exc.reason)
            return
        log.info("task.handed_back", reason=exc.reason)

    async def exhausted(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int) -> None:
        """A delivery past the last attempt (deferrals left out): earlier deliveries died without
        an outcome (a worker killed each time). The worker files what the reaper would have, as the
        consumer's own ``max_deliver`` leaves room for deferrals."""
        history = await self.attempts.history(task.task_id, seq)
        last = history[-1] if history else None  # as the reaper files it (worker/reaper.py)
        what = f"last attempt: {last.error}" if last else "no attempt finished: each delivery's worker died"
        exc = DeliveriesExhausted(f"delivered {story.attempt - 1} times without an outcome (max_deliver "
                                  f"{self.max_deliver}, deferrals not counted); {what}",
                                  reason=last.reason if last else None)
        await self._file(msg, story, task, seq, history, exc, last=False)

    async def dead(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int, exc: PermanentError) -> None:
        """File the letter now: retrying cannot help."""
        history = await self.attempts.record(task.task_id, seq, self._record(story.attempt, exc))
        await self._file(msg, story, task, seq, history, exc, last=False)

    async def _file(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int,
                    history: tuple[AttemptRecord, ...], exc: BusscrapeError, *, last: bool) -> None:
        attempt = story.attempt
        error = str(exc) if not last else f"gave up after {len(history)} attempts; last: {exc}"
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
        if attempt > 1:  # this attempt's own objects too, should its clean-up have failed
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
