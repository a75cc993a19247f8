"""Dispatcher throughput vs a raw nats-py ``publish_async`` loop, in one run, on loopback.

    .venv/bin/python bench/dispatch.py [--urls 100000] [--repeat 3] [--rss-urls 1000000] [--json]

Starts its own nats-server, writes N unique URLs to a file, and measures, alternating and
each on a freshly applied set of streams (same configuration every time):

- raw:       ``js.publish_async`` of N pre-built task payloads straight into TASKS, with the same
             in-flight window (4096); no validation, no dedup, no headers;
- raw_seen:  the same loop into ``$KV.SEEN.<id>``, the way tasks really enter TASKS (sourced);
- raw_same:  the dispatcher's own messages, pre-built, headers and all (atomic create, TTL,
             Nats-Msg-Id, traceparent) into ``$KV.SEEN.<id>``: the same work for the server;
- dispatch:  ``busscrape dispatch FILE`` as a child process with full dedup (input fingerprints,
             SEEN atomic create with TTL, Nats-Msg-Id, trace context), timed from its own summary
             (reading to the last PubAck) until every task is in TASKS.

Every run ends when all N tasks are in TASKS. Prints the median rates and the median over rounds
of ``dispatch / baseline`` (target >= 0.6). With ``--rss-urls`` it then runs
``busscrape dispatch`` over that many URLs and reports the child's peak RSS (its own ``VmHWM``;
target <= 200 MB for 1,000,000) and its rate at that size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats.errors
import orjson

from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.dispatch import urls
from busscrape.model.messages import ScrapeTask, encode, task_key
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.telemetry import logs, tracing

WINDOW = 4096


def write_urls(path: Path, count: int) -> None:
    """N unique URLs over 1,000 hosts, some in spellings the normaliser has work to do on."""
    with open(path, "w") as f:
        for i in range(count):
            host = f"site{i % 1000}.example"
            if i % 10 == 0:
                f.write(f"HTTPS://{host.upper()}:443/articles/{i}/index.html?ref=feed&id={i}#comments\n")
            else:
                f.write(f"https://{host}/articles/{i}/index.html?ref=feed&id={i}\n")


Message = tuple[str, bytes, dict[str, str]]


def messages(path: Path) -> list[Message]:
    """(task id, encoded task, the dispatcher's headers) for every URL of the file, built up front."""
    out = []
    with open(path) as f:
        for line in f:
            url = urls.normalise(line)
            task_id = task_key(url)
            # A create carries no Nats-Msg-Id (issue #19: the create settles a retry by itself).
            headers = {names.MSG_TTL: str(7 * 86400), names.TRACEPARENT: tracing.new_traceparent(),
                       names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
            out.append((task_id, encode(ScrapeTask(task_id=task_id, url=url, original_url=line.strip())), headers))
    return out


async def fresh(bus: Bus, settings: Settings) -> None:
    """Delete every stream and apply streams/ again: each measurement starts from the same state."""
    for info in await bus.js.streams_info():
        await bus.js.delete_stream(info.config.name)
    await provision.apply(bus.js, topology.load(settings))


async def in_tasks(bus: Bus, count: int) -> None:
    """Poll until TASKS holds ``count`` tasks (the server does the sourcing: nothing to await)."""
    while True:
        try:
            if (await bus.js.stream_info(names.TASKS_STREAM)).state.messages >= count:
                return
        except nats.errors.TimeoutError:
            pass  # a server busy sourcing a million tasks may answer late: ask again
        await asyncio.sleep(0.005)


async def raw(bus: Bus, tasks: list[Message], subject: Callable[[str], str], with_headers: bool = False) -> float:
    js = bus.nc.jetstream(publish_async_max_pending=WINDOW)
    started = time.perf_counter()
    for task_id, payload, headers in tasks:
        await js.publish_async(subject(task_id), payload, headers=headers if with_headers else None)
    await js.publish_async_completed()
    await in_tasks(bus, len(tasks))
    return len(tasks) / (time.perf_counter() - started)


# The child reports its own peak RSS: VmHWM of its address space, which starts afresh at exec.
# (ru_maxrss would not do: Linux carries the parent's high-water mark across fork + exec.)
_CHILD = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def report():
    with open("/proc/self/status") as status, open(out, "w") as f:
        f.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(report)
sys.argv[0] = "busscrape"
runpy.run_module("busscrape", run_name="__main__", alter_sys=True)
"""


def run_dispatch(settings: Settings, path: Path) -> tuple[dict, int]:
    """``busscrape dispatch FILE --json`` as a child: (its summary, its peak RSS in bytes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update(BUSSCRAPE_NATS__URL=settings.nats.url or "", BUSSCRAPE_TELEMETRY__LOG_LEVEL="warning",
               BUSSCRAPE_TELEMETRY__LOG_FORMAT="json")
    with tempfile.TemporaryDirectory() as tmp:
        hwm = Path(tmp) / "hwm"
        done = subprocess.run([sys.executable, "-c", _CHILD, str(hwm), "dispatch", str(path), "--json",
                               "--no-progress"], env=env, capture_output=True)
        if done.returncode != 0:
            raise SystemExit(f"busscrape dispatch exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
        return orjson.loads(done.stdout), int(hwm.read_text()) * 1024  # VmHWM is in kB


async def dispatched(bus: Bus, settings: Settings, path: Path, count: int) -> tuple[float, int]:
    """(URLs/s from reading the first line to the last task in TASKS, peak RSS of the child)."""
    summary, rss = await asyncio.to_thread(run_dispatch, settings, path)
    if summary["published"] != count:
        raise SystemExit(f"dispatch published {summary['published']} of {count}: {summary}")
    # The summary times reading to the last PubAck; TASKS sources SEEN a moment later.
    lag_started = time.perf_counter()
    await in_tasks(bus, count)
    return count / (summary["seconds"] + time.perf_counter() - lag_started), rss


async def measure(args: argparse.Namespace, workdir: Path) -> dict:
    with EmbeddedNatsServer(workdir / "nats") as server:
        settings = Settings(nats={"url": server.url})
        bus = await Bus.connect(settings, name="bench-dispatch")
        path = workdir / "urls.txt"
        write_urls(path, args.urls)
        tasks = messages(path)
        rates: dict[str, list[float]] = {"raw": [], "raw_seen": [], "raw_same": [], "dispatch": []}
        runs: list[tuple[str, Callable[[], Awaitable[float]]]] = [
            ("raw", lambda: raw(bus, tasks, names.task_subject)),
            ("raw_seen", lambda: raw(bus, tasks, names.seen_key_subject)),
            ("raw_same", lambda: raw(bus, tasks, names.seen_key_subject, with_headers=True)),
            ("dispatch", lambda: _rate(dispatched(bus, settings, path, args.urls))),
        ]
        for round_ in range(args.repeat):
            for name, run in runs:
                await fresh(bus, settings)
                rate = await run()
                rates[name].append(rate)
                print(f"round {round_ + 1}: {name:<9} {rate:>9,.0f} URLs/s", file=sys.stderr)
        result: dict = {"urls": args.urls, "repeat": args.repeat, "cores": os.cpu_count(),
                        **{f"{k}_per_s": round(statistics.median(v)) for k, v in rates.items()}}
        # Ratios within each round (minutes apart at most), then the median: steadier than a ratio of
        # medians when other work on the machine comes and goes.
        for baseline in ("raw", "raw_seen", "raw_same"):
            per_round = [d / b for d, b in zip(rates["dispatch"], rates[baseline], strict=True)]
            result[f"ratio_vs_{baseline}"] = round(statistics.median(per_round), 2)
        if args.rss_urls:
            big = workdir / "big.txt"
            write_urls(big, args.rss_urls)
            await fresh(bus, settings)
            rate, rss = await dispatched(bus, settings, big, args.rss_urls)
            result.update(rss_urls=args.rss_urls, peak_rss_mb=round(rss / 2**20, 1), rss_run_per_s=round(rate))
        await bus.close()
    return result


async def _rate(run: Awaitable[tuple[float, int]]) -> float:
    return (await run)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=100_000, help="URLs per throughput run (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; medians reported")
    parser.add_argument("--rss-urls", type=int, default=1_000_000, help="URLs for the peak-RSS run (0: skip)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    logs.configure("json", "warning")
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    if args.json:
        print(orjson.dumps(result).decode())
        return
    print(f"{args.urls:,} URLs, median of {args.repeat}, {result['cores']} cores          URLs/s   dispatch/it")
    for name, label in (("raw", "raw publish_async, payloads -> TASKS"),
                        ("raw_seen", "raw publish_async, payloads -> SEEN keys"),
                        ("raw_same", "raw publish_async, same messages -> SEEN")):
        print(f"  {label:<42} {result[name + '_per_s']:>9,}   {result['ratio_vs_' + name]:>6.2f}")
    print(f"  {'busscrape dispatch (full dedup)':<42} {result['dispatch_per_s']:>9,}   (target >= 0.6)")
    if "peak_rss_mb" in result:
        print(f"  peak RSS, {result['rss_urls']:,} URLs      {result['peak_rss_mb']:>9,} MB   "
              f"(target <= 200 MB; {result['rss_run_per_s']:,} URLs/s)")


if __name__ == "__main__":
    main()
