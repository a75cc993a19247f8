"""The worker against a real nats-server, real Chromium and pages served on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import struct

import orjson
import pytest

from busscrape.artifacts.files import capture_files
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.bus import names, provision, topology
from busscrape.model.messages import ScrapeResult, TaskOptions
from busscrape.model.steps import Click, Evaluate, Fill, Press, Screenshot, Scroll, WaitFor, WaitStable
from busscrape.status.records import StatusBoard, TaskStatus
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import count, dead_letters, enqueue, results, wait_until

pytestmark = pytest.mark.browser


@pytest.fixture
def stamps(site):
    return pages.install(site)


async def run_worker(bus, settings, **worker):
    s = settings.with_overrides(worker=worker) if worker else settings
    async with Worker(bus, s) as w:
        await w.run()
    return w


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


async def by_name(bus, result: ScrapeResult) -> dict[str, bytes]:
    store = ArtifactStore(bus.js)
    return {ref.name: await store.read(ref) for ref in result.artifacts}


async def test_happy_path_captures_html_screenshot_har_and_text(wbus, wsettings, site, stamps):
    task = await enqueue(wbus.js, site.url("/static"), labels={"job": "t1"})
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    assert result.task_id == task.task_id and result.status == 200 and result.title == "Static page"
    assert result.labels == {"job": "t1"} and result.attempt == 1 and result.worker == wsettings.worker.name
    files = await by_name(wbus, result)
    assert set(files) == {"page.html", "screenshot.png", "page.har", "page.txt"}
    assert b"<h1>Static</h1>" in files["page.html"]
    assert files["page.txt"].decode().startswith("Static")
    assert png_size(files["screenshot.png"])[0] == 1280
    har = orjson.loads(files["page.har"])
    urls = [e["request"]["url"] for e in har["log"]["entries"]]
    assert site.url("/static") in urls and site.url("/style.css") in urls and site.url("/pixel.svg") in urls
    assert all(e["response"]["status"] == 200 for e in har["log"]["entries"])
    for ref in result.artifacts:  # every claim check matches its bytes
        assert hashlib.sha256(files[ref.name]).hexdigest() == ref.sha256 and len(files[ref.name]) == ref.size
    assert await count(wbus.js, names.TASKS_STREAM) == 0  # acked after the result was safe


async def test_javascript_rendered_dom_is_captured(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/js"), steps=(WaitFor(selector="text=rendered-by-javascript-4242"),))
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    files = await by_name(wbus, result)
    assert b'<div id="app">rendered-by-javascript-4242</div>' in files["page.html"]
    assert "rendered-by-javascript-4242" not in pages.JS_RENDERED  # only the browser could have written it


async def test_redirects_are_followed_and_recorded(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/redirect"))
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    assert result.final_url == site.url("/static")
    assert result.redirect_chain == (site.url("/redirect"), site.url("/redirect2"))
    assert result.status == 200


async def test_404_dead_letters_at_once_and_500_retries_then_dead_letters_with_history(wbus, wsettings, site,
                                                                                         stamps):
    await enqueue(wbus.js, site.url("/status?code=404"))
    await enqueue(wbus.js, site.url("/status?code=500"))
    await run_worker(wbus, wsettings)
    assert await results(wbus.js) == []
    letters = {d.reason: d for d in await dead_letters(wbus.js)}
    assert set(letters) == {"http_404", "http_500"}
    assert len(letters["http_404"].attempts) == 1 and not letters["http_404"].attempts[0].retryable
    history = letters["http_500"].attempts
    assert [a.attempt for a in history] == [1, 2, 3] and all(a.status == 500 for a in history)
    assert letters["http_500"].task is not None and letters["http_500"].stage == "worker"
    assert await count(wbus.js, names.TASKS_STREAM) == 0


async def test_a_dead_task_is_kept_until_its_dead_status_is_recorded(wbus, wsettings, site, stamps):
    """`busscrape run` waits for the `dead` record: without the STATUS bucket the letter is filed
    but the task stays in TASKS; once the bucket is back, the worker (or, after the last delivery,
    the reaper) records it and the task leaves."""
    await wbus.js.delete_key_value(names.STATUS_BUCKET)
    task = await enqueue(wbus.js, site.url("/status?code=404"))
    async with Worker(wbus, wsettings.with_overrides(worker={"exit_when_idle": "1h"})) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _letters(wbus.js, 1), timeout=60)  # a 404 is filed at its first delivery
        # Redelivered twice since (retry_base_delay 200ms) and still not acked while STATUS is
        # missing. Counted in deliveries, not page requests: past max_deliver (3) a delivery files
        # `max_deliveries` without rendering, and a late first look would miss requests.
        await wait_until(lambda: _delivered(wbus.js, 3), timeout=60)
        assert await count(wbus.js, names.TASKS_STREAM) == 1  # filed, but not acked
        assert worker.counters["dead"] == 0
        await provision.apply(wbus.js, topology.load(wsettings))  # STATUS is back
        await wait_until(lambda: _tasks_gone(wbus.js), timeout=60)
        worker.stop()
        await asyncio.wait_for(running, 60)
    history = await StatusBoard(wbus.js).history(task.task_id)
    assert history and history[-1].state == "dead" and history[-1].reason == "http_404"
    [letter] = await dead_letters(wbus.js)  # filed once, however often it was redelivered
    assert letter.reason == "http_404" and letter.task_id == task.task_id


async def _letters(js, n: int) -> bool:
    return await count(js, names.DEADLETTER_STREAM) >= n


async def _delivered(js, n: int) -> bool:
    info = await js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    return info.delivered.consumer_seq >= n


async def _tasks_gone(js) -> bool:
    return await count(js, names.TASKS_STREAM) == 0


async def test_a_retry_then_success_is_one_result(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/flaky?key=a&fail=2&code=503"))
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    assert result.attempt == 3 and result.title == "recovered"
    assert await dead_letters(wbus.js) == []


async def test_retry_after_is_honoured(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/status?code=429&retry_after=2"))
    await run_worker(wbus, wsettings, retry_max_delay=10, exit_when_idle=4)
    times = stamps["/status"]
    # the worker's own backoff would wait 0.1-0.4s; the origin asked for 2s and got it
    assert len(times) == 3 and all(b - a >= 2.0 for a, b in itertools.pairwise(times))
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "http_429" and [a.status for a in letter.attempts] == [429, 429, 429]


def test_the_workers_backoff_doubles_from_its_base_with_jitter_up_to_its_cap(wsettings):
    from busscrape.worker.failures import Failures

    failures = Failures(None, wsettings, None, None, None, lambda _: None)  # retry_base_delay 200ms, max 1s
    for attempt, low, high in [(1, 0.1, 0.2), (2, 0.2, 0.4), (3, 0.4, 0.8), (4, 0.5, 1.0), (50, 0.5, 1.0)]:
        delays = [failures.retry_delay(attempt) for _ in range(50)]
        assert all(low <= d <= high for d in delays) and len(set(delays)) > 1, (attempt, min(delays), max(delays))
    assert all(0.3 <= failures.retry_delay(1, 0.3) <= 0.3 for _ in range(10))  # Retry-After over the curve
    assert all(failures.retry_delay(1, 3600) == 1.0 for _ in range(10))  # ... but never past the cap


async def test_a_retry_after_beyond_the_cap_waits_only_the_cap(wbus, wsettings, site, stamps):
    # An origin asking for an hour: the worker waits retry_max_delay (1s), so the three attempts
    # end in a dead letter within this bounded run (uncapped, the run would go idle and exit first).
    await enqueue(wbus.js, site.url("/status?code=503&retry_after=3600"))
    await run_worker(wbus, wsettings, exit_when_idle=4)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "http_503" and [a.status for a in letter.attempts] == [503, 503, 503]


async def test_a_page_that_never_finishes_times_out_retries_and_dead_letters(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/never"))
    await run_worker(wbus, wsettings, navigation_timeout=1.0)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "timeout" and len(letter.attempts) == 3
    assert letter.error.startswith("gave up after 3 attempts; last: navigation to "), letter.error
    assert all(a.reason == "timeout" and a.retryable for a in letter.attempts)
    assert len(stamps["/never"]) == 3


@pytest.mark.slow  # ~30 s on two loaded cores
async def test_a_20mb_page_and_a_10mb_screenshot_flow_through_byte_identical(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/big"), options=TaskOptions(artifacts=("html",)))
    await enqueue(wbus.js, site.url("/noise"), options=TaskOptions(artifacts=("screenshot",), screenshot="full"))
    await run_worker(wbus, wsettings, navigation_timeout=30)
    by_url = {r.url: r for r in await results(wbus.js)}
    big = by_url[site.url("/big")].artifacts[0]
    shot = by_url[site.url("/noise")].artifacts[0]
    assert big.size > 20_000_000 and shot.size > 10_000_000
    assert big.size > 10 * wbus.nc.max_payload  # far above max_payload: it went through the object store in chunks
    store = ArtifactStore(wbus.js)
    for ref in (big, shot):
        data = await store.read(ref)
        assert hashlib.sha256(data).hexdigest() == ref.sha256
    width, height = png_size(await store.read(shot))
    assert width == 1280 and height >= 2800  # the whole canvas, full page
    # the result message itself stays small
    raw = await wbus.js.get_last_msg(names.RESULTS_STREAM, names.result_subject(by_url[site.url("/big")].task_id))
    assert len(raw.data) < 8192


async def test_steps_run_in_order(wbus, wsettings, site, stamps):
    site.page("/form", """<!doctype html><title>form</title>
      <input id=q><button id=go onclick="document.getElementById('out').textContent='searched:'+q.value">go</button>
      <p id=out></p><div id=feed></div>
      <script>let n=0; window.addEventListener('scroll', () => { if (n < 50) { n++;
        document.getElementById('feed').insertAdjacentHTML('beforeend', '<div style="height:900px">item '+n+'</div>');
      }});</script>""")
    steps = (Fill(selector="#q", value="nats"), Click(selector="#go"), WaitFor(selector="text=searched:nats"),
             Press(key="End"), Scroll(mode="infinite", max_scrolls=4, delay=0.2), WaitStable(quiet=0.2, timeout=3),
             Screenshot(name="after-scroll"))
    await enqueue(wbus.js, site.url("/form"), steps=steps)
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    files = await by_name(wbus, result)
    html = files["page.html"].decode()
    assert "searched:nats" in html
    items = html.count(">item ")
    assert 1 <= items <= 5  # the infinite-scroll cap held (4 scrolls, plus the End key)
    assert "shot-after-scroll.png" in files


async def test_evaluate_is_refused_unless_enabled(wbus, wsettings, site, stamps):
    await enqueue(wbus.js, site.url("/static"), steps=(Evaluate(script="document.title = 'changed'"),))
    await run_worker(wbus, wsettings)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "evaluate_disabled"

    await enqueue(wbus.js, site.url("/static?e=1"), steps=(Evaluate(script="document.title = 'changed'"),))
    await run_worker(wbus, wsettings, allow_evaluate=True)
    [result] = await results(wbus.js)
    assert result.title == "changed"


async def test_a_poison_task_is_dead_lettered_and_the_worker_carries_on(wbus, wsettings, site, stamps):
    await wbus.js.publish(names.task_subject("poison"), b"{not json")
    await wbus.js.publish(names.task_subject("wrong-version"), b'{"schema_version": 7}')
    await enqueue(wbus.js, site.url("/static"))
    await run_worker(wbus, wsettings)
    assert len(await results(wbus.js)) == 1
    letters = {d.reason for d in await dead_letters(wbus.js)}
    assert letters == {"not_json", "unsupported_schema_version"}
    assert await count(wbus.js, names.TASKS_STREAM) == 0


async def test_per_host_politeness_spaces_navigations(wbus, wsettings, site, stamps):
    for i in range(3):
        await enqueue(wbus.js, site.url(f"/slow?s=0&i={i}"))
    await run_worker(wbus, wsettings, concurrency=3, host_concurrency=1, host_delay=2.5)
    times = sorted(stamps["/slow"])
    assert len(times) == 3
    # Measured where the site sees the requests: each gap is the delay plus the difference of two
    # requests' own trips from the worker, which the first (cold) tab on a loaded machine has been
    # seen to stretch by 0.9 s; hence half the delay as the bound. Without the gate the three
    # arrive within a few hundred ms of each other.
    assert all(b - a >= 1.25 for a, b in itertools.pairwise(times))
    assert times[-1] - times[0] >= 2 * 2.5 - 1.25


async def test_a_killed_attempt_between_publish_and_ack_leaves_one_result(wbus, short_ack, site, stamps):
    """Simulates SIGKILL after the result's PubAck but before the task's ack (a real SIGKILL at
    the same point: tests/worker/test_faults.py)."""

    class DiesBeforeAck(Worker):
        async def handle(self, msg):
            async def no_ack(*a, **k):
                raise SystemExit  # what a kill looks like from here: nothing more happens

            msg.ack_sync = no_ack
            try:
                await super().handle(msg)
            except SystemExit:
                self.stop()

    await enqueue(wbus.js, site.url("/static"))
    async with DiesBeforeAck(wbus, short_ack.with_overrides(worker={"max_tasks": 1, "grace_period": 0.1})) as w:
        await w.run()
    await after_a_death_before_the_ack(wbus, short_ack)


async def after_a_death_before_the_ack(bus, settings) -> None:
    """The first delivery's worker died after its result's PubAck, before the task's ack: one
    result, the task still in TASKS; the redelivery acks it without rendering again."""
    assert len(await results(bus.js)) == 1 and await count(bus.js, names.TASKS_STREAM) == 1
    [first] = await results(bus.js)
    board = StatusBoard(bus.js)
    assert await board.record(TaskStatus(task_id=first.task_id, state="archived", attempt=1,  # as the ingester does
                                         dispatched_at=first.dispatched_at))
    w2 = await run_worker(bus, settings, exit_when_idle=4)
    # the redelivery found the task archived: it acked without rendering it again
    assert w2.counters["already_done"] == 1 and w2.counters["completed"] == 0
    # ... and did not make the archived task look unfinished again
    history = [(s.state, s.attempt) for s in await board.history(first.task_id)]
    assert history[-2:] == [("rendered", 1), ("archived", 1)]
    # Before the render, only the first attempt: a network change on this machine (a container
    # test beside this one) may cut the first render off, an outage that spends no attempt.
    assert history[0] == ("running", 1) and set(history[:-2]) <= {("running", 1), ("retrying", 1)}
    assert len(await results(bus.js)) == 1
    assert await count(bus.js, names.TASKS_STREAM) == 0
    # only the first result's objects exist: the second delivery stored nothing
    [result] = await results(bus.js)
    store = ArtifactStore(bus.js)
    assert result.attempt == 1 and all([await store.exists(ref) for ref in result.artifacts])
    for ref in result.artifacts:
        second = ref.model_copy(update={"object": object_name(result.task_id, result.task_seq, 2, ref.name)})
        assert not await store.exists(second)


class DiesAfterStoring(Worker):
    """Simulates SIGKILL after the task's artifacts are stored but before its result is published."""

    async def setup(self):
        await super().setup()

        async def publish(task, result):
            raise SystemExit  # what a kill looks like from here: nothing more happens

        self.results.publish = publish

    async def handle(self, msg):
        try:
            await super().handle(msg)
        except SystemExit:
            self.stop()


