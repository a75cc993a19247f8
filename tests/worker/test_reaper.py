"""The reaper against a real nats-server and Chromium: no letter for a task that did finish."""

from __future__ import annotations

import pytest

from busscrape.archive.storage.local import FileStorage
from busscrape.bus import names, provision, topology
from busscrape.ingest.daemon import Ingester
from busscrape.status.records import StatusBoard
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import count, dead_letters, enqueue, results, wait_until
from tests.worker.test_daemon import run_worker

pytestmark = pytest.mark.browser


class DiesBeforeAck(Worker):
    """SIGKILL after the result's PubAck, before the task's ack (a real kill: tests/worker/test_kills.py)."""

    async def handle(self, msg):
        async def no_ack(*a, **k):
            raise SystemExit

        msg.ack_sync = no_ack
        try:
            await super().handle(msg)
        except SystemExit:
            self.stop()


async def test_the_reaper_never_turns_an_archived_task_dead(bus, wsettings, site, tmp_path):
    pages.install(site)
    last = wsettings.with_overrides(streams={"worker_ack_wait": "2s", "worker_max_deliver": 1,
                                             "worker_max_deferrals": 0})
    await provision.apply(bus.js, topology.load(last))
    task = await enqueue(bus.js, site.url("/static"))
    async with DiesBeforeAck(bus, last.with_overrides(worker={"max_tasks": 1, "grace_period": 0.1,
                                                               "reaper": False})) as w:
        await w.run()
    assert len(await results(bus.js)) == 1 and await count(bus.js, names.TASKS_STREAM) == 1
    # The ingester archives the result; the task's one delivery ran out without an ack.
    async with FileStorage(tmp_path / "archive") as storage:
        ingester = Ingester(bus, storage, last.with_overrides(ingester={"exit_when_idle": "1s"}))
        async with ingester:
            await ingester.run()
    assert ingester.counters["archived"] == 1

    async def advised() -> bool:
        return await count(bus.js, names.ADVISORIES_STREAM) == 1

    await wait_until(advised, timeout=30)
    host = await run_worker(bus, last, exit_when_idle=5)
    assert await dead_letters(bus.js) == []
    assert host.counters["reaper_finished"] == 1 and host.counters.get("reaper_reaped", 0) == 0
    assert await count(bus.js, names.TASKS_STREAM) == 0 and await count(bus.js, names.ADVISORIES_STREAM) == 0
    latest, _ = await StatusBoard(bus.js).latest(task.task_id)
    assert latest.state == "archived"  # never archived -> dead


class DiesBeforeFollowing(Worker):
    """Dies after the page's result stands and its links are kept, before they are followed."""

    async def _follow_or_later(self, *args, **kwargs):
        raise SystemExit

    async def handle(self, msg):
        try:
            await super().handle(msg)
        except SystemExit:
            self.stop()


async def test_the_reaper_follows_the_links_of_a_crawl_page_whose_last_delivery_died_so_the_crawl_ends(
        bus, wsettings, site, tmp_path):
    from busscrape.crawl.run import start_crawl
    from busscrape.crawl.spec import CrawlSpec, crawl_task_id
    from busscrape.crawl.state import CrawlState
    from tests.support import crawl_site

    crawl_site.install(site)
    last = wsettings.with_overrides(streams={"worker_ack_wait": "2s", "worker_max_deliver": 1,
                                             "worker_max_deferrals": 0})
    await provision.apply(bus.js, topology.load(last))
    spec = CrawlSpec(seeds=(site.url("/a/1"),), robots="ignore", depth=1, max_pages=5)
    await start_crawl(bus, last, spec)
    async with DiesBeforeFollowing(bus, last.with_overrides(worker={"max_tasks": 1, "grace_period": 0.1,
                                                                     "reaper": False})) as w:
        await w.run()
    seed = crawl_task_id(spec.crawl_id, site.url("/a/1"))
    state = CrawlState(bus.js)
    assert await state.page(spec.crawl_id, seed) is None and await state.links(spec.crawl_id, seed) is not None

    async def advised() -> bool:
        return await count(bus.js, names.ADVISORIES_STREAM) == 1

    await wait_until(advised, timeout=30)
    host = await run_worker(bus, last, exit_when_idle=5)
    assert host.counters["reaper_finished"] == 1 and await dead_letters(bus.js) == []
    record = await state.page(spec.crawl_id, seed)
    assert record is not None and sorted(record["queued"]) == sorted(
        crawl_task_id(spec.crawl_id, site.url(p)) for p in ("/a/2", "/"))
    assert await state.holds(spec.crawl_id) == {} and await state.used(spec.crawl_id) == 3
    # The links the reaper queued were rendered: the crawl went on and ended.
    assert site.hits[(site.hosts[0], "/a/2")] >= 1 and await count(bus.js, names.TASKS_STREAM) == 0
