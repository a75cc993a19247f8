"""Task histories: STATUS records merged with the SEEN entry, by generation.

The transitions come from the real services: tasks queued by the real Dispatcher, rendered by a
real worker in Chromium from pages served on loopback, archived by a real ingester.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from busscrape.archive.storage.local import FileStorage
from busscrape.bus import provision, topology
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.dispatch.identity import task_id_for_url
from busscrape.errors import InputError
from busscrape.ingest.daemon import Ingester
from busscrape.model.messages import ScrapeTask, TaskOptions, task_key
from busscrape.settings import settings_env
from busscrape.status.history import HistoryReader, TaskHistory, merge
from busscrape.status.records import StatusBoard, TaskStatus
from busscrape.worker.daemon import Worker
from tests.conftest import make_settings
from tests.support import cli, pages
from tests.support.hostile_text import HOSTILE, shown_safely

T0 = datetime(2025, 6, 30, 12, tzinfo=UTC)
ID = "a" * 32


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(state: str, seconds: float, dispatched: float | None = 0, **fields) -> TaskStatus:
    return TaskStatus(task_id=ID, state=state, at=at(seconds), url="http://x.example/",
                      dispatched_at=None if dispatched is None else at(dispatched), **fields)


def states(history: TaskHistory) -> list[list[str]]:
    return [[e.state for e in g.events] for g in history.generations]


# -- merging (pure) -----------------------------------------------------------------------------


def test_nothing_known_is_no_history():
    assert merge(ID, []) is None


def test_a_task_only_in_seen_is_queued_since_its_key_was_created():
    task = ScrapeTask(task_id=ID, url="http://x.example/", original_url="http://x.example/", dispatched_at=at(0))
    history = merge(ID, [], task, seen_at=at(0.01))
    assert history is not None and history.state == "queued" and history.url == "http://x.example/"
    [event] = history.generations[0].events
    assert event.source == "seen" and event.at == at(0.01)


def test_generations_are_told_apart_by_dispatched_at_and_outcomes_come_last():
    first = [record("running", 1, attempt=1), record("retrying", 2, attempt=1, reason="http_503"),
             record("running", 4, attempt=2), record("archived", 5.0, attempt=2, archive="file:///a/x"),
             record("rendered", 5.1, attempt=2, status=200)]  # stamped by a clock running ahead
    replayed = [record("queued", 100, dispatched=100), record("running", 101, dispatched=100, attempt=1),
                record("dead", 102, dispatched=100, attempt=1, reason="http_404")]
    later = ScrapeTask(task_id=ID, url="http://x.example/", original_url="http://x.example/", dispatched_at=at(200))
    history = merge(ID, [*replayed, *first], later, seen_at=at(200.002))
    assert history is not None
    assert states(history) == [["queued", "running", "retrying", "running", "rendered", "archived"],
                               ["queued", "running", "dead"], ["queued"]]
    one, two, three = history.generations
    assert one.events[0].source == "dispatch" and one.events[0].at == at(0)  # its SEEN entry is gone
    assert two.events[0].source == "status"  # `dlq replay` recorded it
    assert three.events[0].source == "seen" and history.state == "queued"
    assert one.state == "archived" and one.events[-1].archive == "file:///a/x" and two.state == "dead"


def test_a_record_without_its_generation_joins_the_dispatch_before_it():
    history = merge(ID, [record("running", 1, attempt=1), record("dead", 2, dispatched=None, reason="r"),
                         record("running", 11, dispatched=10, attempt=1)])
    assert history is not None and states(history) == [["queued", "running", "dead"], ["queued", "running"]]


def test_a_url_gets_the_task_id_dispatch_gives_it(settings):
    url = "HTTP://Example.COM:80/a/../b?utm_source=x#top"
    assert task_id_for_url(url, settings) == task_key("http://example.com/b?utm_source=x")
    stripping = settings.with_overrides(dispatch={"strip_tracking": True})
    assert task_id_for_url(url, stripping) == task_key("http://example.com/b")
    html_only = TaskOptions(artifacts=("html",))
    assert task_id_for_url(url, settings, {"artifacts": ["html"]}) == task_key("http://example.com/b?utm_source=x",
                                                                              (), html_only)
    with pytest.raises(InputError) as info:
        task_id_for_url("ftp://example.com/", settings)
    assert info.value.reason == "unsupported_scheme"


# -- real transitions ---------------------------------------------------------------------------


@pytest.fixture
def hsettings(tmp_path, nats_url, site):
    pages.install(site)
    return make_settings(
        tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]},
        worker={"concurrency": 3, "navigation_timeout": "5s", "retry_base_delay": "200ms", "retry_max_delay": "400ms",
                "exit_when_idle": "2s"},
        streams={"worker_max_deliver": 2},
        ingester={"exit_when_idle": "1s"},
    )


async def dispatch(bus, settings, urls: list[str], *, force: bool = False) -> list[str]:
    published: list[str] = []
    async with Dispatcher(bus, settings, force=force, on_published=published.append) as dispatcher:
        summary = await dispatcher.dispatch(urls)
    assert summary.published == len(urls), summary
    return published


async def work(bus, settings) -> None:
    async with Worker(bus, settings) as worker:
        await worker.run()
    async with FileStorage(settings.archive_dir()) as storage, Ingester(bus, storage, settings) as ingester:
        await asyncio.wait_for(ingester.run(), 60)


@pytest.mark.browser
async def test_histories_of_a_success_a_retry_then_success_and_a_death(bus, hsettings, site):
    await provision.apply(bus.js, topology.load(hsettings))
    ok, flaky, broken = (site.url("/static"), site.url("/flaky?key=h&fail=1&code=503"),
                         site.url("/status?code=500"))
    await dispatch(bus, hsettings, [ok, flaky, broken])
    reader = HistoryReader(bus.js)
    before = await reader.read(task_id_for_url(ok, hsettings))
    assert before is not None and states(before) == [["queued"]] and before.generations[0].events[0].source == "seen"

    await work(bus, hsettings)
    success = await reader.read(task_id_for_url(ok, hsettings))
    assert success is not None and states(success) == [["queued", "running", "rendered", "archived"]]
    events = success.generations[0].events
    assert events[1].attempt == 1 and events[2].status == 200 and events[1].worker == hsettings.worker.name
    assert events[3].archive is not None and events[3].archive.startswith((hsettings.archive_dir()).as_uri())
    assert events[0].at <= events[1].at <= events[2].at and success.url == ok

    recovered = await reader.read(task_id_for_url(flaky, hsettings))
    assert recovered is not None
    assert states(recovered) == [["queued", "running", "retrying", "running", "rendered", "archived"]]
    retry = recovered.generations[0].events[2]
    assert retry.attempt == 1 and retry.reason == "http_503" and "503" in (retry.error or "")
    assert [e.attempt for e in recovered.generations[0].events if e.state == "running"] == [1, 2]

    died = await reader.read(task_id_for_url(broken, hsettings))
    assert died is not None and died.state == "dead"
    assert states(died) == [["queued", "running", "retrying", "running", "dead"]]
    assert died.generations[0].events[-1].reason == "http_500"

    # Dispatched again with --force: a second generation, queued, the first one kept as it was.
    await dispatch(bus, hsettings, [ok], force=True)
    again = await reader.read(task_id_for_url(ok, hsettings))
    assert again is not None and states(again) == [["queued", "running", "rendered", "archived"], ["queued"]]
    assert again.state == "queued" and again.generations[1].dispatched_at > again.generations[0].dispatched_at

    # The command shows the same, looked up by a URL spelled differently.
    env = settings_env(hsettings)
    spelled = ok.replace("http://", "HTTP://") + "#section"
    shown = await asyncio.to_thread(cli.busscrape, "task", spelled, "--json", env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert states(TaskHistory.model_validate(orjson.loads(shown.stdout))) == states(again)
    table = await asyncio.to_thread(cli.busscrape, "task", died.task_id, env={**env, "COLUMNS": "200"}, timeout=60)
    assert table.returncode == 0 and "http_500" in table.stdout and table.stdout.count("retrying") == 1
    missing = await asyncio.to_thread(cli.busscrape, "task", "0" * 32, env=env, timeout=60)
    assert missing.returncode == 1 and "no task" in missing.stderr


def test_the_task_command_refuses_what_dispatch_would_reject(tmp_path, nats_url):
    env = settings_env(make_settings(tmp_path, nats_url))
    bad = cli.busscrape("task", "ftp://example.com/", env=env, timeout=60)
    assert bad.returncode == 2 and "unsupported_scheme" in bad.stderr


async def test_the_task_command_shows_what_a_page_wrote_as_text(applied, settings):
    # A retry's error and the worker's name carry markup and escape sequences (a page's error
    # text can say anything); the table must show them, not obey them.
    board = StatusBoard(applied.js)
    url = "http://127.0.0.2:8000/x"
    task_id = task_key(url)
    await board.record(TaskStatus(task_id=task_id, state="retrying", at=datetime.now(UTC), url=url,
                                  attempt=1, reason="page_error", error=HOSTILE, worker=HOSTILE[:40]))
    shown = await asyncio.to_thread(cli.busscrape, "task", task_id, env={**settings_env(settings), "COLUMNS": "400"},
                                    timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown_safely(shown.stdout), shown.stdout
