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
from tests.worker.test_daemon import run_worker, wsettings  # noqa: F401 - fixture

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


async def test_the_reaper_never_turns_an_archived_task_dead(bus, wsettings, site, tmp_path):  # noqa: F811
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
