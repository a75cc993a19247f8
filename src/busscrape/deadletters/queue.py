"""Dead letters as an operator handles them: find, read, replay, delete (``busscrape dlq``).

Letters are read in place. DEADLETTER has limits retention, so reading takes nothing away (the
archivist keeps its own cursor). A scan goes through a short-lived ephemeral consumer (no acks,
memory storage, filtered by stage on the server) that streams the letters in batches, and stops
at the last sequence the stream held when the scan began: a task that a replay queues and that
dies again while the replay is still running is not picked up by the same replay.

Replay, per letter::

    the letter carries a task? ── no: a poison message, or an ingester letter (a result only) ──► skipped, why
      │
    purge ATTEMPTS <task_id>.*  ─►  STATUS: queued  ─►  publish the task to TASKS, await the PubAck
      (a clean history)            (written before a       (Nats-Msg-Id replay-<task_id>-<letter seq>)
                                    worker can say            │ refused ─► STATUS: dead again; the letter stays
                                    "running")                ▼
                                                  delete the letter from DEADLETTER

The replayed task is a new message in TASKS, so it starts with a fresh delivery count, and it
carries a new ``dispatched_at``: it is a new generation of the task (``taskstatus``). Its
``Nats-Msg-Id`` names the letter, not just the task: TASKS de-duplicates by that header for its
duplicate window, so a bare task id would swallow the replay of a task queued minutes earlier,
while a replay that crashed between PubAck and delete, run again inside the window, does not
queue the task twice.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext, api

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT
from busscrape.bus.scan import ScanStalled, remove, scan, scan_config
from busscrape.deadletters.filing import host_of
from busscrape.errors import MessageDecodeError
from busscrape.model.messages import DeadLetter, decode, encode, preview, utcnow
from busscrape.status.records import StatusBoard, TaskStatus
from busscrape.telemetry import tracing

log = structlog.get_logger("busscrape.dlq")

BATCH = 256  # letters per fetch of a scan
CLOCK_SKEW = 300.0  # how far a filer's clock may run ahead of the server's (dead_at vs. stream time)
UNREADABLE = "unreadable_letter"  # the reason shown for a DEADLETTER message that is no DeadLetter

Action = Literal["replayed", "would_replay", "skipped", "failed", "deleted", "would_delete", "missing"]


@dataclass(frozen=True)
class Entry:
    """One message of DEADLETTER: its place in the stream and the letter it holds."""

    seq: int
    subject: str
    stored_at: datetime
    """When the server stored it."""
    letter: DeadLetter | None
    """``None`` when the message is not a readable dead letter (``problem`` says why)."""
    problem: str | None = None
    payload: str | None = None
    """The start of an unreadable message."""

    @property
    def stage(self) -> str:
        return self.letter.stage if self.letter else (names.deadletter_stage_of(self.subject) or "?")

    @property
    def reason(self) -> str:
        return self.letter.reason if self.letter else UNREADABLE

    @property
    def url(self) -> str | None:
        return self.letter.url if self.letter else None

    @property
    def host(self) -> str | None:
        return (self.letter.host or host_of(self.letter.url)) if self.letter else None

    @property
    def task_id(self) -> str | None:
        return self.letter.task_id if self.letter else None

    @property
    def attempts(self) -> int:
        return len(self.letter.attempts) if self.letter else 0

    @property
    def dead_at(self) -> datetime:
        return self.letter.dead_at if self.letter else self.stored_at

    def age(self, now: datetime) -> float:
        return max((now - self.dead_at).total_seconds(), 0.0)

    def unreplayable(self) -> str | None:
        """Why this letter cannot be replayed, or ``None`` when it can."""
        if self.letter is None:
            return "not a readable dead letter: nothing to queue (`busscrape dlq show` has what it holds)"
        if self.letter.task is not None:
            return None
        if "task" in self.letter.truncated:
            return ("the task was too large to keep in its letter (it was cut to fit in one message); "
                    f"dispatch {self.letter.url} again with its options (busscrape dispatch --force)")
        if self.letter.result is not None:
            return ("an ingester letter: it carries the result, not the task; fix the cause, then dispatch "
                    "the URL again (busscrape dispatch --force)")
        if self.letter.payload is not None:
            return "a poison message: the payload was never a readable task, so there is nothing to queue"
        return "the letter carries no task"

    def summary(self, now: datetime) -> dict[str, Any]:
        """The fields ``dlq list`` shows, as plain JSON values."""
        return {"seq": self.seq, "subject": self.subject, "stage": self.stage, "reason": self.reason,
                "host": self.host, "url": self.url, "task_id": self.task_id, "attempts": self.attempts,
                "dead_at": self.dead_at.isoformat(), "age_seconds": round(self.age(now), 3),
                "replayable": self.unreplayable() is None,
                "error": self.letter.error if self.letter else self.problem}

    def document(self) -> dict[str, Any]:
        """The whole message, for ``dlq show --json``."""
        body: dict[str, Any] = {"seq": self.seq, "subject": self.subject, "stored_at": self.stored_at.isoformat()}
        if self.letter is not None:
            body["letter"] = self.letter.model_dump(mode="json")
        else:
            body.update(problem=self.problem, payload=self.payload)
        return body


def read_entry(seq: int, subject: str, stored_at: datetime, data: bytes | None) -> Entry:
    """An ``Entry`` from a stored message; an unreadable one is kept with the reason."""
    try:
        letter = decode(DeadLetter, data or b"")
    except MessageDecodeError as exc:
        return Entry(seq, subject, stored_at, None, problem=str(exc), payload=preview(data or b"", 4096))
    return Entry(seq, subject, stored_at, letter)


@dataclass(frozen=True)
class LetterFilter:
    """Which letters a command works on. Empty criteria match everything."""

    reasons: tuple[str, ...] = ()
    """Reason codes or globs (``http_5*``); a letter matching any one is selected."""
    hosts: tuple[str, ...] = ()
    """Hosts or globs (``*.example.com``), case-insensitive."""
    stages: tuple[str, ...] = ()
    """Stages that filed the letter; filtered by subject on the server."""
    older_than: float | None = None
    """Seconds: only letters at least this old (age = now - dead_at)."""
    newer_than: float | None = None
    """Seconds: only letters at most this old."""
    limit: int | None = None
    """At most this many letters, oldest first."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.stages) - set(names.DEADLETTER_STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {', '.join(unknown)}; stages are "
                             f"{', '.join(names.DEADLETTER_STAGES)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError("the limit must be at least 1")

    @property
    def narrows(self) -> bool:
        """Whether any criterion is set (replay and purge want an explicit selection)."""
        return bool(self.reasons or self.hosts or self.stages or self.limit is not None
                    or self.older_than is not None or self.newer_than is not None)

    def subjects(self) -> list[str]:
        return [names.deadletter_stage_subjects(s) for s in self.stages] or [names.DEADLETTER_SUBJECTS]

    def matches(self, entry: Entry, now: datetime) -> bool:
        if self.stages and entry.stage not in self.stages:
            return False
        if self.reasons and not any(fnmatch.fnmatchcase(entry.reason, r) for r in self.reasons):
            return False
        if self.hosts:
            host = (entry.host or "").lower()
            if not host or not any(fnmatch.fnmatchcase(host, h.lower()) for h in self.hosts):
                return False
        age = entry.age(now)
        if self.older_than is not None and age < self.older_than:
            return False
        return self.newer_than is None or age <= self.newer_than


