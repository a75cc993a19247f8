"""Benchmark: busscrape end to end vs the bare browser vs Crawlee, on the same pages.

In one run, on the same pages of bench/site.py and the same concurrency (C pages at once):

(a) ``busscrape run`` with its defaults: dispatch, render, HTML + text + a viewport screenshot +
    HAR, a wiped tab per task, archived to a local folder — timed from its first task running to
    the last archive, as (b) and (d) are timed once their browser is launched; (a+) the same run
    from its first task's dispatch, the worker's start-up partly in, as Crawlee's launch is in (c)
    and (e) (both read back from the STATUS bucket of the run's own embedded NATS store);
(aw) the same with the WARC as well (``--artifacts html,text,screenshot,har,warc``);
(af) ``busscrape run --full-page``: a full-page screenshot capped like the worker's;
(b) a bare Playwright loop doing (af)'s captures with the same per-task isolation (the same
    reusable-tab scheme, busscrape.tabs) and nothing else: no bus, no network-policy proxy, no
    object store, no archive — the practical limit;
(c) Crawlee for Python's PlaywrightCrawler doing HTML + a full-page screenshot with the same
    Chromium and concurrency (run from a separate venv, see bench/crawlee_peer.py);
(d) the ceiling: a bare Playwright loop with every page in one shared context, HTML, text and a
    viewport screenshot, no isolation, no HAR (bench/bare.py's ``shared_context_loop``);
(e) Crawlee with its defaults: HTML and a viewport screenshot (``crawlee_peer.py --defaults``).

The targets (#39): a/e >= 1.3 (ahead of Crawlee, both with their defaults), a/d >= 0.9 and
aw/d >= 0.85 (close to the browser's ceiling with everything on, the same screenshot kind).

Then a latency phase: tasks dispatched one at a time, slower than the fleet can render, so
none waits in the queue; the bus overhead of a task is dispatch→archived minus its render time.

    .venv/bin/python bench/e2e.py --pages 200 --concurrency 4 --rounds 2
    .venv/bin/python bench/e2e.py --rounds 0 --latency-tasks 100     # the latency phase alone
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bare import CAP, bare_loop, shared_context_loop
from bench.benchsite import ORIGINS, BenchSite
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.model.messages import ScrapeResult, ScrapeTask, decode, encode, task_key, utcnow
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.ops.supervisor import Daemons
from busscrape.settings import BrowserSettings, Settings
from busscrape.status.records import StatusBoard
from busscrape.status.tracker import Tracker
from busscrape.worker.browser.chromium import launch_args, require_chromium

ROOT = Path(__file__).resolve().parents[1]


def settings_for(workdir: Path, concurrency: int, nats_url: str | None = None) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": nats_url},
                    network={"allow": [f"{o}/32" for o in ORIGINS]},
                    worker={"concurrency": concurrency, "host_concurrency": concurrency},
                    telemetry={"http_port": None, "log_level": "warning"})


# -- (a) busscrape run ------------------------------------------------------------------------


def busscrape_run(urls_file: Path, workdir: Path, concurrency: int, *flags: str) -> tuple[float, float]:
    """Pages/s of `busscrape run`: from its first task running to the last archive (its browser
    launched, as (b) and (d) are timed), and from the first dispatch (its start-up partly in, as
    Crawlee's own launch is in (c) and (e))."""
    from busscrape.settings import settings_env

    env = settings_env(settings_for(workdir, concurrency))
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "busscrape", "run", str(urls_file), "--workers", "1", *flags],
                          env=env, cwd=workdir, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"busscrape run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return asyncio.run(_span_from_status(workdir))


