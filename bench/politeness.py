"""Benchmark: what fleet-wide politeness costs, and how close a bound host gets to its limit.

Part 1, limits that do not bind. ``--pages`` tasks spread round-robin over ``--hosts`` loopback
hosts (127.0.1.1 …), each page answering after ``--page-time``; one worker of concurrency 4, so no
host ever has more than its 2 slots wanted. The same run with ``worker.fleet_politeness`` off and
on, alternated (off, on, on, off, … ``--rounds`` of each), in one process against one nats-server: the
median pages/s on ÷ the median off (target ≥ 0.95). What "on" adds per page: a slot create and
a slot delete on HOSTS (and a start look-up and compare-and-set where a delay or jitter is set).

Part 2, one host that binds. ``--bound-pages`` tasks on ONE host at ``host_concurrency=2``, three
workers (each with its own NATS connection and Chromium, concurrency 4). The ideal time is
N × render time / 2, with the render time measured in the same run (each result's
``timings.total``); the figure is the crawl's wall time ÷ that ideal (target ≤ 1.10). The slack
is what deferrals cost: a task that finds both slots taken comes back after ``host_busy_retry``
(±50%), so a slot may stand free for part of that.

    .venv/bin/python bench/politeness.py [--pages 120] [--hosts 40] [--bound-pages 40] [--page-time 0.3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.worker import enqueue_all
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.model.messages import ScrapeResult, decode
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.telemetry.logs import configure as configure_logs
from busscrape.worker.daemon import Worker

PORT = 18421


class Site:
    """Pages that answer after ``?s=`` seconds, on many loopback addresses, in a thread."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _page(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "0.3")))
        return web.Response(text=f"<title>{request.path_qs}</title><p>page</p>", content_type="text/html")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._page)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        for host in self.hosts:
            await web.TCPSite(self.runner, host, PORT).start()

    def __enter__(self) -> Site:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def settings_for(workdir: Path, url: str, hosts: list[str], **worker: object) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": url},
                    network={"allow": [f"{h}/32" for h in hosts]},
                    worker={"concurrency": 4, "reaper": False, **worker},
                    telemetry={"http_port": None, "log_level": "warning"})


async def fresh(bus: Bus, settings: Settings) -> None:
    await provision.apply(bus.js, topology.load(settings))
    # Everything a run leaves behind, so each run starts alike (the same task ids run again: left
    # in ARTIFACTS and STATUS, six runs grew slower in turn; with them purged, they did not).
    for stream in (names.TASKS_STREAM, names.RESULTS_STREAM, names.SEEN_STREAM, names.ATTEMPTS_STREAM,
                   names.STATUS_STREAM, names.ARTIFACTS_STREAM, names.kv_stream(names.HOSTS_BUCKET)):
        await bus.js.purge_stream(stream)


async def crawl(server_url: str, settings: Settings, urls: list[str], workers: int) -> tuple[float, list[float]]:
    """Wall time to render ``urls`` with ``workers`` workers, and each result's render time."""
    async with await Bus.connect(settings, name="bench") as bus:
        await fresh(bus, settings)
        await enqueue_all(bus, urls)
        buses = [await Bus.connect(settings, name=f"bench-w{i}") for i in range(workers)]
        try:
            instances = [Worker(b, settings.with_overrides(worker={"name": f"w{i}", "max_tasks": None}))
                         for i, b in enumerate(buses)]
            for w in instances:
                await w.__aenter__()
            started = time.perf_counter()

            async def watch() -> float:
                while True:
                    info = await bus.js.stream_info(names.RESULTS_STREAM)
                    if info.state.messages >= len(urls):
                        return time.perf_counter() - started
                    await asyncio.sleep(0.05)

            runs = [asyncio.create_task(w.run()) for w in instances]
            elapsed = await watch()
            for w in instances:
                w.stop()
            await asyncio.gather(*runs)
            for w in instances:
                await w.__aexit__(None, None, None)
            renders = []
            sub = await bus.js.pull_subscribe(">", stream=names.RESULTS_STREAM)
            while len(renders) < len(urls):
                for m in await sub.fetch(100, timeout=5):
                    renders.append(decode(ScrapeResult, m.data).timings["total"] / 1000)
            await sub.unsubscribe()
            return elapsed, renders
        finally:
            for b in buses:
                await b.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--bound-pages", type=int, default=40)
    parser.add_argument("--page-time", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=3, help="alternated off/on runs of part 1")
    args = parser.parse_args()
    configure_logs(level="error")
    hosts = [f"127.0.1.{i}" for i in range(1, args.hosts + 1)]
    with Site(hosts), tempfile.TemporaryDirectory() as tmp, EmbeddedNatsServer(Path(tmp) / "nats") as server:
        workdir = Path(tmp)
        spread = [f"http://{hosts[i % len(hosts)]}:{PORT}/p?s={args.page_time}&n={i}" for i in range(args.pages)]
        print(f"part 1: {args.pages} pages over {len(hosts)} hosts, 1 worker × 4, host_concurrency 2 (not binding)")
        rates: dict[bool, list[float]] = {False: [], True: []}
        # off, on, on, off, off, on …: a drift of the machine over the runs favours neither side.
        for on in (i % 4 in (1, 2) for i in range(2 * args.rounds)):
            s = settings_for(workdir, server.url, hosts, fleet_politeness=on, host_concurrency=2)
            elapsed, _ = await crawl(server.url, s, spread, workers=1)
            rates[on].append(args.pages / elapsed)
            print(f"  politeness {'on ' if on else 'off'}: {args.pages / elapsed:6.2f} pages/s ({elapsed:.1f}s)",
                  flush=True)
        # Medians of alternated runs: one run slowed by the machine (a shared VM) moves a mean by 10%.
        ratio = statistics.median(rates[True]) / statistics.median(rates[False])
        print(f"  on / off = {ratio:.3f} (target ≥ 0.95)")

        one = hosts[0]
        bound = [f"http://{one}:{PORT}/b?s={args.page_time * 3}&n={i}" for i in range(args.bound_pages)]
        print(f"part 2: {args.bound_pages} pages on one host, host_concurrency 2, 3 workers × 4")
        s = settings_for(workdir, server.url, hosts, host_concurrency=2, host_busy_retry="200ms")
        elapsed, renders = await crawl(server.url, s, bound, workers=3)
        render = statistics.mean(renders)
        ideal = args.bound_pages * render / 2
        print(f"  mean render {render:.3f}s; ideal {ideal:.1f}s; took {elapsed:.1f}s; "
              f"took / ideal = {elapsed / ideal:.3f} (target ≤ 1.10)")


if __name__ == "__main__":
    asyncio.run(main())
