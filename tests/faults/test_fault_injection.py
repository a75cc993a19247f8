"""Nothing is lost: a few hundred tasks through real processes while everything fails.

During the run the harness SIGKILLs a random worker every few seconds (and restarts it),
SIGKILLs nats-server and restarts it on the same store, takes S3 down for 25 s, SIGKILLs the
ingester, publishes poison messages straight into TASKS and RESULTS, and leaves chunks that no
object names in ARTIFACTS. Then it counts: every dispatched task archived exactly once or
dead-lettered with a reason, TASKS and RESULTS empty of work, no task in two archive folders,
every poison message in DEADLETTER, no artifacts left in the object store (the workers'
stray-chunk sweep purges chunks that lost their meta). It prints one line:
``tasks=N archived=A dead=D lost=0 duplicates=0 faults=F``.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiohttp import web

from busscrape.bus import provision, topology
from busscrape.bus.connection import Bus
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.ops.nats_server import EmbeddedNatsServer
from tests.conftest import make_settings
from tests.faults.harness import Fleet, audit
from tests.support.site import Site

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.s3, pytest.mark.timeout(900)]

TASKS = 200
WORKERS = 2


@pytest.fixture
def fault_site():
    with Site(hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4")) as site:
        @site.route("/p")
        async def page(request: web.Request) -> web.Response:
            n = request.query.get("n", "0")
            return web.Response(text=f"<title>page {n}</title><h1>page {n}</h1><img src=/i.svg>"
                                     + "<p>filler text</p>" * 200, content_type="text/html")

        site.page("/i.svg", "<svg xmlns='http://www.w3.org/2000/svg' width='8' height='8'/>",
                  headers={"Content-Type": "image/svg+xml"})
        yield site


async def test_nothing_is_lost_under_faults(tmp_path, s3, fault_site, capsys):
    nats = EmbeddedNatsServer(tmp_path / "nats").start()
    settings = make_settings(
        tmp_path, nats.url,
        network={"allow": [f"{h}/32" for h in fault_site.hosts]},
        streams={"worker_ack_wait": "6s", "worker_max_deliver": 12, "ingester_ack_wait": "20s"},
        worker={"concurrency": 2, "navigation_timeout": "20s", "retry_base_delay": "500ms", "retry_max_delay": "3s",
                "grace_period": "2s", "stray_chunk_interval": "40s"},
        ingester={"retry_base_delay": "500ms", "retry_max_delay": "3s"},
        s3=s3.settings(f"faults-{uuid.uuid4().hex[:8]}"),
        nats={"connect_timeout": 5},
    )
    fleet = Fleet(tmp_path, settings, nats, s3)
    try:
        async with await Bus.connect(settings, name="faults") as bus:
            await provision.apply(bus.js, topology.load(settings))
            for i in range(WORKERS):
                fleet.start_worker(f"worker-{i + 1}")
            fleet.start_ingester()

            urls = tmp_path / "urls.txt"
            urls.write_text("".join(f"http://{fault_site.hosts[i % 3]}:{fault_site.port}/p?n={i}\n"
                                    for i in range(TASKS)))
            dispatched: set[str] = set()
            async with Dispatcher(bus, settings, on_published=dispatched.add) as dispatcher:
                summary = await dispatcher.dispatch(str(urls))
            assert summary.published == TASKS

            poison = await fleet.poison(bus)
            await fleet.orphan_chunks(bus)
            started = time.monotonic()

            async def chaos() -> None:
                await asyncio.sleep(3)
                await fleet.kill_a_worker()
                await asyncio.sleep(3)
                await fleet.kill_nats(down_for=2)
                await asyncio.sleep(3)
                await fleet.kill_a_worker()
                outage = asyncio.create_task(fleet.s3_outage(25))
                for _ in range(4):
                    await asyncio.sleep(5)
                    await fleet.kill_a_worker()
                await outage
                await asyncio.sleep(1.5)
                await fleet.kill_ingester()  # while it catches up on the backlog: mid-write
                await asyncio.sleep(4)
                await fleet.kill_a_worker()

            await chaos()

            async def finished() -> bool:
                report = await audit(bus, settings, dispatched)
                with capsys.disabled():
                    # Progress: "unfinished" is what is neither archived nor dead yet (only at the
                    # end does that count as lost).
                    print(f"  {time.monotonic() - started:4.0f}s archived={len(report.archived)} "
                          f"dead={len(report.dead)} unfinished={len(report.lost)} tasks_left={report.tasks_left} "
                          f"results_pending={report.results_pending}", flush=True)
                return not report.lost and report.tasks_left == 0 and report.results_pending == 0

            while not await finished():
                assert time.monotonic() - started < 600, "the fleet did not finish within 10 minutes"
                await asyncio.sleep(3)
            # The last releases land within moments; chunks whose meta a fault took are purged by
            # the workers' stray-chunk sweep on its second sighting (a pass every ~40 s here).
            for _ in range(50):
                report = await audit(bus, settings, dispatched)
                if not report.live_artifacts:
                    break
                await asyncio.sleep(2)
            faults = sum(fleet.faults.values())
            line = report.line(faults)
            strays = sum(path.read_text().count("leftovers.stray_chunks") for path in tmp_path.glob("worker-*.log"))
            with capsys.disabled():
                print(f"\n{line}  ({dict(fleet.faults)}, stray chunk sweeps that purged: {strays}, "
                      f"{time.monotonic() - started:.0f}s)")

            assert report.lost == set()
            assert report.duplicates == 0
            assert all(count == 1 for count in report.archived.values())
            assert all(d.reason for d in report.dead.values())
            assert report.tasks_left == 0 and report.results_pending == 0
            assert set(poison) <= report.poison_found, "a poison message is missing from DEADLETTER"
            assert report.live_artifacts == 0, (report.artifact_names, report.nameless_chunks)
            assert line.startswith(f"tasks={TASKS} ") and " lost=0 duplicates=0 " in line
    finally:
        fleet.stop()
        nats.stop()