async def die_after_storing(bus, settings) -> int:
    """One delivery that dies after storing; returns the outages the worker met on the way (each
    naks the task: one more delivery, no attempt)."""
    async with DiesAfterStoring(bus, settings.with_overrides(worker={"max_tasks": 1, "grace_period": 0.1})) as w:
        await w.run()
    return w.counters.get("outage", 0)


async def live_objects(bus) -> int:
    """Objects whose chunks are still in ARTIFACTS (a released or discarded one has none)."""
    chunks = names.object_chunk_subject(names.ARTIFACTS_BUCKET, ">")
    info = await bus.js.stream_info(names.ARTIFACTS_STREAM, subjects_filter=chunks)
    return len(info.state.subjects or {})


LEFTOVER_OPTIONS = {"steps": (Screenshot(name="top"),),
                    "options": TaskOptions(artifacts=("html", "screenshot", "har", "text"))}
"""A task with five artifacts, for the tests of what a killed attempt left behind."""


async def test_a_retry_discards_what_a_killed_attempt_stored(wbus, short_ack, site, stamps):
    """Simulated (a real SIGKILL at the same point: tests/worker/test_faults.py)."""
    task = await enqueue(wbus.js, site.url("/static"), **LEFTOVER_OPTIONS)
    await die_after_storing(wbus, short_ack)
    await after_a_death_after_storing(wbus, short_ack, task)


