"""Filing: every dead letter fits in one DEADLETTER message, whatever it embeds (real nats-server)."""

from __future__ import annotations

from busscrape.bus import names
from busscrape.deadletters import filing
from busscrape.deadletters.queue import Entry
from busscrape.model.bounds import TRUNCATED
from busscrape.model.messages import AttemptRecord, DeadLetter, ScrapeTask, decode, task_key, utcnow
from tests.support.bus import dead_letters, stream_messages


def task_near_the_limit(limit: int) -> ScrapeTask:
    """A task that itself fits in TASKS with under 1 KB to spare (its labels make it large)."""
    url = "http://127.0.0.2:8000/page"
    base = ScrapeTask(task_id=task_key(url), url=url, original_url=url, labels={"blob": ""})
    room = limit - len(base.model_dump_json()) - 600
    return base.model_copy(update={"labels": {"blob": "x" * room}})


async def test_a_letter_for_a_task_near_the_size_limit_is_cut_to_fit_and_says_so(applied, settings):
    limit = settings.streams.max_msg_size
    task = task_near_the_limit(limit)
    await applied.js.publish(names.task_subject(task.task_id), task.model_dump_json().encode())  # TASKS takes it
    attempts = tuple(AttemptRecord(attempt=n, worker="w1", at=utcnow(), reason="timeout", error="e" * 3000,
                                   retryable=True) for n in range(1, 6))
    letter = DeadLetter(task_id=task.task_id, stage="worker", reason="timeout", error="gave up: " + "e" * 3000,
                        url=task.url, host="127.0.0.2", attempts=attempts, task=task)
    await filing.file(applied.js, letter, msg_id="near-limit", limit=limit)

    [filed] = await dead_letters(applied.js)
    [raw] = await stream_messages(applied.js, names.DEADLETTER_STREAM)
    assert len(raw.data) <= limit
    # The references stay: task id, URL, reason, the last attempt; what was cut is named.
    assert (filed.task_id, filed.url, filed.reason) == (task.task_id, task.url, "timeout")
    assert filed.truncated and filed.truncated[-1] in ("task", "attempts") and filed.task is None
    assert filed.attempts and filed.attempts[-1].attempt == 5
    assert filed.error.endswith(TRUNCATED)
    entry = Entry(seq=raw.seq, subject=raw.subject, stored_at=utcnow(), letter=decode(DeadLetter, raw.data))
    assert "too large to keep" in (entry.unreplayable() or "")


async def test_a_letter_that_fits_is_filed_whole(applied, settings):
    url = "http://127.0.0.2:8000/ok"
    task = ScrapeTask(task_id=task_key(url), url=url, original_url=url)
    letter = DeadLetter(task_id=task.task_id, stage="worker", reason="http_404", error="HTTP 404", url=url, task=task)
    await filing.file(applied.js, letter, msg_id="whole", limit=settings.streams.max_msg_size)
    [filed] = await dead_letters(applied.js)
    assert filed == letter and filed.truncated == ()
