"""Following a set of tasks to their end through the STATUS bucket (``busscrape run``).

The tracker is told which task ids to wait for, and since when (a task id can have older
generations whose outcome must not count). It watches STATUS — the latest record of every
key, then every new one — and keeps the latest state of each expected task, so the run can
show live counts and know when every task is archived or dead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from datetime import datetime

import structlog
from nats.js import JetStreamContext

from busscrape.bus.kv_watch import KvWatch
from busscrape.bus.names import SEEN_STREAM, STATUS_BUCKET, seen_key_subject
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import ScrapeTask, decode
from busscrape.status.records import FINAL, TaskStatus

log = structlog.get_logger("busscrape.tracker")


class Tracker:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self.expected: dict[str, datetime | None] = {}
        """task id -> the earliest time an outcome may carry to count (None: any)."""
        self.state: dict[str, str] = {}
        self.final: dict[str, TaskStatus] = {}
        self._early: dict[str, TaskStatus] = {}
        self._changed = asyncio.Event()
        self._watch = KvWatch(self._entry, name="status-watch")
        self._lookups: set[asyncio.Task[None]] = set()
        self.listeners: list[Callable[[TaskStatus], None]] = []
        """Called with each expected task's outcome, once (``dataset.pages.PageFeed``)."""

    # -- what to wait for -------------------------------------------------------------------

    def expect(self, task_id: str, since: datetime | None) -> None:
        """Wait for ``task_id``'s outcome, counting only records at or after ``since``."""
        self.expected[task_id] = since
        self.state.setdefault(task_id, "queued")
        early = self._early.pop(task_id, None)
        if early is not None:
            self._see(early)
        self._changed.set()

    def expect_existing(self, task_id: str) -> None:
        """A task queued by an earlier run: its generation is the one SEEN holds now."""
        self.state.setdefault(task_id, "queued")
        task = asyncio.create_task(self._from_seen(task_id))
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _from_seen(self, task_id: str) -> None:
        since = None
        with contextlib.suppress(*TRANSIENT, MessageDecodeError):
            raw = await self._js.get_last_msg(SEEN_STREAM, seen_key_subject(task_id))
            since = decode(ScrapeTask, raw.data or b"").dispatched_at
        self.expect(task_id, since)

    # -- watching ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._watch.start(await self._js.key_value(STATUS_BUCKET))

    async def stop(self) -> None:
        for task in list(self._lookups):
            task.cancel()
        await self._watch.stop()

    def _entry(self, key: str, value: bytes) -> None:
        try:
            status = decode(TaskStatus, value)
        except MessageDecodeError as exc:
            log.warning("tracker.bad_status", key=key, error=str(exc))
            return
        self._see(status)

    def _see(self, status: TaskStatus) -> None:
        task_id = status.task_id
        if task_id not in self.expected:
            # Seen before the dispatcher said it published it: keep it for when it does.
            if task_id in self.state or len(self._early) < 100_000:
                self._early[task_id] = status
            return
        since = self.expected[task_id]
        if since is not None and status.at < since:
            return  # an older generation of the same task id
        if task_id in self.final:
            return
        self.state[task_id] = status.state
        if status.state in FINAL:
            self.final[task_id] = status
            for listener in self.listeners:
                listener(status)
        self._changed.set()

    # -- progress ---------------------------------------------------------------------------

    def counts(self) -> Counter[str]:
        return Counter(self.state[t] for t in self.expected)

    @property
    def done(self) -> bool:
        return not self._lookups and all(t in self.final for t in self.expected)

    def poke(self) -> None:
        """Wake ``changed()``: something beside STATUS moved (a crawl's page record)."""
        self._changed.set()

    async def changed(self, timeout: float) -> None:
        """Return after the next change, or after ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        self._changed.clear()
