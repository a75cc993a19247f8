"""An attempt counts only what the page did: outages (a bucket, the object store, NATS not
answering) spend none, the worker stops fetching while they last, and only the outage budget
ends such a task — with a letter that says so.

Each outage here is real: a bucket deleted from a real nats-server (every request to it then
fails as it does while its stream has no leader) and created again, with the page served on
loopback and rendered by Chromium.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from aiohttp import web

from busscrape.bus import names, provision, topology
from busscrape.model.messages import AttemptRecord, utcnow
from busscrape.status.records import StatusBoard
from busscrape.worker.attempts import AttemptLog, Ledger, Tally
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import dead_letters, enqueue, results, wait_until

pytestmark = pytest.mark.browser


@pytest.fixture
def hits(site) -> list[str]:
    """``/counted`` serves a plain page and counts its requests: whether a delivery reached it."""
    seen: list[str] = []

    @site.route("/counted")
    async def counted(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(text=pages.STATIC, content_type="text/html")

    return seen

# -- the count, as a value -------------------------------------------------------------------------


def test_only_deliveries_that_reached_the_page_count():
    ledger = Ledger().reach(1).reach(2)
    assert Tally("t", 1, 3, ledger).attempt == 3
    after = ledger.outage(2, "ARTIFACTS", "cannot store artifact")  # delivery 2 reached, then met an outage
    assert after.reached == (1,) and after.outages == 1 and after.unavailable == ("ARTIFACTS",)
    assert Tally("t", 1, 3, after).attempt == 2
    assert after.outage_since is not None and after.outage_seconds() >= 0
    again = after.outage(3, "HOSTS", "no responders").outage(4, "ARTIFACTS", "timeout")
    assert again.unavailable == ("ARTIFACTS", "HOSTS") and again.outages == 3
    assert again.outage_since == after.outage_since  # the budget runs from the first outage
    assert Ledger().withdraw(5) == Ledger()


def test_the_story_tells_what_each_delivery_did():
    record = AttemptRecord(attempt=1, worker="w", at=utcnow(), reason="timeout", error="navigation timed out",
                           retryable=True)
    ledger = Ledger().reach(1).reach(4).reach(6).outage(2, "ATTEMPTS", "x").outage(3, "HOSTS", "y")
    story = ledger.story((record,), deliveries=7)
    assert story == ("7 deliveries, 3 of them reached the page; 1 failed (last: timeout: navigation timed out); "
                     "2 ended without an outcome (the worker died or went silent mid-attempt); "
                     "2 lost to outages (ATTEMPTS, HOSTS unavailable), not counted; 2 deferred or handed back, "
                     "not counted")


# -- outages against a real server ----------------------------------------------------------------


async def _settings(wbus, wsettings, **worker):
    # One attempt allowed (the consumer's own figure, which the worker reads): any outage counted
    # as an attempt would end the page.
    s = wsettings.with_overrides(streams={"worker_max_deliver": 1},
                                 worker={"exit_when_idle": "1h", "retry_base_delay": "200ms", **worker})
    await provision.apply(wbus.js, topology.load(s))
    return s


async def _delivered(js) -> int:
    return (await js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)).delivered.consumer_seq


async def _delivered_at_least(js, n: int) -> bool:
    return await _delivered(js) >= n


async def test_a_gate_and_attempts_outage_spends_no_attempt_and_fetches_nothing(wbus, wsettings, site,
                                                                                 hits):
    """The issue's `/static/51`: HOSTS and ATTEMPTS both unavailable (a node killed). Before,
    each delivery's deferral went unrecorded, so each counted as an attempt and the task was
    dead-lettered `max_deliveries`, "each delivery's worker died". Now: no attempt, no churn,
    archived once the buckets are back."""
    s = await _settings(wbus, wsettings, concurrency=1)  # one slot: any fetch during the outage shows
    task = await enqueue(wbus.js, site.url("/counted"))
    await wbus.js.delete_key_value(names.HOSTS_BUCKET)
    await wbus.js.delete_key_value(names.ATTEMPTS_BUCKET)
    async with Worker(wbus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _delivered_at_least(wbus.js, 1), timeout=60)
        later = [await enqueue(wbus.js, site.url(f"/counted?n={i}")) for i in range(2)]
        await asyncio.sleep(4)  # a schedule: with retry_base_delay 200ms, many deliveries' worth
        assert worker.room.closed and worker.room.outage in (names.HOSTS_BUCKET, names.ATTEMPTS_BUCKET)
        assert await _delivered(wbus.js) == 1, "deliveries churned through the outage"
        assert hits == []  # the page was not reached
        await provision.apply(wbus.js, topology.load(s))
        await wait_until(lambda: _results_for(wbus.js, 3), timeout=90)
        worker.stop()
        await asyncio.wait_for(running, 60)
    assert await dead_letters(wbus.js) == []
    mine = {r.task_id: r for r in await results(wbus.js)}
    assert set(mine) == {task.task_id, *(t.task_id for t in later)}
    assert mine[task.task_id].attempt == 1  # the outage's deliveries were not attempts
    assert worker.counters["outage"] >= 1 and worker.room.outages >= 1


async def _results_for(js, n: int) -> bool:
    return len(await results(js)) >= n


async def test_an_object_store_outage_after_the_render_spends_no_attempt(wbus, wsettings, site, hits):
    """The issue's `/static/9`: the page rendered, its artifacts could not be stored (ARTIFACTS
    did not answer). Before: `storage_unavailable` counted as an attempt; with one allowed, dead."""
    s = await _settings(wbus, wsettings)
    await wbus.js.delete_object_store(names.ARTIFACTS_BUCKET)
    task = await enqueue(wbus.js, site.url("/counted"))
    async with Worker(wbus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _hit(hits, 1), timeout=60)
        await asyncio.sleep(3)  # a schedule: the failed store, and any retry it would make
        assert worker.room.closed and worker.room.outage == names.ARTIFACTS_BUCKET
        await provision.apply(wbus.js, topology.load(s))
        await wait_until(lambda: _results_for(wbus.js, 1), timeout=90)
        worker.stop()
        await asyncio.wait_for(running, 60)
    assert await dead_letters(wbus.js) == []
    [result] = await results(wbus.js)
    assert result.task_id == task.task_id and result.attempt == 1
    history = await StatusBoard(wbus.js).history(task.task_id)
    outage = [h for h in history if h.reason == "outage"]
    assert outage and "ARTIFACTS unavailable" in (outage[0].error or "")  # `busscrape task` tells it
    assert await AttemptLog(wbus.js).history(task.task_id, 1) == ()


async def _hit(seen: list[str], n: int) -> bool:
    return len(seen) >= n


async def test_an_outage_past_its_budget_is_dead_lettered_outage_exceeded(wbus, wsettings, site,
                                                                          hits):
    s = await _settings(wbus, wsettings, outage_budget="2s")
    await wbus.js.delete_object_store(names.ARTIFACTS_BUCKET)
    task = await enqueue(wbus.js, site.url("/counted"))
    async with Worker(wbus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _outages(worker, 1), timeout=60)
        await asyncio.sleep(3)  # past the budget, the object store still away
        await provision.apply(wbus.js, topology.load(s))
        await wait_until(lambda: _letters(wbus.js), timeout=90)
        worker.stop()
        await asyncio.wait_for(running, 60)
    [letter] = await dead_letters(wbus.js)
    assert letter.task_id == task.task_id and letter.reason == "outage_exceeded"
    assert "over worker.outage_budget 2s: ARTIFACTS did not answer" in letter.error
    # Each slot had fetched it once before the worker paused: one or two deliveries, none counted.
    assert re.search(r"[12] lost to outages \(ARTIFACTS unavailable\), not counted", letter.error), letter.error
    assert "0 of them reached the page" in letter.error
    assert await results(wbus.js) == []
    [status] = [h for h in await StatusBoard(wbus.js).history(task.task_id) if h.state == "dead"]
    assert status.reason == "outage_exceeded"  # `busscrape task` says what the letter says


async def _outages(worker: Worker, n: int) -> bool:
    return worker.counters["outage"] >= n


async def _letters(js) -> bool:
    return len(await dead_letters(js)) >= 1


async def test_a_ledger_read_that_fails_keeps_the_page_untouched(wbus, wsettings, site, hits):
    """A redelivery cannot read its count: it must not reach the page (one more try, never one
    fewer), and it spends nothing."""
    s = await _settings(wbus, wsettings)
    task = await enqueue(wbus.js, site.url("/counted"))
    log = AttemptLog(wbus.js)
    await log.write(task.task_id, 1, Ledger().outage(1, "HOSTS", "no responders"))
    # Delivered once already (and nak'ed): this worker's delivery is a redelivery.
    sub = await wbus.js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    [msg] = await sub.fetch(1, timeout=10)
    await msg.nak()
    await sub.unsubscribe()
    await wbus.js.delete_key_value(names.ATTEMPTS_BUCKET)
    async with Worker(wbus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _delivered_at_least(wbus.js, 2), timeout=60)
        await asyncio.sleep(2)
        assert hits == [] and worker.room.outage == names.ATTEMPTS_BUCKET
        await provision.apply(wbus.js, topology.load(s))
        await wait_until(lambda: _results_for(wbus.js, 1), timeout=90)
        worker.stop()
        await asyncio.wait_for(running, 60)
    [result] = await results(wbus.js)
    assert result.attempt == 1 and await dead_letters(wbus.js) == []


def test_the_budget_is_measured_from_the_first_outage():
    old = Ledger(outages=2, outage_since=utcnow() - timedelta(hours=7), unavailable=("NATS",))
    assert old.outage_seconds() > 6 * 3600
    assert Ledger().outage_seconds() == 0.0



async def test_a_last_attempt_whose_letter_was_not_filed_is_filed_later_with_its_own_reason(
        wbus, wsettings, site):
    """The last attempt failed (HTTP 500) but DEADLETTER did not take its letter (no stream
    answered): the next delivery, past the last attempt, reaches no page and files the letter
    with that attempt's reason — not ``max_deliveries``, and not "each delivery's worker died"."""
    stamps = pages.install(site)
    s = await _settings(wbus, wsettings)
    await wbus.js.delete_stream(names.DEADLETTER_STREAM)
    task = await enqueue(wbus.js, site.url("/status?code=500"))
    async with Worker(wbus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _delivered_at_least(wbus.js, 2), timeout=60)  # unfiled: nak'ed, back again
        await provision.apply(wbus.js, topology.load(s))
        await wait_until(lambda: _letters(wbus.js), timeout=90)
        worker.stop()
        await asyncio.wait_for(running, 60)
    [letter] = await dead_letters(wbus.js)
    assert (letter.task_id, letter.stage, letter.reason) == (task.task_id, "worker", "http_500")
    assert "1 attempt reached the page, none with its outcome recorded" in letter.error, letter.error
    assert [a.reason for a in letter.attempts] == ["http_500"]
    assert len(stamps["/status"]) == 1  # the page was reached once: the later deliveries only filed