@dataclass(frozen=True)
class Outcome:
    """What a command did with one letter."""

    seq: int
    action: Action
    detail: str | None = None
    entry: Entry | None = None
    task_seq: int | None = None
    """Where a replayed task now sits in TASKS."""

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"seq": self.seq, "action": self.action, "detail": self.detail}
        if self.entry is not None:
            doc.update(stage=self.entry.stage, reason=self.entry.reason, task_id=self.entry.task_id,
                       url=self.entry.url)
        if self.task_seq is not None:
            doc["task_seq"] = self.task_seq
        return doc


class DeadLetterQueue:
    """Reads, replays and deletes the letters in DEADLETTER."""

    def __init__(self, js: JetStreamContext, *, request_timeout: float = 10.0) -> None:
        self.js = js
        self.timeout = request_timeout
        self.board = StatusBoard(js)

    async def get(self, seq: int) -> Entry | None:
        try:
            raw = await self.js.get_msg(names.DEADLETTER_STREAM, seq)
        except nats.js.errors.NotFoundError:
            return None
        return read_entry(seq, raw.subject or "", raw.time or utcnow(), raw.data)

    async def select(self, seqs: Iterable[int], flt: LetterFilter) -> AsyncGenerator[tuple[int, Entry | None], None]:
        """``(seq, entry)`` for each named sequence (entry ``None`` when there is no letter there)
        that passes ``flt``; without sequences, every letter ``flt`` selects, oldest first.
        Use inside ``contextlib.aclosing`` so that a scan's consumer is removed on an early exit."""
        wanted = list(seqs)
        if not wanted:
            async with contextlib.aclosing(self.scan(flt)) as entries:
                async for letter in entries:
                    yield letter.seq, letter
            return
        now, found = utcnow(), 0
        for seq in wanted:
            entry = await self.get(seq)
            if entry is not None and not flt.matches(entry, now):
                continue
            yield seq, entry
            found += 1
            if flt.limit is not None and found >= flt.limit:
                return

    async def scan(self, flt: LetterFilter, *, start_seq: int | None = None) -> AsyncGenerator[Entry, None]:
        """The letters ``flt`` selects, oldest first, up to the stream's last sequence at the start.

        ``start_seq`` starts later (``status`` reads only the newest letters). Use inside
        ``contextlib.aclosing``.
        """
        now = utcnow()
        state = (await self.js.stream_info(names.DEADLETTER_STREAM)).state
        if state.messages == 0:
            return
        filters = flt.subjects()
        config = scan_config(deliver_policy=api.DeliverPolicy.ALL)
        config = config.evolve(filter_subject=filters[0]) if len(filters) == 1 else config.evolve(
            filter_subjects=filters)
        if start_seq is not None:
            config = config.evolve(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
        elif flt.newer_than is not None:
            # The server stores a letter just after its filer stamps dead_at, so starting at the cutoff
            # (less the clock skew between hosts) skips old letters without missing a new one.
            since = now - timedelta(seconds=flt.newer_than + CLOCK_SKEW)
            config = config.evolve(deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=since)
        found = 0
        letters = scan(self.js, names.DEADLETTER_STREAM, config, batch=BATCH, timeout=self.timeout)
        try:
            async with contextlib.aclosing(letters) as msgs:
                async for msg in msgs:
                    meta = msg.metadata
                    if meta.sequence.stream > state.last_seq:
                        return
                    entry = read_entry(meta.sequence.stream, msg.subject, meta.timestamp, msg.data)
                    if not flt.matches(entry, now):
                        continue
                    yield entry
                    found += 1
                    if flt.limit is not None and found >= flt.limit:
                        return
        except ScanStalled as exc:
            log.warning("dlq.scan_stalled", error=str(exc))

    async def replay(self, entry: Entry, *, dry_run: bool = False) -> Outcome:
        """Queue the letter's task again, then delete the letter (see the module docstring)."""
        why = entry.unreplayable()
        if why is not None:
            if not dry_run:
                log.info("dlq.replay_skipped", seq=entry.seq, stage=entry.stage, reason=entry.reason, why=why)
            return Outcome(entry.seq, "skipped", why, entry)
        if dry_run:
            return Outcome(entry.seq, "would_replay", None, entry)
        letter = entry.letter
        assert letter is not None and letter.task is not None
        task = letter.task.model_copy(update={"dispatched_at": utcnow()})
        await self._clear_attempts(task.task_id)
        await self.board.record(TaskStatus(task_id=task.task_id, state="queued", url=task.url,
                                           dispatched_at=task.dispatched_at, reason="replayed"))
        headers = {names.MSG_ID: names.replay_msg_id(task.task_id, entry.seq),
                   names.TRACEPARENT: tracing.new_traceparent()}
        try:
            ack = await self.js.publish(names.task_subject(task.task_id), encode(task),
                                        stream=names.TASKS_STREAM, headers=headers, timeout=self.timeout)
        except TRANSIENT as exc:
            # Not queued: the letter stays, and STATUS goes back to what is true.
            await self.board.record(TaskStatus(task_id=task.task_id, state="dead", url=task.url,
                                               dispatched_at=letter.task.dispatched_at, reason=letter.reason,
                                               error=f"replay failed: {exc!r}"[:500]))
            log.warning("dlq.replay_failed", seq=entry.seq, task_id=task.task_id, error=repr(exc))
            return Outcome(entry.seq, "failed", f"TASKS did not take the task ({exc!r}); the letter stays", entry)
        try:
            await remove(self.js, names.DEADLETTER_STREAM, entry.seq)  # False: a concurrent replay or purge did
        except TRANSIENT as exc:
            log.warning("dlq.letter_kept", seq=entry.seq, task_id=task.task_id, error=repr(exc))
            return Outcome(entry.seq, "failed", (
                f"queued again (TASKS seq {ack.seq}) but the letter could not be deleted ({exc!r}); "
                "replaying it again inside the duplicate window does not queue it twice"), entry, ack.seq)
        log.info("dlq.replayed", seq=entry.seq, task_id=task.task_id, task_seq=ack.seq, duplicate=bool(ack.duplicate),
                 stage=entry.stage, reason=entry.reason, url=task.url)
        detail = "already queued by an earlier replay of this letter" if ack.duplicate else None
        return Outcome(entry.seq, "replayed", detail, entry, ack.seq)

    async def delete(self, entry: Entry, *, dry_run: bool = False) -> Outcome:
        """Remove one letter for good."""
        if dry_run:
            return Outcome(entry.seq, "would_delete", None, entry)
        if not await remove(self.js, names.DEADLETTER_STREAM, entry.seq):
            return Outcome(entry.seq, "missing", "already gone", entry)
        log.info("dlq.deleted", seq=entry.seq, stage=entry.stage, reason=entry.reason, task_id=entry.task_id)
        return Outcome(entry.seq, "deleted", None, entry)

    async def _clear_attempts(self, task_id: str) -> None:
        """Drop every attempt record of the task (any generation), so the replay starts clean.

        Runs before the task is queued: afterwards a worker may already be recording attempt 1.
        """
        subject = names.kv_subject(names.ATTEMPTS_BUCKET, f"{task_id}.>")
        try:
            await self.js.purge_stream(names.ATTEMPTS_STREAM, subject=subject)
        except TRANSIENT as exc:  # history is advisory: a leftover never blocks a replay
            log.warning("dlq.attempts_not_cleared", task_id=task_id, error=repr(exc))
