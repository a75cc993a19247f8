"""Benchmark: a full RESULTS is back-pressure, and what RESULTS absorbs with the default limits.

Part 1, back-pressure. RESULTS capped at ``--room`` results, ``--pages`` tasks queued, a real
worker (Chromium, the bench site) and no ingester at first: the worker fills RESULTS, pauses,
holds what it rendered, and fetches nothing more. ``--pause`` seconds later an ingester starts
(archive in a local folder); RESULTS drains and is trimmed, the worker resumes by itself, and
every task is archived. It prints what the workers did meanwhile, and compares the run with the
same run against an uncapped RESULTS (the baseline, measured first in the same process):

- deliveries spent on the full stream (``num_redelivered``) and dead letters: both must be 0;
- how long the worker was paused, and the run's time beside the baseline's plus the pause.

Part 2, capacity. The bytes a result takes in RESULTS (measured in part 1), and from them how
many hours of an ingester or archive outage RESULTS' default ``max_bytes`` absorbs at a given
rate before the workers pause.

    .venv/bin/python bench/backpressure.py [--pages 60] [--room 12] [--pause 15]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchsite import ORIGINS, BenchSite
from bench.worker import enqueue_all
from busscrape.archive.storage import open_storage
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.ingest.daemon import Ingester
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.telemetry.logs import configure as configure_logs
from busscrape.units import parse_size
from busscrape.worker.daemon import Worker

RATES = (5, 10, 50, 100)  # pages/s for the capacity table


def settings_for(workdir: Path, url: str, pages: int) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": url},
                    network={"allow": [f"{o}/32" for o in ORIGINS]},
                    worker={"concurrency": 4, "host_concurrency": 4, "max_tasks": pages, "reaper": False},
                    ingester={"exit_when_idle": "10s"},
                    streams={"results_keep_acked": "0s"},
                    telemetry={"http_port": None, "log_level": "warning"})


async def run(urls: list[str], workdir: Path, room: int | None, pause: float) -> dict[str, float]:
    with EmbeddedNatsServer(workdir / "nats") as server:
        settings = settings_for(workdir, server.url, len(urls))
        async with await Bus.connect(settings, name="bench") as bus:
            await provision.apply(bus.js, topology.load(settings))
            if room is not None:
                config = (await bus.js.stream_info(names.RESULTS_STREAM)).config
                await bus.js.update_stream(config.evolve(max_msgs=room))
            await enqueue_all(bus, urls)
            started = time.perf_counter()
            async with Worker(bus, settings) as worker:
                working = asyncio.create_task(worker.run())
                paused_at, per_result = None, 0.0
                if room is not None:
                    while not worker.room.full:  # noqa: ASYNC110 - polls another object
                        await asyncio.sleep(0.1)
                    paused_at = time.perf_counter()
                    await asyncio.sleep(pause)
                    held = (await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)).num_pending
                    full = (await bus.js.stream_info(names.RESULTS_STREAM)).state
                    per_result = full.bytes / full.messages  # nothing trimmed yet: no ingester ran
                    print(f"  paused {paused_at - started:.1f}s in: RESULTS holds {full.messages}/{room}, "
                          f"{worker.counters['held_for_room']} rendered results held, {held} tasks not fetched",
                          flush=True)
                storage = open_storage(settings, workdir / "archive")
                async with storage:
                    ingester = Ingester(bus, storage, settings)
                    async with ingester:
                        ingesting = asyncio.create_task(ingester.run())
                        counters = await working
                        elapsed = time.perf_counter() - started
                        await ingesting
            consumer = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
            letters = (await bus.js.stream_info(names.DEADLETTER_STREAM)).state.messages
    return {"seconds": elapsed, "completed": counters["completed"], "redelivered": consumer.num_redelivered or 0,
            "dead": letters, "archived": ingester.counters["archived"], "pauses": worker.room.pauses,
            "paused": (pause if paused_at else 0.0), "bytes_per_result": per_result}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--room", type=int, default=12, help="results RESULTS may hold in part 1")
    parser.add_argument("--pause", type=float, default=15.0, help="seconds before the ingester starts")
    args = parser.parse_args()
    configure_logs(level="error")
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        urls = site.urls(args.pages)
        print("baseline: RESULTS uncapped, the ingester from the start", flush=True)
        base = await run(urls, Path(tmp) / "base", room=None, pause=0)
        print(f"  {base['seconds']:.1f}s, {base['completed']} completed, {base['archived']} archived", flush=True)
        print(f"capped: RESULTS holds {args.room} results, the ingester starts {args.pause:.0f}s after it fills",
              flush=True)
        capped = await run(urls, Path(tmp) / "capped", room=args.room, pause=args.pause)
    print(f"  {capped['seconds']:.1f}s, {capped['completed']} completed, {capped['archived']} archived, "
          f"paused {capped['pauses']}x")
    print(f"deliveries spent on the full stream: {capped['redelivered']} (must be 0); dead letters: "
          f"{capped['dead']} (must be 0)")
    print(f"time with the cap / (baseline + pause): {capped['seconds'] / (base['seconds'] + args.pause):.2f}")
    per = capped["bytes_per_result"]
    default = parse_size(Settings().streams.results_max_bytes)
    print(f"\ncapacity: {per:.0f} bytes per result in RESULTS on these pages; the default results_max_bytes "
          f"({default / 2**30:.0f} GiB) holds {default / per:,.0f} results:")
    for rate in RATES:
        print(f"  at {rate:>3} pages/s: {default / per / rate / 3600:6.1f} hours of ingester or archive outage")
    ok = capped["redelivered"] == 0 and capped["dead"] == 0 and capped["archived"] == args.pages
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
