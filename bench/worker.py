"""Benchmark: pages/s of `busscrape worker` vs a bare Playwright loop doing the same work.

Both render the same pages of the multi-origin bench site (bench/site.py) with the same
Chromium, the same concurrency, the same per-task isolation (reused tabs wiped between tasks)
and the same captures: rendered HTML, visible text, a full-page PNG screenshot (height-capped the
same way) and a HAR without bodies. The bare loop (bench/bare.py) is the practical limit; the
worker also runs the network-policy proxy, stores every artifact in the NATS object store and
publishes a result before acking each task. Browser launch is outside both timings.

    .venv/bin/python bench/worker.py --pages 300 --concurrency 4 --rounds 2
    .venv/bin/python bench/worker.py --rss-pages 2000     # worker memory over a long run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bare import bare_loop
from bench.benchsite import ORIGINS, BenchSite
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.model.messages import ScrapeTask, encode, task_key
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.telemetry.logs import configure as configure_logs
from busscrape.worker.daemon import Worker


def bus_settings(workdir: Path, url: str, concurrency: int, max_tasks: int) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": url},
                    network={"allow": [f"{o}/32" for o in ORIGINS]},
                    worker={"concurrency": concurrency, "host_concurrency": concurrency, "max_tasks": max_tasks,
                            "reaper": False},
                    telemetry={"http_port": None, "log_level": "warning"})


async def enqueue_all(bus: Bus, urls: list[str]) -> None:
    for url in urls:
        task = ScrapeTask(task_id=task_key(url), url=url, original_url=url)
        await bus.js.publish(names.seen_key_subject(task.task_id), encode(task))
    while (await bus.js.stream_info(names.TASKS_STREAM)).state.messages < len(urls):  # noqa: ASYNC110 - polls NATS
        await asyncio.sleep(0.1)


async def bus_worker(urls: list[str], concurrency: int, workdir: Path, sample_rss: bool = False) -> float:
    """``busscrape worker`` over the same URLs; returns seconds from first fetch to last ack."""
    with EmbeddedNatsServer(workdir / "nats") as server:
        settings = bus_settings(workdir, server.url, concurrency, len(urls))
        async with await Bus.connect(settings, name="bench") as bus:
            for info in await bus.js.streams_info():
                await bus.js.delete_stream(info.config.name)
            await provision.apply(bus.js, topology.load(settings))
            await enqueue_all(bus, urls)
            async with Worker(bus, settings) as worker:
                sampler = asyncio.create_task(_sample(worker)) if sample_rss else None
                started = time.perf_counter()
                await worker.run()
                elapsed = time.perf_counter() - started
                if sampler:
                    sampler.cancel()
            results = (await bus.js.stream_info(names.RESULTS_STREAM)).state.messages
            if results != len(urls):
                raise SystemExit(f"worker produced {results} results for {len(urls)} tasks: {dict(worker.counters)}")
    return elapsed


async def _sample(worker: Worker) -> None:
    print(f"{'tasks':>6} {'worker MB':>10} {'chromium MB':>12} {'total MB':>9}")
    while True:
        python_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                         if line.startswith("VmRSS:"))
        chromium = worker.pool.rss() if worker.pool else 0
        done = worker.counters.get("completed", 0)
        total = (python_kb * 1024 + chromium) / 2**20
        print(f"{done:>6} {python_kb / 1024:>10.0f} {chromium / 2**20:>12.0f} {total:>9.0f}",
              flush=True)
        await asyncio.sleep(10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rss-pages", type=int, default=0, help="instead: run the worker over this many pages "
                                                                  "and print its memory every 10s")
    args = parser.parse_args()
    configure_logs(level="warning")  # the worker runs in this process: keep its per-task lines out
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.rss_pages:
            seconds = await bus_worker(site.urls(args.rss_pages), args.concurrency, workdir, sample_rss=True)
            print(f"{args.rss_pages} pages in {seconds:.0f}s ({args.rss_pages / seconds:.2f} pages/s)")
            return
        urls = site.urls(args.pages)
        await bare_loop(urls[:8], args.concurrency)  # warm the site and the disk cache
        ratios = []
        for r in range(args.rounds):
            bare = args.pages / await bare_loop(urls, args.concurrency)
            bus = args.pages / await bus_worker(urls, args.concurrency, workdir / f"round{r}")
            ratios.append(bus / bare)
            print(f"round {r + 1}: bare Playwright {bare:.2f} pages/s, busscrape worker {bus:.2f} pages/s, "
                  f"ratio {bus / bare:.2f}", flush=True)
        print(f"pages={args.pages} concurrency={args.concurrency} median ratio worker/bare = "
              f"{statistics.median(ratios):.2f} (target >= 0.9)")


if __name__ == "__main__":
    asyncio.run(main())