async def after_a_death_after_storing(bus, settings, task) -> None:
    """The first delivery's worker died with its five artifacts stored and its result not
    published: the retry discards them, and only its own objects are left."""
    assert await live_objects(bus) == 5 and await results(bus.js) == []
    w2 = await run_worker(bus, settings, exit_when_idle=4)
    [result] = await results(bus.js)
    assert result.attempt == 2 and w2.counters["leftovers_discarded"] == 5
    # the files a task is known to capture are the ones it did: that is how leftovers are found
    assert sorted(capture_files(task)) == sorted(ref.name for ref in result.artifacts)
    assert await live_objects(bus) == len(result.artifacts) == 5  # attempt 2's, for the ingester
    store = ArtifactStore(bus.js)
    assert all([await store.exists(ref) for ref in result.artifacts])


async def test_a_dead_letter_after_a_killed_attempt_leaves_no_artifacts(wbus, short_ack, site, stamps):
    # the first request renders (and its worker dies after storing); the second is a 404
    await enqueue(wbus.js, site.url("/flaky?ok=1&fail=99&code=404&key=leftovers"))
    await die_after_storing(wbus, short_ack)
    assert await live_objects(wbus) == 4
    w2 = await run_worker(wbus, short_ack, exit_when_idle=4)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "http_404" and w2.counters["dead"] == 1 and w2.counters["leftovers_discarded"] == 4
    assert (await wbus.js.stream_info(names.ARTIFACTS_STREAM)).state.messages == 0


