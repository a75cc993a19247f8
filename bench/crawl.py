"""Benchmark: ``busscrape crawl`` vs Crawlee's PlaywrightCrawler crawling the same site graph.

The graph is the e2e test's (``tests.support.crawl_site.install_graph``: 546 in-scope pages linked
from the seeds on two loopback hosts; JavaScript-made links, four spellings per link, a calendar,
off-host links, a robots-disallowed section), crawled from both hosts' home pages to depth 3,
with the same Chromium and the same concurrency, one after the other in one run:

(a) ``busscrape crawl`` on its embedded server, one worker: HTML, screenshot, HAR, text and WARC
    of every page, archived to a folder; robots.txt obeyed;
(c) Crawlee for Python's ``PlaywrightCrawler`` with ``enqueue_links(strategy="same-hostname")``
    and ``max_crawl_depth=3``: HTML and a screenshot into its key-value store
    (``bench/crawlee_peer.py --crawl-depth 3``, from a separate venv).

Each is timed as a whole command (its browser's start included; busscrape's also starts its
nats-server and ingester). Printed: pages and pages/s of each, the ratio a/c (goal >= 1.5), and
busscrape's link extraction + enqueue cost per page, p50 (goal <= 5 ms): reading the links in
the page (``timings.links``), keeping them (``timings.links_kept``) and following them (the page
record's ``follow_ms``: normalise, scope, policy, robots, SEEN, budget, create), beside Crawlee's
``enqueue_links`` per page.

    .venv/bin/python bench/crawl.py --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import crawl_site
from tests.support.site import Site

from bench.bare import CAP
from busscrape.crawl.state import CrawlState
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import BrowserSettings, Settings
from busscrape.worker.browser.chromium import launch_args, require_chromium

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
DEPTH = 3


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}, **extra}


def busscrape_crawl(seeds: list[str], workdir: Path, concurrency: int,
                    max_pages: int | None = None) -> tuple[int, float, dict]:
    env = clean_env(BUSSCRAPE_STATE_DIR=str(workdir / "state"),
                    BUSSCRAPE_NETWORK__ALLOW=json.dumps([f"{h}/32" for h in HOSTS]),
                    BUSSCRAPE_WORKER__HOST_CONCURRENCY=str(concurrency))
    cmd = [sys.executable, "-m", "busscrape", "crawl", *seeds, "--depth", str(DEPTH), "--strip-tracking",
           "--workers", "1", "--concurrency", str(concurrency), "--json"]
    if max_pages is not None:  # a budget: its compare-and-set and settle on every page's links
        cmd += ["--max-pages", str(max_pages)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env, cwd=workdir)
    seconds = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, 1) or not lines:
        raise SystemExit(f"busscrape crawl failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    summary = json.loads(lines[-1])
    return summary["crawl"]["archived"], seconds, summary


def crawlee_crawl(seeds: list[str], workdir: Path, concurrency: int, python: str) -> tuple[int, float, float]:
    binary = require_chromium(BrowserSettings())
    seeds_file = workdir / "seeds.txt"
    seeds_file.write_text("".join(s + "\n" for s in seeds))
    cmd = [python, str(ROOT / "bench" / "crawlee_peer.py"), str(seeds_file), "--concurrency", str(concurrency),
           "--cap", str(CAP), "--args", " ".join(launch_args(BrowserSettings())), "--crawl-depth", str(DEPTH)]
    if binary.path:
        cmd += ["--chromium", binary.path]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=clean_env(), cwd=workdir)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"crawlee failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["pages"], seconds, out.get("enqueue_ms_p50", float("nan"))


async def link_costs(workdir: Path, crawl_id: str) -> dict[str, list[float]]:
    """Per followed page: reading + keeping + following its links (ms), from the run's store."""
    timings = {}
    for meta in (workdir / "state" / "archive").glob("dt=*/host=*/*/meta.json"):
        doc = json.loads(meta.read_text())
        timings[doc["task_id"]] = doc.get("timings") or {}
    with EmbeddedNatsServer(workdir / "state" / "nats") as server:
        from busscrape.bus.connection import Bus

        settings = Settings(state_dir=workdir / "state", nats={"url": server.url})
        async with await Bus.connect(settings, name="bench-crawl") as bus:
            pages = await CrawlState(bus.js).pages(crawl_id)
    costs: dict[str, list[float]] = {"total": [], "read": [], "keep": [], "follow": []}
    for task_id, record in pages.items():
        if "follow_ms" in record and task_id in timings:
            t = timings[task_id]
            parts = {"read": t.get("links", 0.0), "keep": t.get("links_kept", 0.0), "follow": record["follow_ms"]}
            for name, ms in parts.items():
                costs[name].append(ms)
            costs["total"].append(sum(parts.values()))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--crawlee-python", default=str(ROOT / ".venv-crawlee" / "bin" / "python"))
    parser.add_argument("--no-crawlee", action="store_true", help="(a) alone")
    parser.add_argument("--max-pages", type=int, help="(a) with a page budget (one that does not bind: "
                        "what the budget's round trips cost)")
    args = parser.parse_args()
    with Site(hosts=HOSTS) as site, tempfile.TemporaryDirectory() as tmp:
        expected = crawl_site.install_graph(site)
        seeds = [site.url("/"), site.url("/", host=1)]
        workdir = Path(tmp)
        (workdir / "a").mkdir()
        (workdir / "c").mkdir()
        a_pages, a_seconds, summary = busscrape_crawl(seeds, workdir / "a", args.concurrency, args.max_pages)
        costs = asyncio.run(link_costs(workdir / "a", summary["crawl"]["crawl_id"]))
        linked = sum(1 for _, path in expected if not path.startswith("/only-sitemap"))
        total = sorted(costs["total"])
        line = (f"graph: {linked} in-scope pages linked from the seeds to depth {DEPTH}, concurrency "
                f"{args.concurrency}\n(a) busscrape crawl: {a_pages} pages archived in {a_seconds:.1f} s = "
                f"{a_pages / a_seconds:.2f} pages/s; link extraction + enqueue per page over {len(total)} pages: "
                f"p50 {statistics.median(total):.2f} ms (goal <= 5), p90 {total[int(0.9 * (len(total) - 1))]:.2f} ms"
                "; p50 of its parts: " + ", ".join(f"{k} {statistics.median(v):.2f} ms"
                                                   for k, v in costs.items() if k != "total"))
        print(line, flush=True)
        if args.no_crawlee:
            return
        if not Path(args.crawlee_python).exists():
            print(f"no Crawlee at {args.crawlee_python}: (c) skipped")
            return
        c_pages, c_seconds, c_enqueue = crawlee_crawl(seeds, workdir / "c", args.concurrency, args.crawlee_python)
        print(f"(c) Crawlee PlaywrightCrawler: {c_pages} pages in {c_seconds:.1f} s = {c_pages / c_seconds:.2f} "
              f"pages/s; enqueue_links per page p50 {c_enqueue:.2f} ms")
        print(f"a/c = {(a_pages / a_seconds) / (c_pages / c_seconds):.2f} (goal >= 1.5)")


if __name__ == "__main__":
    main()
