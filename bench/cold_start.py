"""Benchmark: a cold ``busscrape run`` — how long from the command to the first page archived.

Each round runs ``busscrape run`` of N URLs of bench/site.py (default 10) on a fresh state
folder (embedded nats-server, streams, a worker and an ingester process, Chromium: nothing
warm but the disk cache), and reads the time of each start-up step off the JSON log lines of
the run and of its daemons (every line has its UTC time), measured from the moment the bench
started the command:

    nats up        the embedded nats-server answers (``run.embedded_nats``)
    streams        the streams are applied (``run.streams_applied``)
    daemons        the worker and ingester processes are spawned (``daemon.started``)
    worker up      the worker process has imported its command line (``worker.starting``)
    chromium       the worker's Chromium is launched (``browser.launched``)
    first tab      the worker is bound to TASKS with a tab ready (``worker.started``)
    first render   the first task's result is published (``task.done``)
    first archived the first page is in the archive (``result.archived``)

Each round also runs a bare baseline just before: a Python process that imports Playwright,
launches the same Chromium and loads one page (``chromium alone``), so that every round gives
a ratio the machine's load falls on alike. With ``--compare-src`` each round also runs the
``busscrape`` of another source tree (e.g. a worktree of the previous commit) the same way:

    .venv/bin/python bench/cold_start.py --rounds 5
    git worktree add /tmp/old HEAD~1 && .venv/bin/python bench/cold_start.py --compare-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchsite import ORIGINS, BenchSite
from busscrape.settings import Settings, settings_env

# (label, log file stem or None for the run's own stderr, event); the first match counts.
STEPS = (
    ("nats up", None, "run.embedded_nats"),
    ("streams", None, "run.streams_applied"),
    ("daemons", None, "daemon.started"),
    ("worker up", "worker-1", "worker.starting"),
    ("chromium", "worker-1", "browser.launched"),
    ("first tab", "worker-1", "worker.started"),
    ("first render", "worker-1", "task.done"),
    ("first archived", "ingester-1", "result.archived"),
)

BARE = """
import sys, time
t0 = float(sys.argv[1])
from playwright.sync_api import sync_playwright
from busscrape.settings import BrowserSettings
from busscrape.worker.browser.chromium import launch_args, require_chromium
binary = require_chromium(BrowserSettings())
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=binary.path, args=launch_args(BrowserSettings()))
    launched = time.time() - t0
    page = browser.new_page()
    page.goto(sys.argv[2], wait_until="load")
    print(launched, time.time() - t0)
    browser.close()
"""


def events(lines: list[str]) -> list[tuple[float, str]]:
    """(UTC seconds, event) of every JSON log line."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
            at = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        out.append((at, record.get("event", "")))
    return out


def cold_run(urls: list[str], workdir: Path, concurrency: int, src: str | None = None) -> dict[str, float]:
    """Seconds from the command's start to each step of one cold run."""
    workdir.mkdir(parents=True)
    urls_file = workdir / "urls.txt"
    urls_file.write_text("".join(f"{u}\n" for u in urls))
    settings = Settings(state_dir=workdir / "state", network={"allow": [f"{o}/32" for o in ORIGINS]},
                        worker={"concurrency": concurrency, "host_concurrency": concurrency},
                        telemetry={"http_port": None, "log_level": "info", "log_format": "json"})
    # Named outright: `run` keeps its own logs at warnings unless the variable is set.
    env = {**settings_env(settings), "BUSSCRAPE_TELEMETRY__LOG_LEVEL": "info"}
    if src:
        env["PYTHONPATH"] = src
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "busscrape", "run", str(urls_file), "--workers", "1"],
                          env=env, cwd=workdir, capture_output=True, text=True, timeout=600)
    total = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"busscrape run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    logs = {None: events(proc.stderr.splitlines())}
    for stem in ("worker-1", "ingester-1"):
        logs[stem] = events((workdir / "state" / "logs" / f"{stem}.log").read_text().splitlines())
    out = {}
    for label, stem, event in STEPS:
        hits = [at for at, name in logs[stem] if event is None or name == event]
        if hits:
            out[label] = min(hits) - started
    out["whole run"] = total
    return out


def chromium_alone(url: str) -> tuple[float, float]:
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", BARE, str(started), url], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")})
    if proc.returncode != 0:
        raise SystemExit(f"bare Chromium start failed:\n{proc.stderr[-2000:]}")
    launched, loaded = (float(v) for v in proc.stdout.split())
    return launched, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--urls", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare-src", default=None, help="another busscrape source tree to run the same way")
    args = parser.parse_args()
    runs = {"new": None, "old": args.compare_src} if args.compare_src else {"new": None}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
    ratios: dict[str, list[float]] = {k: [] for k in runs}
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        chromium_alone(site.urls(1)[0])  # disk caches
        for r in range(args.rounds):
            launched, loaded = chromium_alone(site.urls(1)[0])
            line = f"round {r + 1}: chromium alone launched {launched:.2f} s, page loaded {loaded:.2f} s"
            for name, src in (list(runs.items()) if r % 2 == 0 else list(runs.items())[::-1]):
                urls = [f"{u}&cold={r}{name}" for u in site.urls(args.urls)]
                steps = cold_run(urls, Path(tmp) / f"run-{r}-{name}", args.concurrency, src)
                rounds[name].append(steps)
                ratios[name].append(steps["first archived"] / loaded)
                line += f"\n  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
            print(line, flush=True)
    for name, done in rounds.items():
        print(f"{name} median: " + ", ".join(
            f"{k} {statistics.median(s[k] for s in done if k in s):.2f} s" for k in done[0]))
        print(f"{name}: first page archived, median {statistics.median(s['first archived'] for s in done):.2f} s "
              f"(goal <= 1.5 s); {statistics.median(ratios[name]):.2f} x chromium alone (median of the rounds' ratios)")
    if args.compare_src:
        pairs = zip(rounds["new"], rounds["old"], strict=True)
        ratio = statistics.median(n["first archived"] / o["first archived"] for n, o in pairs)
        print(f"new / old, first page archived: {ratio:.2f} (median of the rounds' ratios)")

if __name__ == "__main__":
    main()
