"""The reaper: tasks that ran out of deliveries without an outcome go to DEADLETTER.

When a worker dies (or goes silent) on a task's last allowed delivery, nobody is left to
dead-letter it: JetStream keeps the message in TASKS but stops delivering it, and publishes a
MAX_DELIVERIES advisory, which TASK_ADVISORIES captures. The reaper (a companion of every
worker, all sharing one durable consumer) turns each advisory into a dead letter carrying the
attempt history, discards the artifacts those deliveries stored (``leftovers``), records the
task ``dead`` in STATUS, then deletes the task from TASKS, then acks the advisory — in that
order, so a crash or a lost record at any point repeats the work idempotently (same
``Nats-Msg-Id`` as the worker would use). A task whose last delivery did finish (its result is in
RESULTS, or STATUS records its outcome, and the worker died before the ack) gets no letter: it is
removed from TASKS as done, so STATUS never goes from ``archived`` to ``dead``. A crawl page
among those may have died before its links were followed: the reaper follows them (from the
links kept before the result), or gives them up (``Frontier.give_up``: the page record says
``follow_failed``, the budget slots it held go back), so the crawl still ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import nats.js.errors
import orjson
import structlog
from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg

from busscrape.artifacts import leftovers
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService
from busscrape.bus.retry import transient_or
from busscrape.bus.scan import remove
from busscrape.deadletters import filing
from busscrape.errors import MessageDecodeError, RetryableError, StorageUnavailable
from busscrape.model.messages import DeadLetter, MessageSource, ScrapeTask, decode
from busscrape.status.records import FINAL, StatusBoard, TaskStatus
from busscrape.status.standing import standing_results
from busscrape.telemetry.metrics import Telemetry
from busscrape.worker.attempts import AttemptLog

if TYPE_CHECKING:
    from busscrape.crawl.frontier import Frontier

log = structlog.get_logger("busscrape.reaper")

class Reaper(PullService):
    """Runs beside each worker (a companion), on ``TASK_ADVISORIES/reaper``."""

    kind = "reaper"
    stream = names.ADVISORIES_STREAM
    durable = names.REAPER_CONSUMER

    def __init__(self, bus: Bus, attempts: AttemptLog, artifacts: ArtifactStore, *, grace_period: float = 30.0,
                 telemetry: Telemetry | None = None, frontier: Callable[[], Frontier] | None = None) -> None:
        # Advisories are rare (a worker died on a last delivery): one slot; a failed reap comes back
        # after 5 s, then later, while NATS is away.
        super().__init__(bus, concurrency=1, grace_period=grace_period, backoff=(5.0, 60.0),
                         telemetry=telemetry)
        self.attempts = attempts
        self.board = StatusBoard(bus.js)
        self.artifacts = artifacts
        self._frontier = frontier
        """The worker's frontier, made on first use (for the links of a crawl page that finished)."""

    async def handle(self, msg: Msg) -> None:
        try:
            await self.reap(msg)
        except transient_or(StorageUnavailable, MessageDecodeError) as exc:
            await self.retry_later(msg, exc, "reaper.retry_later")

    async def reap(self, advisory: Msg) -> None:
        try:
            event = orjson.loads(advisory.data)
            seq = int(event["stream_seq"])
            deliveries = int(event.get("deliveries", 0))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("reaper.bad_advisory", data=advisory.data[:200])
            await advisory.ack_sync()
            return
        js = self.bus.js
        try:
            raw = await js.get_msg(names.TASKS_STREAM, seq)
        except nats.js.errors.NotFoundError:
            await advisory.ack_sync()  # already handled (acked or dead-lettered in the meantime)
            return
        letter, msg_id = await self._letter(raw, seq, deliveries)
        if letter is None:
            return await self._finished(advisory, raw, seq, deliveries)
        await filing.file(js, letter, msg_id=msg_id, telemetry=self.telemetry,
                          limit=self.bus.settings.streams.max_msg_size)
        if letter.task is not None:  # what the deliveries that died stored, nothing will archive
            await leftovers.sweep(js, self.artifacts, letter.task, seq, range(1, max(deliveries, 1) + 1))
        # `busscrape run` waits for the `dead` record: until it is stored, the task stays in TASKS
        # and the advisory comes back (filing again is deduplicated by the letter's msg id).
        if letter.task_id and not await self.board.record(TaskStatus(
                task_id=letter.task_id, state="dead", url=letter.url, reason=letter.reason, error=letter.error[:500],
                dispatched_at=letter.task.dispatched_at if letter.task else None, attempt=deliveries)):
            await self.retry_later(advisory, "STATUS did not take the dead record", "reaper.status_unrecorded")
            return
        await self._remove(seq, letter.task_id)
        await advisory.ack_sync()
        self.count("reaped")
        log.warning("reaper.reaped", task_id=letter.task_id, seq=seq, deliveries=deliveries)

    async def _letter(self, raw: RawStreamMsg, seq: int, deliveries: int) -> tuple[DeadLetter | None, str]:
        """The letter the task gets and its msg id; no letter when the task is in fact done (its
        last delivery stored the result, or the ingester archived it, before it died)."""
        source = MessageSource(stream=names.TASKS_STREAM, subject=raw.subject or "", seq=seq)
        try:
            task = decode(ScrapeTask, raw.data or b"")
        except MessageDecodeError as exc:
            return DeadLetter(stage="reaper", reason=exc.reason, error=str(exc),
                              payload=(raw.data or b"")[:4096].decode("utf-8", "replace"),
                              source=source), names.poison_letter_id(names.TASKS_STREAM, seq)
        if await self._done(task, seq):
            return None, ""
        history = await self.attempts.history(task.task_id, seq)
        ledger = await self.attempts.ledger(task.task_id, seq)  # unanswered: the reap waits for later
        # The consumer's max_deliver ran out on a delivery whose worker died: its deliveries, told
        # as they were (how many reached the page, failed, died, met outages, were deferred).
        return DeadLetter(
            task_id=task.task_id, stage="reaper", reason="max_deliveries",
            error=f"out of deliveries (the consumer's max_deliver) without an outcome: "
                  f"{ledger.story(history, deliveries)}"[:4000], url=task.url,
            host=filing.host_of(task.url), attempts=history, task=task, source=source,
        ), names.task_letter_id(task.task_id, seq)

    async def _done(self, task: ScrapeTask, seq: int) -> bool:
        """Whether the task's outcome is recorded for this dispatch, or a result of it stands in
        RESULTS (asked of the leader). When RESULTS does not answer, the reap waits for later."""
        found = await self.board.latest(task.task_id)
        if found is not None and found[0].state in FINAL and found[0].dispatched_at == task.dispatched_at:
            return True
        standing = await standing_results(self.bus.js, task.task_id, seq)
        if standing is None:
            raise StorageUnavailable("RESULTS did not answer whether the task's result is stored")
        return bool(standing)

    async def _finished(self, advisory: Msg, raw: RawStreamMsg, seq: int, deliveries: int) -> None:
        """The task is done: what its attempts left is cleaned up, and it leaves TASKS unreported."""
        task = decode(ScrapeTask, raw.data or b"")
        if task.crawl is not None:
            await self._links(task)
        await leftovers.sweep(self.bus.js, self.artifacts, task, seq, range(1, max(deliveries, 1) + 1))
        await self._remove(seq, task.task_id)
        await advisory.ack_sync()
        self.count("finished")
        log.info("reaper.finished", task_id=task.task_id, seq=seq, deliveries=deliveries)

    async def _links(self, task: ScrapeTask) -> None:
        """Follow a finished crawl page's links, or give them up: its last delivery died before
        (no delivery will come again to do it). NATS not answering: the advisory comes back."""
        if self._frontier is None:
            raise StorageUnavailable("this reaper has no frontier to follow a crawl page's links with")
        frontier = self._frontier()
        try:
            if await frontier.follow(task):
                return
            why: Exception = RetryableError("no links were kept for the page before its last delivery died",
                                            reason="links_not_kept")
        except StorageUnavailable:
            raise  # CRAWLS not answering: the advisory comes back
        except RetryableError as exc:  # robots.txt of a linked host unreachable: the page had its chances
            why = exc
        await frontier.give_up(task, why)

    async def _remove(self, seq: int, task_id: str | None) -> None:
        await remove(self.bus.js, names.TASKS_STREAM, seq)  # False: acked or reaped meanwhile
        if task_id:
            await self.attempts.clear(task_id, seq)
