"""Benchmark: what the demo extractor costs per page, and the worker's pages/s with it on vs off.

One run, the demo site's product pages (kettle: server HTML; lantern: price and reviews made by
JavaScript; stove: a JSON-LD product), served on loopback by the bundled demo site:

1. pages/s of ``busscrape worker`` over the same pages with the demo extractor on and off, in
   pairs of rounds in alternating order (off-on, on-off …) so that machine noise hits both alike;
   the median of the pairs' ratios is the figure (goal >= 0.95);
2. extraction cost per page, p50 and p95, two ways: the engine's own time in the extraction
   process (``Extraction.ms``, carried in every result of the "on" rounds), and the worker's whole
   round trip to that process (``ExtractionPool.extract`` on the rendered DOM the results
   archived: the HTML pickled over, the record pickled back) (goal p50 <= 10 ms).

    .venv/bin/python bench/extraction.py --pages 60 --concurrency 4 --rounds 8
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

from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.extract.pool import ExtractionPool
from busscrape.extract.registry import Registry
from busscrape.model.messages import ScrapeResult, ScrapeTask, TaskOptions, decode, encode, task_key
from busscrape.ops.demo_site import DemoSite
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.telemetry.logs import configure as configure_logs
from busscrape.worker.daemon import Worker

REPO = Path(__file__).resolve().parents[1]
PRODUCTS = ("/shop/kettle.html", "/shop/lantern.html", "/shop/stove.html")


def settings(workdir: Path, url: str, origin: str, concurrency: int, pages: int) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": url}, network={"allow": [origin]},
                    worker={"concurrency": concurrency, "host_concurrency": concurrency, "max_tasks": pages,
                            "reaper": False},
                    extract={"dir": str(REPO / "extractors")},
                    telemetry={"http_port": None, "log_level": "warning"})


async def one_round(server: EmbeddedNatsServer, site: DemoSite, workdir: Path, pages: int, concurrency: int,
                    extractor: str | None) -> tuple[float, list[ScrapeResult], Bus | None]:
    """Seconds from the worker's start of work to its last ack, and the results it published."""
    s = settings(workdir, server.url, site.origin, concurrency, pages)
    bus = await Bus.connect(s, name="bench-extraction")
    for info in await bus.js.streams_info():
        await bus.js.delete_stream(info.config.name)
    await provision.apply(bus.js, topology.load(s))
    options = TaskOptions(extractor=extractor)
    for n in range(pages):
        url = f"http://{site.origin}{PRODUCTS[n % len(PRODUCTS)]}?n={n}"
        task = ScrapeTask(task_id=task_key(url, (), options), url=url, original_url=url, options=options)
        await bus.js.publish(names.seen_key_subject(task.task_id), encode(task))
    while (await bus.js.stream_info(names.TASKS_STREAM)).state.messages < pages:  # noqa: ASYNC110 - polls NATS
        await asyncio.sleep(0.1)
    async with Worker(bus, s) as worker:
        started = time.perf_counter()
        await worker.run()
        elapsed = time.perf_counter() - started
    sub = await bus.js.pull_subscribe(names.result_subject("*"), durable=None, stream=names.RESULTS_STREAM)
    results: list[ScrapeResult] = []
    while len(results) < pages:
        batch = await sub.fetch(min(pages - len(results), 256), timeout=10)
        results += [decode(ScrapeResult, m.data) for m in batch]
    if len(results) != pages or (extractor and any(r.extraction is None for r in results)):
        raise SystemExit(f"{len(results)} results for {pages} tasks: {dict(worker.counters)}")
    return elapsed, results, bus


async def rendered_pages(bus: Bus, results: list[ScrapeResult]) -> list[tuple[str, str]]:
    """The rendered DOM (the html artifact) and final URL of every result."""
    store = ArtifactStore(bus.js, timeout=10)
    pages = []
    for result in results:
        [ref] = [a for a in result.artifacts if a.kind == "html"]
        pages.append(((await store.read(ref)).decode(), result.final_url))
    await store.close()
    return pages


async def round_trips(pages: list[tuple[str, str]]) -> list[float]:
    """The worker's round trip to an extraction process, per page."""
    times = []
    async with ExtractionPool(Registry.load(REPO / "extractors"), processes=1, timeout=30) as pool:
        for html, url in pages:
            started = time.perf_counter()
            await pool.extract("demo-product", html, url)
            times.append((time.perf_counter() - started) * 1000)
    return times


def quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of rounds (off-on, on-off, …)")
    args = parser.parse_args()
    configure_logs(level="warning")
    rates: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []
    engine_ms: list[float] = []
    pages: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNatsServer(Path(tmp) / "nats") as server:
        async with DemoSite() as site:
            warm = await one_round(server, site, Path(tmp) / "warm", min(args.pages, 12), args.concurrency,
                                   "demo-product")
            await warm[2].close()
            for r in range(args.rounds):
                # off-on, then on-off: a machine that warms up (or a neighbour that starts) favours neither.
                pair: dict[str, float] = {}
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    seconds, results, bus = await one_round(server, site, Path(tmp) / f"{mode}{r}", args.pages,
                                                            args.concurrency, "demo-product" if mode == "on" else None)
                    pair[mode] = args.pages / seconds
                    rates[mode].append(pair[mode])
                    if mode == "on":
                        engine_ms += [res.extraction.ms for res in results if res.extraction]
                        pages = await rendered_pages(bus, results)
                    await bus.close()
                ratios.append(pair["on"] / pair["off"])
                print(f"pair {r + 1}: extractor off {pair['off']:6.2f} pages/s, on {pair['on']:6.2f} pages/s, "
                      f"ratio {ratios[-1]:.3f}", flush=True)
    trips = await round_trips(pages)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    p50, p95 = quantiles(engine_ms)
    t50, t95 = quantiles(trips)
    print(f"pages={args.pages} concurrency={args.concurrency} rounds={args.rounds}")
    print(f"extraction in its process: p50 {p50:.2f} ms, p95 {p95:.2f} ms over {len(engine_ms)} pages "
          f"(goal p50 <= 10 ms: {p50 / 10:.2f} of the budget)")
    print(f"worker round trip (IPC included): p50 {t50:.2f} ms, p95 {t95:.2f} ms over {len(trips)} pages "
          f"({t50 / 10:.2f} of the budget)")
    print(f"pages/s (medians): extractor off {off:.2f}, on {on:.2f}; ratio of the medians {on / off:.3f}; "
          f"median of the {len(ratios)} pairs' ratios on/off = {statistics.median(ratios):.3f} (goal >= 0.95)")


if __name__ == "__main__":
    asyncio.run(main())
