"""``busscrape dlq`` against a real nats-server (and, end to end, a real worker, Chromium and ingester)."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
from datetime import timedelta

import orjson
import pytest
from aiohttp import web
from nats.js.errors import NoKeysError

from busscrape.archive.storage import open_storage
from busscrape.bus import names
from busscrape.deadletters import filing
from busscrape.ingest.daemon import Ingester
from busscrape.model.messages import (
    AttemptRecord,
    DeadLetter,
    MessageSource,
    ScrapeResult,
    ScrapeTask,
    decode,
    task_key,
    utcnow,
)
from busscrape.status.records import StatusBoard
from busscrape.worker.attempts import AttemptLog, attempts_key
from tests.ops.test_overview import busscrape
from tests.support.bus import count, dead_letters, enqueue, stream_messages
from tests.support.hostile_text import HOSTILE, shown_safely
from tests.worker.test_daemon import run_worker


def task_for(url: str) -> ScrapeTask:
    return ScrapeTask(task_id=task_key(url), url=url, original_url=url,
                      dispatched_at=utcnow() - timedelta(days=1))


async def file(js, letter: DeadLetter, msg_id: str) -> int:
    """File ``letter`` as a stage would, and return its DEADLETTER sequence."""
    await filing.file(js, letter, msg_id=msg_id)
    return (await js.stream_info(names.DEADLETTER_STREAM)).state.last_seq


@pytest.fixture
async def letters(applied) -> dict[str, int]:
    """Six DEADLETTER messages of every kind, by name -> sequence."""
    js, now = applied.js, utcnow()
    a, b, c = (task_for(f"http://127.0.0.{h}:8000/{p}") for h, p in ((2, "gone"), (3, "flaky"), (2, "silent")))
    history = tuple(AttemptRecord(attempt=n, worker="w1", at=now - timedelta(minutes=10 - n), reason="http_500",
                                  error=f"HTTP 500 on attempt {n}", retryable=True, status=500) for n in (1, 2, 3))
    seqs = {
        "old_404": await file(js, DeadLetter(
            task_id=a.task_id, stage="worker", reason="http_404", error="HTTP 404", url=a.url, host="127.0.0.2",
            attempts=history[:1], task=a, source=MessageSource(stream="TASKS", subject="x", seq=11),
            dead_at=now - timedelta(hours=3)), "l1"),
        "recent_500": await file(js, DeadLetter(
            task_id=b.task_id, stage="worker", reason="http_500", error="gave up after 3 attempts", url=b.url,
            host="127.0.0.3", attempts=history, task=b, source=MessageSource(stream="TASKS", subject="x", seq=12),
            dead_at=now - timedelta(minutes=10)), "l2"),
        "reaped": await file(js, DeadLetter(
            task_id=c.task_id, stage="reaper", reason="max_deliveries", error="no outcome", url=c.url,
            host="127.0.0.2", task=c), "l3"),
        "poison": await file(js, DeadLetter(stage="worker", reason="not_json", error="not JSON", payload="{oops"),
                             "l4"),
        "ingester": await file(js, DeadLetter(
            task_id=a.task_id, stage="ingester", reason="artifact_unusable", error="expired", url=a.url,
            host="127.0.0.2", result=ScrapeResult(task_id=a.task_id, task_seq=11, url=a.url, original_url=a.url,
                                                  final_url=a.url, worker="w1", attempt=1, scraped_at=now)), "l5"),
    }
    await js.publish(names.deadletter_subject("dispatch", "junk"), b"\x00 not a letter")
    seqs["unreadable"] = (await js.stream_info(names.DEADLETTER_STREAM)).state.last_seq
    return seqs


async def seqs_of(js) -> set[int]:
    return {m.seq for m in await stream_messages(js, names.DEADLETTER_STREAM)}


@pytest.mark.slow  # eleven CLI processes at once: ~25 s on two loaded cores
async def test_list_filters_select_the_right_letters(applied, settings, letters):
    cases = {
        (): set(letters),
        ("--reason", "http_*"): {"old_404", "recent_500"},
        ("--reason", "http_404", "--reason", "max_*"): {"old_404", "reaped"},
        ("--host", "127.0.0.2"): {"old_404", "reaped", "ingester"},
        ("--host", "127.0.0.*", "--stage", "worker"): {"old_404", "recent_500"},
        ("--stage", "worker"): {"old_404", "recent_500", "poison"},
        ("--older-than", "1h"): {"old_404"},
        ("--newer-than", "30m"): {"recent_500", "reaped", "poison", "ingester", "unreadable"},
        ("--newer-than", "1h", "--older-than", "5m"): {"recent_500"},
        ("--stage", "worker", "--newer-than", "1h"): {"recent_500", "poison"},
        ("--limit", "2"): {"old_404", "recent_500"},
    }
    listing_started = utcnow()
    procs = await asyncio.gather(*(busscrape(settings.nats.url, "dlq", "list", "--json", *args) for args in cases))
    listing_done = utcnow()
    for (args, expected), proc in zip(cases.items(), procs, strict=True):
        assert proc.returncode == 0, proc.stderr
        rows = [orjson.loads(line) for line in proc.stdout.splitlines()]
        assert {r["seq"] for r in rows} == {letters[name] for name in expected}, args
    everything = [orjson.loads(line) for line in procs[0].stdout.splitlines()]
    assert [r["seq"] for r in everything] == sorted(letters.values())  # oldest first
    by_seq = {r["seq"]: r for r in everything}
    assert by_seq[letters["recent_500"]]["attempts"] == 3 and by_seq[letters["recent_500"]]["replayable"]
    # dead 10 minutes before the fixture's clock: its age as listed lies between the ages at the
    # start and at the end of the listing (however long the CLI processes took to start)
    recent_dead_at = decode(DeadLetter, (await applied.js.get_msg(names.DEADLETTER_STREAM,
                                                                  letters["recent_500"])).data).dead_at
    age = by_seq[letters["recent_500"]]["age_seconds"]
    assert int((listing_started - recent_dead_at).total_seconds()) - 1 <= age
    assert age <= (listing_done - recent_dead_at).total_seconds() + 1
    assert by_seq[letters["unreadable"]]["reason"] == "unreadable_letter"
    assert by_seq[letters["unreadable"]]["stage"] == "dispatch"

    table = await busscrape(settings.nats.url, "dlq", "list", "--reason", "http_*")
    assert table.returncode == 0, table.stderr
    assert "2 dead letters" in table.stdout and "http://127.0.0.3:8000/flaky" in table.stdout
    assert "3h00m" in table.stdout and "max_deliveries" not in table.stdout

    bad = await busscrape(settings.nats.url, "dlq", "list", "--stage", "printer")
    assert bad.returncode == 2 and "unknown stage(s) printer" in bad.stderr


async def test_show_prints_the_whole_letter_with_its_attempt_history(applied, settings, letters):
    url = settings.nats.url
    shown, as_json, poison, missing = await asyncio.gather(
        busscrape(url, "dlq", "show", str(letters["recent_500"])),
        busscrape(url, "dlq", "show", str(letters["recent_500"]), "--json"),
        busscrape(url, "dlq", "show", str(letters["poison"])),
        busscrape(url, "dlq", "show", "999"))
    assert shown.returncode == 0, shown.stderr
    for text in ("http_500", "gave up after 3 attempts", "attempts", "HTTP 500 on attempt 1", "HTTP 500 on attempt 3",
                 "http://127.0.0.3:8000/flaky", "TASKS seq 12", "possible", '"original_url"'):
        assert text in shown.stdout, text
    doc = orjson.loads(as_json.stdout)
    assert doc["seq"] == letters["recent_500"] and doc["subject"].startswith("busscrape.deadletter.worker.")
    assert [a["attempt"] for a in doc["letter"]["attempts"]] == [1, 2, 3] and doc["letter"]["task"]["url"]
    assert "a poison message" in poison.stdout and "{oops" in poison.stdout
    assert missing.returncode == 1 and "no dead letter at seq 999" in missing.stderr


async def test_purge_refuses_without_confirmation_off_a_terminal_and_deletes_with_yes(applied, settings, letters):
    url, js = settings.nats.url, applied.js
    refused = await busscrape(url, "dlq", "purge", "--reason", "http_*")
    assert refused.returncode == 2 and "add --yes" in refused.stderr and "2 dead letters" in refused.stderr
    unselected = await busscrape(url, "dlq", "purge", "--yes")
    assert unselected.returncode == 2 and "--all" in unselected.stderr
    dry = await busscrape(url, "dlq", "purge", "--all", "--dry-run", "--json")
    assert orjson.loads(dry.stdout)["counts"] == {"would_delete": 6}
    assert await seqs_of(js) == set(letters.values())  # nothing gone yet

    purged = await busscrape(url, "dlq", "purge", "--reason", "http_*", "--older-than", "1h", "--yes", "--json")
    assert purged.returncode == 0, purged.stderr
    assert [(d["seq"], d["action"]) for d in orjson.loads(purged.stdout)["letters"]] == [
        (letters["old_404"], "deleted")]
    by_seq = await busscrape(url, "dlq", "purge", str(letters["poison"]), str(letters["old_404"]), "-y")
    assert by_seq.returncode == 1 and "missing" in by_seq.stdout  # the 404 was already gone
    assert await seqs_of(js) == set(letters.values()) - {letters["old_404"], letters["poison"]}


async def test_replay_requeues_letters_with_a_task_and_skips_the_others_with_the_reason(applied, settings, letters):
    url, js = settings.nats.url, applied.js
    letter = decode(DeadLetter, (await js.get_msg(names.DEADLETTER_STREAM, letters["recent_500"])).data)
    task = letter.task
    assert task is not None
    await AttemptLog(js).record(task.task_id, 12, letter.attempts[0])  # a leftover history of that task

    dry = await busscrape(url, "dlq", "replay", "--all", "--dry-run", "--json")
    assert orjson.loads(dry.stdout)["counts"] == {"would_replay": 3, "skipped": 3}
    assert await count(js, names.TASKS_STREAM) == 0 and len(await seqs_of(js)) == 6

    proc = await busscrape(url, "dlq", "replay", "--all", "--json")
    assert proc.returncode == 1, proc.stderr  # some letters could not be replayed
    doc = orjson.loads(proc.stdout)
    assert doc["counts"] == {"replayed": 3, "skipped": 3}
    skipped = {d["seq"]: d["detail"] for d in doc["letters"] if d["action"] == "skipped"}
    assert "a poison message" in skipped[letters["poison"]]
    assert "an ingester letter" in skipped[letters["ingester"]]
    assert "not a readable dead letter" in skipped[letters["unreadable"]]
    assert await seqs_of(js) == {letters["poison"], letters["ingester"], letters["unreadable"]}

    queued = {decode(ScrapeTask, m.data).task_id: m for m in await stream_messages(js, names.TASKS_STREAM)}
    assert len(queued) == 3
    again = queued[task.task_id]
    assert again.subject == names.task_subject(task.task_id)
    assert again.headers[names.MSG_ID] == names.replay_msg_id(task.task_id, letters["recent_500"])
    replayed = decode(ScrapeTask, again.data)
    assert replayed.model_dump(exclude={"dispatched_at"}) == task.model_dump(exclude={"dispatched_at"})
    assert replayed.dispatched_at > task.dispatched_at  # a new generation of the task
    assert (await StatusBoard(js).latest(task.task_id))[0].state == "queued"
    assert await AttemptLog(js).history(task.task_id, 12) == ()
    assert attempts_key(task.task_id, 12) not in await _keys(js)

    twice = await busscrape(url, "dlq", "replay", str(letters["recent_500"]))
    assert twice.returncode == 1 and "missing" in twice.stdout
    assert await count(js, names.TASKS_STREAM) == 3


async def _keys(js) -> list[str]:
    try:
        return await (await js.key_value(names.ATTEMPTS_BUCKET)).keys()
    except NoKeysError:  # nats-py's answer for an empty bucket; a missing bucket is a failure
        return []


@pytest.mark.browser
async def test_replay_of_a_dead_letter_gets_it_archived_once_the_cause_is_fixed(wbus, wsettings, site,
                                                                                tmp_path):
    js, served = wbus.js, {"status": 500}

    @site.route("/fixme")
    async def fixme(request: web.Request) -> web.Response:
        code = served["status"]
        return web.Response(status=code, text=f"<title>fixme</title><p>served {code}</p>", content_type="text/html")

    task = await enqueue(js, site.url("/fixme"))
    await run_worker(wbus, wsettings)  # 500, retried to max_deliver (3), then dead-lettered
    [letter] = await dead_letters(js)
    assert letter.reason == "http_500" and len(letter.attempts) == 3
    seq = (await js.stream_info(names.DEADLETTER_STREAM)).state.last_seq

    served["status"] = 200  # the cause is fixed
    proc = await busscrape(wsettings.nats.url, "dlq", "replay", str(seq))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replayed 1" in proc.stdout
    await run_worker(wbus, wsettings)
    storage = open_storage(wsettings, tmp_path / "archive")
    async with storage:
        ingester = Ingester(wbus, storage, wsettings.with_overrides(ingester={"exit_when_idle": 1.5}))
        async with ingester:
            await asyncio.wait_for(ingester.run(), 120)
        [meta_key] = [k for k in await storage.keys() if k.endswith(f"{task.task_id}/meta.json")]
        meta = orjson.loads(await storage.get(meta_key))
        folder = meta_key.rsplit("/", 1)[0]
        page = gzip.decompress(await storage.get(f"{folder}/page.html.gz"))
    assert meta["status"] == 200 and meta["attempt"] == 1  # a fresh delivery count
    assert b"served 200" in page
    assert await count(js, names.DEADLETTER_STREAM) == 0
    states = [s.state for s in await StatusBoard(js).history(task.task_id)]
    last_dead = len(states) - 1 - states[::-1].index("dead")
    assert states[last_dead:] == ["dead", "queued", "running", "rendered", "archived"], states


async def test_list_and_show_print_what_a_page_wrote_as_text(applied, settings):
    task = task_for("http://127.0.0.2:8000/[bold]x[/]")
    now = utcnow()
    seq = await file(applied.js, DeadLetter(
        task_id=task.task_id, stage="worker", reason="page_error", error=HOSTILE, url=task.url, host="127.0.0.2",
        attempts=(AttemptRecord(attempt=1, worker="w1", at=now, reason="page_error", error=HOSTILE,
                                retryable=False),), task=task), "hostile")
    listed, shown = await asyncio.gather(busscrape(settings.nats.url, "dlq", "list", COLUMNS="400"),
                                         busscrape(settings.nats.url, "dlq", "show", str(seq), COLUMNS="400"))
    assert listed.returncode == 0 and shown.returncode == 0, (listed.stderr, shown.stderr)
    assert "/[bold]x[/]" in listed.stdout and "\x1b" not in listed.stdout  # the URL as it is
    assert shown_safely(shown.stdout), shown.stdout


async def test_a_replay_run_again_after_a_crash_between_its_puback_and_the_delete_queues_the_task_once(
        applied, settings, letters):
    import nats.errors

    from busscrape.deadletters.queue import DeadLetterQueue

    js = applied.js
    dlq = DeadLetterQueue(js)
    entry = await dlq.get(letters["recent_500"])

    async def lost(*args, **kwargs):
        raise nats.errors.TimeoutError  # the PubAck came; then the process was gone before the delete

    js.delete_msg, delete = lost, js.delete_msg
    try:
        first = await dlq.replay(entry)
    finally:
        js.delete_msg = delete
    assert first.action == "failed" and "does not queue it twice" in first.detail
    assert letters["recent_500"] in await seqs_of(js) and await count(js, names.TASKS_STREAM) == 1
    again = await dlq.replay(await dlq.get(letters["recent_500"]))  # the operator runs it again
    assert again.action == "replayed" and again.detail == "already queued by an earlier replay of this letter"
    assert await count(js, names.TASKS_STREAM) == 1 and letters["recent_500"] not in await seqs_of(js)


async def test_a_scan_stops_at_the_last_letter_there_was_when_it_began(applied, settings, letters):
    import contextlib

    from busscrape.deadletters.queue import DeadLetterQueue, LetterFilter

    js = applied.js
    info = js.stream_info

    async def then_a_new_letter(*args, **kwargs):
        # Right after the scan has read where the stream ends, before it reads a letter: a letter
        # filed now (a task that a running replay queued, dying again) is past that end.
        js.stream_info = info  # once
        found = await info(*args, **kwargs)
        await filing.file(js, DeadLetter(stage="worker", reason="not_json", error="later", payload="x"),
                          msg_id="later")
        return found

    js.stream_info = then_a_new_letter
    try:
        async with contextlib.aclosing(DeadLetterQueue(js).scan(LetterFilter())) as entries:
            scanned = [entry.seq async for entry in entries]
    finally:
        js.stream_info = info
    assert scanned == sorted(letters.values())
    assert len(await seqs_of(applied.js)) == len(letters) + 1


def on_a_terminal(nats_url: str, answer: bytes, *args: str) -> tuple[int, str]:
    """``busscrape ARGS`` with a pseudo-terminal for stdin, answering its question with ``answer``."""
    import os
    import pty
    import sys

    from tests.ops.test_overview import cli_env

    master, slave = pty.openpty()
    try:
        os.write(master, answer)  # typed ahead: the terminal holds it until the prompt reads it
        proc = subprocess.run([sys.executable, "-m", "busscrape", *args], stdin=slave, capture_output=True,
                              text=True, env=cli_env(nats_url), timeout=90)
    finally:
        os.close(slave)
        os.close(master)
    return proc.returncode, proc.stdout + proc.stderr


async def test_purge_on_a_terminal_asks_first_and_deletes_only_on_yes(applied, settings, letters):
    url, js = settings.nats.url, applied.js
    code, said = await asyncio.to_thread(on_a_terminal, url, b"n\n", "dlq", "purge", "--reason", "http_*")
    assert code == 1 and "Delete 2 dead letters for good?" in said and "nothing deleted" in said
    assert await seqs_of(js) == set(letters.values())
    code, said = await asyncio.to_thread(on_a_terminal, url, b"y\n", "dlq", "purge", "--reason", "http_*")
    assert code == 0, said
    assert await seqs_of(js) == set(letters.values()) - {letters["old_404"], letters["recent_500"]}


async def test_two_concurrent_replays_of_one_letter_both_report_it_replayed_and_queue_it_once(
        applied, settings, letters):
    """The second delete of a letter answers err_code 10057 ("no message found"), not a
    NotFoundError: it is the other replay having removed it first, not a failure."""
    from busscrape.deadletters.queue import DeadLetterQueue

    js = applied.js
    dlq = DeadLetterQueue(js)
    entry = await dlq.get(letters["recent_500"])
    outcomes = await asyncio.gather(dlq.replay(entry), DeadLetterQueue(js).replay(entry))
    assert [o.action for o in outcomes] == ["replayed", "replayed"], [o.detail for o in outcomes]
    assert await count(js, names.TASKS_STREAM) == 1 and letters["recent_500"] not in await seqs_of(js)
    deleted = await asyncio.gather(dlq.delete(await dlq.get(letters["old_404"])),
                                   dlq.delete(await dlq.get(letters["old_404"])))
    assert sorted(o.action for o in deleted) == ["deleted", "missing"], [o.detail for o in deleted]