async def test_the_reaper_discards_what_the_killed_deliveries_stored(wbus, short_ack, site, stamps):
    # No room for deferrals: the server gives up after 2 deliveries, and the reaper files the letter.
    reaped = short_ack.with_overrides(streams={"worker_max_deliver": 2, "worker_max_deferrals": 0})
    await provision.apply(wbus.js, topology.load(reaped))
    # Both deliveries must die after storing. One that met an outage instead (Chromium's
    # ERR_NETWORK_CHANGED beside a container test) spent one of the two, and the reaper may have
    # discarded the other's objects already: that round is dropped, its task and objects purged.
    dropped: set[str] = set()
    for round_ in range(3):
        task = await enqueue(wbus.js, site.url(f"/static?round={round_}"))
        if [await die_after_storing(wbus, reaped) for _ in range(2)] == [0, 0]:
            break
        dropped.add(task.task_id)
        for stream in (names.TASKS_STREAM, names.ARTIFACTS_STREAM):
            await wbus.js.purge_stream(stream)
    else:
        pytest.fail("each of three rounds met an outage")
    assert await live_objects(wbus) == 8
    host = await run_worker(wbus, reaped, exit_when_idle=6)
    [letter] = [d for d in await dead_letters(wbus.js) if d.task_id not in dropped]
    assert letter.stage == "reaper" and host.counters.get("completed", 0) == 0
    assert (await wbus.js.stream_info(names.ARTIFACTS_STREAM)).state.messages == 0
    # `busscrape run` waits for this record: a letter filed without it would keep the run waiting.
    latest = await StatusBoard(wbus.js).latest(task.task_id)
    assert latest is not None and (latest[0].state, latest[0].reason) == ("dead", "max_deliveries"), latest
    assert await count(wbus.js, names.TASKS_STREAM) == 0