async def _span_from_status(workdir: Path) -> tuple[float, float]:
    with EmbeddedNatsServer(workdir / "state" / "nats") as server:
        settings = settings_for(workdir, 1, server.url)
        async with await Bus.connect(settings, name="bench-e2e") as bus:
            # The keys from the stream's subjects: nats-py's KeyValue.keys() can come back empty
            # (its watcher may signal "done" before the first key arrives; seen once here).
            info = await bus.js.stream_info(f"KV_{names.STATUS_BUCKET}",
                                            subjects_filter=names.kv_subject(names.STATUS_BUCKET, ">"))
            board = StatusBoard(bus.js)
            first, running, last, count = None, None, None, 0
            for subject in info.state.subjects or {}:
                for status in await board.history(subject.rsplit(".", 1)[-1]):
                    if status.state == "running":
                        running = min(running or status.at, status.at)
                    if status.state == "archived":
                        count += 1
                        last = max(last or status.at, status.at)
                        if status.dispatched_at:
                            first = min(first or status.dispatched_at, status.dispatched_at)
    assert first and running and last
    return count / (last - running).total_seconds(), count / (last - first).total_seconds()


# -- (c) Crawlee --------------------------------------------------------------------------------


def crawlee(urls_file: Path, concurrency: int, python: str, *flags: str) -> float:
    binary = require_chromium(BrowserSettings())
    cmd = [python, str(ROOT / "bench" / "crawlee_peer.py"), str(urls_file), "--concurrency", str(concurrency),
           "--cap", str(CAP), "--args", " ".join(launch_args(BrowserSettings())), *flags]
    if binary.path:
        cmd += ["--chromium", binary.path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"crawlee failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["pages"] / out["seconds"]


# -- latency ------------------------------------------------------------------------------------


async def latency(urls: list[str], workdir: Path, concurrency: int, every: float,
                  warmup: int = 0) -> dict[str, list[float]]:
    """Bus overhead per task (ms): dispatch→archived minus render, with no queueing; and where it
    goes: dispatch→worker start, worker start→result published (minus render), result→archived.

    The first ``warmup`` tasks meet daemons that have just started (a cold renderer, first
    connections and lookups): their overheads are returned apart, under ``warm-up``."""
    with EmbeddedNatsServer(workdir / "state" / "nats") as server:
        settings = settings_for(workdir, concurrency, server.url)
        async with await Bus.connect(settings, name="bench-latency") as bus:
            await provision.apply(bus.js, topology.load(settings))
            tracker = Tracker(bus.js)
            await tracker.start()
            async with Daemons(settings, workers=1):
                await asyncio.sleep(5)  # the worker's browser is up before the first task
                dispatched = {}
                for url in urls:
                    task = ScrapeTask(task_id=task_key(url), url=url, original_url=url, dispatched_at=utcnow())
                    await bus.js.publish(names.seen_key_subject(task.task_id), encode(task),
                                         headers={names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
                    dispatched[task.task_id] = task.dispatched_at
                    tracker.expect(task.task_id, None)
                    await asyncio.sleep(every)
                while not tracker.done:
                    await tracker.changed(1)
            await tracker.stop()
            renders = {}
            info = await bus.js.stream_info(names.RESULTS_STREAM)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                result = decode(ScrapeResult, (await bus.js.get_msg(names.RESULTS_STREAM, seq)).data)
                renders[result.task_id] = result.timings["total"]
            board = StatusBoard(bus.js)
            phases: dict[str, list[float]] = {"overhead": [], "to worker": [], "in worker": [], "to archive": [],
                                              "warm-up": []}
            first = {task_key(url) for url in urls[:warmup]}
            for task_id, final in tracker.final.items():
                if final.state != "archived":
                    raise SystemExit(f"latency task {task_id} ended {final.state}: {final.reason} {final.error}")
                at = {s.state: s.at for s in await board.history(task_id)}
                if not {"running", "rendered", "archived"} <= set(at):
                    raise SystemExit(f"latency task {task_id}: STATUS history holds only {sorted(at)}")
                ms = {k: (v - dispatched[task_id]).total_seconds() * 1000 for k, v in at.items()}
                if task_id in first:
                    phases["warm-up"].append(ms["archived"] - renders[task_id])
                    continue
                phases["overhead"].append(ms["archived"] - renders[task_id])
                phases["to worker"].append(ms["running"])
                phases["in worker"].append(ms["rendered"] - ms["running"] - renders[task_id])
                phases["to archive"].append(ms["archived"] - ms["rendered"])
    return phases


# Ratio name -> (numerator, denominator) of the runs above; the issues' targets beside them.
# Like for like: the bare loops' times leave their browser's launch out, Crawlee's hold it, so a
# busscrape run is timed from its first task running against (b) and (d), and from its first
# dispatch ("a+": the worker's start-up partly in) against Crawlee's.
RATIOS = {"a/e": ("a+", "e"), "a/d": ("a", "d"), "aw/d": ("aw", "d"), "af/b": ("af", "b"), "af/c": ("af+", "c"),
          "d/e": ("d", "e"), "a+/d": ("a+", "d")}
TARGETS = {"a/e": 1.3, "a/d": 0.9, "aw/d": 0.85, "af/b": 0.9}
RUNS = {"a": (), "aw": ("--artifacts", "html,text,screenshot,har,warc"), "af": ("--full-page",)}
"""busscrape's configurations: their flags to ``busscrape run``."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-tasks", type=int, default=40)
    parser.add_argument("--latency-every", type=float, default=1.5, help="seconds between latency-phase tasks")
    parser.add_argument("--latency-warmup", type=int, default=2,
                        help="latency-phase tasks run first and reported apart (the daemons have just started)")
    parser.add_argument("--crawlee-python", default=str(ROOT / ".venv-crawlee" / "bin" / "python"))
    args = parser.parse_args()
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        urls = site.urls(args.pages)
        asyncio.run(bare_loop(urls[:8], args.concurrency))  # warm disk caches and the site's page cache
        ratios: dict[str, list[float]] = {}
        for r in range(args.rounds):
            urls_file = tmpdir / f"urls-{r}.txt"
            # Each round scrapes fresh URLs for busscrape (no "already seen"); same pages otherwise.
            urls_file.write_text("".join(f"{u}&round={r}\n" for u in urls))
            rate = {"b": len(urls) / asyncio.run(bare_loop(urls, args.concurrency)),
                    "d": len(urls) / asyncio.run(shared_context_loop(urls, args.concurrency))}
            if Path(args.crawlee_python).exists():
                rate["c"] = crawlee(urls_file, args.concurrency, args.crawlee_python)
                rate["e"] = crawlee(urls_file, args.concurrency, args.crawlee_python, "--defaults")
            for name, flags in RUNS.items():
                urls_file.write_text("".join(f"{u}&round={r}{name}\n" for u in urls))
                rate[name], rate[f"{name}+"] = busscrape_run(urls_file, tmpdir / f"run-{r}{name}", args.concurrency,
                                                             *flags)
            pairs = {k: rate[x] / rate[y] for k, (x, y) in RATIOS.items() if x in rate and y in rate}
            for k, v in pairs.items():
                ratios.setdefault(k, []).append(v)
            print(f"round {r + 1}: " + "  ".join(f"({k}) {v:.2f}" for k, v in rate.items()) + " pages/s  "
                  + "  ".join(f"{k}={v:.2f}" for k, v in pairs.items()), flush=True)
        if ratios:
            print(f"pages={args.pages} concurrency={args.concurrency}: medians "
                  + ", ".join(f"{k}={statistics.median(v):.2f}" + (f" (target >= {TARGETS[k]})" if k in TARGETS else "")
                              for k, v in ratios.items()))
        if not args.latency_tasks:
            return
        warm = args.latency_warmup
        phases = asyncio.run(latency(site.urls(warm + args.latency_tasks + 1000)[1000:], tmpdir / "latency",
                                     args.concurrency, args.latency_every, warmup=warm))
        overheads, warmups = phases.pop("overhead"), phases.pop("warm-up")
        print(f"bus overhead per task over {len(overheads)} tasks: p50={percentile(overheads, 0.5):.0f} ms "
              f"(target <= 50), p99={percentile(overheads, 0.99):.0f} ms (target <= 250); p50 by phase: "
              + ", ".join(f"{name} {percentile(values, 0.5):.0f} ms" for name, values in phases.items())
              + (f"; the {warm} warm-up tasks before them: " + ", ".join(f"{v:.0f} ms" for v in warmups)
                 if warmups else ""))


if __name__ == "__main__":
    main()
