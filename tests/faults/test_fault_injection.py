"""Nothing is lost: tasks through real processes while everything fails.

Two variants, each ending with one line, ``tasks=N archived=A dead=D lost=0 duplicates=0
faults=F``:

- **one server**, daemons of the test's own: the harness SIGKILLs a random worker every few
  seconds (and restarts it), SIGKILLs nats-server and restarts it on the same store, withholds
  every PubAck of a result for a while (a relay between workers and server: stored, never
  confirmed), fills RESULTS up (its limit down to what it holds: back-pressure), takes S3 down
  for 25 s, SIGKILLs the ingester; and it checks the stray-chunk sweep empties ARTIFACTS;
- **a three-node cluster**, every stream and bucket R3, driven as an operator drives it:
  ``busscrape run --with-daemons`` (its own workers and ingester, which it replaces when one
  dies), its URLs fed through stdin while the schedule runs: each node SIGKILLed and restarted
  in turn while pages render (a restarted node catches up while readers ask it), a worker
  SIGSTOPped past ack_wait then SIGCONTed, a worker and the ingester SIGKILLed, then a rolling
  restart (each node SIGTERMed and started again, one at a time, as a nats-server upgrade does)
  with the fleet running. ``run`` must exit 0 on its own. Three rounds in a row, each its seed.

Each run's schedule (which node, which worker, how long) comes from a seed the test prints;
``BUSSCRAPE_CHAOS_SEED=<seed>`` replays it (every round then replays that seed).

Both also publish poison messages straight into TASKS and RESULTS (the first also leaves chunks
that no object names in ARTIFACTS). Then they count: every dispatched task archived exactly
once (one folder, one result published to RESULTS, counted in a mirror of RESULTS made before the
run: the ingesters trim RESULTS itself) or dead-lettered — dead is exactly the tasks designed to
die (broken links), never a good page, whatever the outages (they cost time, never a page);
TASKS and RESULTS empty of work; every poison message in DEADLETTER.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from busscrape.bus import provision, topology
from busscrape.bus.connection import Bus
from busscrape.bus.retry import TRANSIENT
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.dispatch.identity import TaskIdentity
from busscrape.errors import StorageUnavailable
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from tests.conftest import ENV_AT_START, make_settings
from tests.faults.harness import Fleet, audit, witness_results
from tests.support.cluster import NatsCluster
from tests.support.relay import Relay
from tests.support.site import Site

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.browser, pytest.mark.s3, pytest.mark.timeout(900)]

TASKS = 200
BROKEN = 5  # links that answer 404: the only tasks that may end dead-lettered
WORKERS = 2

Chaos = Callable[[Fleet, Bus], Awaitable[None]]


def chaos_seed(capsys: pytest.CaptureFixture[str]) -> random.Random:
    """The schedule's randomness: ``BUSSCRAPE_CHAOS_SEED`` or a fresh seed, printed to replay it.
    Read from the environment the suite started with: conftest removes every ``BUSSCRAPE_``
    variable from ``os.environ`` before any test runs (settings must not leak into tests)."""
    seed = int(ENV_AT_START.get("BUSSCRAPE_CHAOS_SEED") or random.randrange(1 << 32))
    with capsys.disabled():
        print(f"\n  chaos seed {seed} (replay: BUSSCRAPE_CHAOS_SEED={seed})", flush=True)
    return random.Random(seed)


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


def fault_settings(tmp_path: Path, url: str, site: Site, s3, **streams: object) -> Settings:
    return make_settings(
        tmp_path, url,
        network={"allow": [f"{h}/32" for h in site.hosts]},
        # The keep window is long, so only the trim for room (RESULTS full) removes acked results;
        # the audit counts results in the harness's mirror of RESULTS, not in RESULTS.
        streams={"worker_ack_wait": "6s", "worker_max_deliver": 12, "ingester_ack_wait": "20s",
                 "results_keep_acked": "1h", **streams},
        worker={"concurrency": 2, "navigation_timeout": "20s", "retry_base_delay": "500ms", "retry_max_delay": "3s",
                "grace_period": "2s", "stray_chunk_interval": "40s"},
        ingester={"retry_base_delay": "500ms", "retry_max_delay": "3s"},
        s3=s3.settings(f"faults-{uuid.uuid4().hex[:8]}"),
        nats={"connect_timeout": 5},
    )


async def run_under_faults(tmp_path: Path, settings: Settings, fleet: Fleet, site: Site, chaos: Chaos,
                           capsys: pytest.CaptureFixture[str]) -> None:
    async with await Bus.connect(settings, name="faults") as bus:
        await provision.apply(bus.js, topology.load(settings))
        await witness_results(bus, settings.streams.replicas)
        for i in range(WORKERS):
            fleet.start_worker(f"worker-{i + 1}")
        fleet.start_ingester()

        urls = tmp_path / "urls.txt"
        lines = [f"http://{site.hosts[i % 3]}:{site.port}/p?n={i}\n" for i in range(TASKS)]
        broken = [f"http://{site.hosts[i % 3]}:{site.port}/missing?n={i}\n" for i in range(BROKEN)]
        urls.write_text("".join(lines + broken))
        dispatched: set[str] = set()
        async with Dispatcher(bus, settings, on_published=dispatched.add) as dispatcher:
            summary = await dispatcher.dispatch(str(urls))
        assert summary.published == TASKS + BROKEN
        may_die = dispatched & _task_ids(settings, broken)
        assert len(may_die) == BROKEN

        poison = await fleet.poison(bus)
        await fleet.orphan_chunks(bus)
        started = time.monotonic()
        await chaos(fleet, bus)

        async def finished() -> bool:
            try:
                report = await audit(bus, settings, dispatched)
            except (*TRANSIENT, StorageUnavailable) as exc:  # a node just restarted: its groups elect leaders
                with capsys.disabled():
                    print(f"  audit postponed: {exc!r}", flush=True)
                return False
            with capsys.disabled():
                # Progress: "unfinished" is what is neither archived nor dead yet (only at the
                # end does that count as lost).
                print(f"  {time.monotonic() - started:4.0f}s archived={len(report.archived)} "
                      f"dead={len(report.dead)} unfinished={len(report.lost)} tasks_left={report.tasks_left} "
                      f"results_pending={report.results_pending}", flush=True)
            return (not report.lost and report.tasks_left == 0 and report.results_pending == 0
                    and report.witness_lag == 0)

        while not await finished():
            assert time.monotonic() - started < 600, "the fleet did not finish within 10 minutes"
            await asyncio.sleep(3)
        # The last releases land within moments; chunks whose meta a fault took are purged by
        # the workers' stray-chunk sweep on its second sighting (a pass every ~40 s here, so up to
        # two or three passes after the last worker kill; longer on a loaded machine).
        deadline = time.monotonic() + 300
        while True:
            report = await audit(bus, settings, dispatched)
            if not report.live_artifacts or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        faults = sum(fleet.faults.values())
        line = report.line(faults)
        logs = "".join(path.read_text() for path in tmp_path.glob("worker-*.log"))
        with capsys.disabled():
            print(f"\n{line}  ({dict(fleet.faults)}, stray chunk sweeps that purged: "
                  f"{logs.count('leftovers.stray_chunks')}, results held for room: {logs.count('result.held')}, "
                  f"{time.monotonic() - started:.0f}s)")

        outages = logs.count("task.outage")
        with capsys.disabled():
            print(f"  deliveries lost to outages (no attempt spent): {outages}, worker pauses for an "
                  f"unavailable bus: {logs.count('bus_unavailable')}")
        assert report.lost == set()
        assert report.unexpected_dead(may_die) == {}, "a task that should have been archived was dead-lettered"
        assert set(report.dead) & dispatched == may_die
        assert report.duplicates == 0
        assert all(count == 1 for count in report.archived.values())
        archived = set(report.archived)
        assert {t: n for t, n in report.results.items() if t in archived and n != 1} == {}
        assert archived <= set(report.results), "an archived task has no result in RESULTS"
        assert all(d.reason for d in report.dead.values())
        assert report.tasks_left == 0 and report.results_pending == 0
        assert set(poison) <= report.poison_found, "a poison message is missing from DEADLETTER"
        assert report.live_artifacts == 0, (report.artifact_names, report.nameless_chunks)
        assert line.startswith(f"tasks={TASKS + BROKEN} archived={TASKS} dead={BROKEN} lost=0 duplicates=0 ")


def _task_ids(settings: Settings, lines: list[str]) -> set[str]:
    identity = TaskIdentity(settings)
    return {identity.of_url(line.strip()) for line in lines}


async def test_nothing_is_lost_under_faults(tmp_path, s3, fault_site, capsys):
    rng = chaos_seed(capsys)
    nats = EmbeddedNatsServer(tmp_path / "nats").start()
    settings = fault_settings(tmp_path, nats.url, fault_site, s3)

    async def chaos(fleet: Fleet, bus: Bus) -> None:
        await asyncio.sleep(3)
        await fleet.kill_a_worker()
        await asyncio.sleep(2)
        await fleet.lose_pubacks(8)  # each worker's results in that time: stored, never confirmed
        await fleet.kill_nats(down_for=2)
        await asyncio.sleep(3)
        await fleet.kill_a_worker()
        await fleet.fill_results(bus, 8)
        outage = asyncio.create_task(fleet.s3_outage(25))
        for _ in range(4):
            await asyncio.sleep(5)
            await fleet.kill_a_worker()
        await outage
        await asyncio.sleep(1.5)
        await fleet.kill_ingester()  # while it catches up on the backlog: mid-write
        await asyncio.sleep(4)
        await fleet.kill_a_worker()

    async with Relay(nats.port or 0) as relay:
        fleet = Fleet(tmp_path, settings, nats, s3, relay=relay, rng=rng)
        try:
            await run_under_faults(tmp_path, settings, fleet, fault_site, chaos, capsys)
        finally:
            fleet.stop()
            nats.stop()


RUN_PAGES = 100  # the cluster run's good pages: fed to `run` all through the schedule
ROUNDS = 3  # the cluster run, three times in a row (each its own seed)


@pytest.mark.parametrize("round_", range(1, ROUNDS + 1))
async def test_a_run_on_a_cluster_under_faults_loses_no_page(tmp_path, s3, fault_site, capsys, round_):
    """The issue-34 schedule, strict, as an operator runs it: ``busscrape run --with-daemons``
    against a three-node cluster (every stream R3), its URLs fed through stdin all through the
    schedule (so pages are queued and rendering while every fault happens, and the run cannot
    end before the last one): each node SIGKILLed and restarted in turn, a worker SIGSTOPped past
    ack_wait then SIGCONTed, a worker and the ingester SIGKILLed (``run`` replaces each), a
    rolling restart. The run exits 0 on its own; dead is exactly the broken links."""
    rng = chaos_seed(capsys)
    cluster = NatsCluster(tmp_path / "cluster")
    await asyncio.to_thread(cluster.start)
    settings = fault_settings(tmp_path, cluster.url, fault_site, s3, replicas=3)
    ack_wait = settings.streams.worker_ack_wait
    site = fault_site
    pages = [f"http://{site.hosts[i % 3]}:{site.port}/p?n={i}\n" for i in range(RUN_PAGES)]
    broken = [f"http://{site.hosts[i % 3]}:{site.port}/missing?n={i}\n" for i in range(BROKEN)]
    lines = pages + broken
    rng.shuffle(lines)
    # The first line fed must be a good page: the faults wait for something archived.
    lines.insert(0, lines.pop(next(i for i, line in enumerate(lines) if line in pages)))
    dispatched = _task_ids(settings, lines)
    may_die = _task_ids(settings, broken)
    fleet = Fleet(tmp_path, settings, cluster, s3, rng=rng)

    async def chaos() -> None:
        await asyncio.sleep(rng.uniform(2, 4))
        for turn, node in enumerate(rng.sample(range(3), 3)):  # each node in turn, while pages render
            await fleet.kill_node(node, down_for=rng.uniform(2, 6))
            await asyncio.sleep(rng.uniform(1, 3))
            if turn == 0:
                await fleet.freeze_a_worker(ack_wait + rng.uniform(2, 4))  # past ack_wait, then back
            elif turn == 1:
                await fleet.kill_a_worker()
            else:
                await fleet.kill_ingester()
            await asyncio.sleep(rng.uniform(1, 3))
        # A rolling restart (a nats-server upgrade): one node at a time, the fleet running.
        for node in rng.sample(range(3), 3):
            await fleet.restart_node(node)
            await asyncio.sleep(rng.uniform(1, 3))

    async def feed_during(schedule: asyncio.Task[None], left: list[str]) -> None:
        """A third of the URLs at once, then a few every second until the schedule is over."""
        fleet.feed([left.pop() for _ in range(len(left) // 3)])
        while left and not schedule.done():
            await asyncio.sleep(1)
            fleet.feed([left.pop() for _ in range(min(3, len(left)))])
        await schedule
        fleet.feed(left)
        fleet.close_input()

    try:
        async with await Bus.connect(settings, name="faults") as bus:
            await provision.apply(bus.js, topology.load(settings))
            await witness_results(bus, settings.streams.replicas)
            poison = await fleet.poison(bus)
            started = time.monotonic()
            run = fleet.start_run(["--nats-url", cluster.url], workers=WORKERS)
            fleet.feed(lines[:1])
            await fleet.daemons_started(WORKERS)
            await fleet.archiving()  # the faults begin once pages render and reach the archive
            await feed_during(asyncio.create_task(chaos()), lines[1:])
            with capsys.disabled():
                print(f"  schedule over at {time.monotonic() - started:.0f}s: {dict(fleet.faults)}", flush=True)
            try:
                await asyncio.to_thread(run.wait, 600)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"busscrape run did not end within 10 minutes of the schedule: "
                                     f"{fleet.run_log()}") from None
            assert run.stdout is not None
            out = run.stdout.read()
            run_log = fleet.run_log()
            assert run.returncode == 0, f"busscrape run exited {run.returncode}: {run_log}"
            summary = json.loads(out)
            report = await audit(bus, settings, dispatched)
            for _ in range(60):  # the witness mirror copies the last results within moments
                if report.witness_lag == 0:
                    break
                await asyncio.sleep(1)
                report = await audit(bus, settings, dispatched)
            left_in_results = report.results_pending
            if left_in_results:
                # The run ends once every page is archived or dead. A result whose ack a node's
                # restart lost (redelivered only after ingester_ack_wait), or a second copy of a
                # page archived already (its task redelivered past the worker's ack_wait), can
                # still be in RESULTS then. The next ingester must find each archived and ack it,
                # archiving nothing twice.
                fleet.start_ingester()
                deadline = time.monotonic() + settings.streams.ingester_ack_wait + 120
                while report.results_pending and time.monotonic() < deadline:
                    await asyncio.sleep(2)
                    report = await audit(bus, settings, dispatched)
    finally:
        fleet.stop()
        await asyncio.to_thread(cluster.stop)

    logs = "".join(path.read_text(errors="replace") for path in fleet.log_dir.glob("*.log"))
    line = report.line(sum(fleet.faults.values()))
    with capsys.disabled():
        print(f"\n{line}  ({dict(fleet.faults)}, {time.monotonic() - started:.0f}s; run: archived="
              f"{summary['archived']} dead={summary['dead']} {summary['dead_by_reason']})\n"
              f"  deliveries lost to outages (no attempt spent): {logs.count('task.outage')}, worker pauses for "
              f"an unavailable bus: {logs.count('bus_unavailable')}, daemons run restarted: "
              f"{(tmp_path / 'run.log').read_text(errors='replace').count('daemon.restarting')}, results left in "
              f"RESULTS when the run ended: {left_in_results}", flush=True)
    assert report.unexpected_dead(may_die) == {}, "a task that should have been archived was dead-lettered"
    assert set(report.dead) & dispatched == may_die
    assert report.lost == set()
    assert report.duplicates == 0
    assert {t: n for t, n in report.archived.items() if n != 1} == {}
    assert set(report.archived) & dispatched == dispatched - may_die
    assert (summary["tasks"], summary["archived"], summary["dead"], summary["unfinished"]) == \
        (RUN_PAGES + BROKEN, RUN_PAGES, BROKEN, 0)
    assert set(summary["dead_by_reason"]) == {"http_404"}, summary["dead_by_reason"]
    assert report.tasks_left == 0 and report.results_pending == 0
    assert set(poison) <= report.poison_found, "a poison message is missing from DEADLETTER"