async def test_jpeg_screenshots_with_quality(wbus, wsettings, site, stamps):
    from busscrape.model.messages import ScreenshotOptions

    options = TaskOptions(artifacts=("screenshot",), screenshot=ScreenshotOptions(format="jpeg", quality=40,
                                                                                  full_page=False))
    await enqueue(wbus.js, site.url("/static"), options=options)
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    [ref] = result.artifacts
    assert ref.name == "screenshot.jpg" and ref.content_type == "image/jpeg"
    assert (await ArtifactStore(wbus.js).read(ref))[:3] == b"\xff\xd8\xff"


async def test_cli_worker_runs_a_bounded_batch(wbus, wsettings, site, stamps, tmp_path):
    import asyncio

    from tests.support.procs import env_for, spawn

    await enqueue(wbus.js, site.url("/static"))
    proc = spawn(["worker", "--max-tasks", "1", "--concurrency", "1"], env_for(wsettings), tmp_path / "w.log")
    assert await asyncio.to_thread(proc.wait, 90) == 0, (tmp_path / "w.log").read_text()[-2000:]
    assert len(await results(wbus.js)) == 1


async def test_cli_worker_without_streams_exits_2_with_the_fix(bus, wsettings, tmp_path):
    import asyncio

    from tests.support.procs import env_for, spawn

    proc = spawn(["worker"], env_for(wsettings), tmp_path / "w.log")
    assert await asyncio.to_thread(proc.wait, 60) == 2
    assert "busscrape streams apply" in (tmp_path / "w.log").read_text()
