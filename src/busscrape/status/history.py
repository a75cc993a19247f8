"""What happened to a task: its STATUS records and its SEEN entry, merged into one story.

STATUS holds every transition the services record (running with the attempt, retrying with
the last error, rendered, archived with the archive location, dead with the reason). "Queued"
is not written there by the dispatcher: the atomic create of the task's key in SEEN *is* the
enqueue (one publish per URL at 20k URLs/s; a second one would halve the dispatcher), and that
entry holds the task with its ``dispatched_at``. So a history is read from both and merged:

- the records are grouped into *generations* by ``dispatched_at`` (a recrawl, ``dispatch
  --force`` or ``dlq replay`` queues the same task id again, with a new ``dispatched_at``);
- each generation opens with a ``queued`` event: the one ``dlq replay`` recorded, else the
  SEEN entry's own time when SEEN holds that generation, else the ``dispatched_at`` itself;
- within a generation events are in time order, except that an outcome (archived, dead) comes
  last: records are stamped by the service that makes them, and the ingester's clock may run a
  moment behind the worker's (STATUS itself keeps them in order: see ``taskstatus``).

A URL is looked up by its task id, computed exactly as the dispatcher does
(``dispatch.identity``), so ``busscrape task URL`` finds what ``busscrape dispatch`` queued for
that line (with the given steps and options, the defaults unless said).
"""

from __future__ import annotations

import re
from datetime import datetime

import nats.js.errors
from nats.js import JetStreamContext
from pydantic import BaseModel, ConfigDict

from busscrape.bus import names
from busscrape.bus.names import SEEN_STREAM, seen_key_subject
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import ScrapeTask, decode
from busscrape.status.records import FINAL, State, StatusBoard, TaskStatus

TASK_ID = re.compile(r"^[0-9a-f]{32}$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class HistoryEvent(_Model):
    """One step of a task's story."""

    state: State
    at: datetime
    attempt: int | None = None
    worker: str | None = None
    status: int | None = None
    """HTTP status of the page (rendered, archived)."""
    reason: str | None = None
    error: str | None = None
    archive: str | None = None
    """Where the page's folder is (archived)."""
    source: str = "status"
    """``status`` (a STATUS record), ``seen`` (the SEEN entry's time) or ``dispatch`` (its dispatched_at)."""


_RECORDED = set(HistoryEvent.model_fields) - {"source"}  # what a STATUS record says about the event


class Generation(_Model):
    """One dispatch of the task id and everything that followed it."""

    dispatched_at: datetime | None
    state: State
    events: tuple[HistoryEvent, ...]


class TaskHistory(_Model):
    """Every generation of a task, oldest first; ``state`` is the newest one's."""

    task_id: str
    url: str | None
    state: State
    generations: tuple[Generation, ...]


def merge(task_id: str, records: list[TaskStatus], seen: ScrapeTask | None = None,
          seen_at: datetime | None = None) -> TaskHistory | None:
    """The story of ``task_id`` from its STATUS records and its SEEN entry (None: nothing known)."""
    if not records and seen is None:
        return None
    groups: dict[datetime | None, list[HistoryEvent]] = {}
    if seen is not None:
        groups[seen.dispatched_at] = []
    starts = sorted({r.dispatched_at for r in records if r.dispatched_at} | {k for k in groups if k is not None})
    for record in sorted(records, key=lambda r: r.at):
        key = record.dispatched_at
        if key is None:
            # A record without its generation (from an older writer): the latest dispatch before it.
            key = max((d for d in starts if d is not None and d <= record.at), default=None)
        groups.setdefault(key, []).append(_event(record))
    generations = []
    for dispatched_at, events in sorted(groups.items(), key=lambda item: (item[0] is not None, item[0])):
        if dispatched_at is not None and not any(e.state == "queued" for e in events):
            from_seen = seen is not None and seen.dispatched_at == dispatched_at and seen_at is not None
            events.append(HistoryEvent(state="queued", at=seen_at if from_seen else dispatched_at,  # type: ignore[arg-type]
                                       source="seen" if from_seen else "dispatch"))
        ordered = tuple(sorted(events, key=_order))
        generations.append(Generation(dispatched_at=dispatched_at, state=ordered[-1].state, events=ordered))
    url = seen.url if seen is not None else next((r.url for r in reversed(records) if r.url), None)
    return TaskHistory(task_id=task_id, url=url, state=generations[-1].state, generations=tuple(generations))


def _event(record: TaskStatus) -> HistoryEvent:
    return HistoryEvent(**record.model_dump(include=_RECORDED))


def _order(event: HistoryEvent) -> tuple[int, datetime]:
    """Queued first, outcomes last, the rest by time."""
    rank = 0 if event.state == "queued" else 2 if event.state in FINAL else 1
    return rank, event.at


class HistoryReader:
    """Reads histories from STATUS and SEEN."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._board = StatusBoard(js)

    async def read(self, task_id: str) -> TaskHistory | None:
        """The task's history; None when neither bucket knows it."""
        records = await self._board.history(task_id)
        seen, seen_at = await self._seen(task_id)
        return merge(task_id, records, seen, seen_at)

    async def _seen(self, task_id: str) -> tuple[ScrapeTask | None, datetime | None]:
        try:
            raw = await self._js.get_last_msg(SEEN_STREAM, seen_key_subject(task_id))
        except nats.js.errors.NotFoundError:
            return None, None
        headers = raw.headers or {}
        if headers.get(names.KV_OPERATION) in ("DEL", "PURGE") or names.MARKER_REASON in headers:
            return None, None  # deleted, or expired (a TTL marker): the recrawl window has passed
        try:
            return decode(ScrapeTask, raw.data or b""), raw.time
        except MessageDecodeError:
            return None, None

