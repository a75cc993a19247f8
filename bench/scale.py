"""What a queued task and a remembered task cost nats-server: RAM and store bytes per task.

    .venv/bin/python bench/scale.py [--sizes 100000,1000000] [--10m] [--drain status|ack|none] [--json]

For each size, on a fresh nats-server (its own store, nothing else on it) with busscrape's streams
applied: ``busscrape dispatch`` of that many unique URLs (a child process, timed from its own
summary to the last task in TASKS), then, once the server is idle, its RSS (``/proc/<pid>``) and,
from ``/jsz?streams=true&config=true``, each stream's messages, bytes and subjects, each divided by
the number of tasks. Then TASKS is drained and the same is measured again: what SEEN, STATUS and
ATTEMPTS keep for the recrawl window once the work is done.

Draining (``--drain status``, the default) is what a worker fleet leaves on the server, without
rendering: a client pulls every task from the workers' durable consumer, records the three STATUS
transitions a task that went well gets (running, rendered, archived: ``status.records``'
``TaskStatus``, encoded as the services encode it) and acks the task. RESULTS and ARTIFACTS are
empty again once the ingester has archived a result, so they are left out; ATTEMPTS holds only
failed attempts (none here). ``--drain ack`` only acks (the cost of TASKS alone); rendering a
million trivial pages would take hours here and changes nothing the server keeps.

With nats-server's profiling port (``--profile``) the heap is attributed by allocation site:
``--heap`` prints the largest sites after dispatch and after the drain (``/debug/pprof/heap``,
Go's sampled in-use bytes), which is how the per-task bytes were traced to their owners.

Goals (issue #19) at 1M queued tasks: <= 400 B RAM and <= 800 B store per task; <= 200 B RAM per
task remembered after it is done; dispatch rate at 1M >= 0.9x the rate at 100k.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import nats.errors
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ beside the package

from bench.dispatch import dispatched, fresh, write_urls
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.model.messages import encode
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from busscrape.status.records import TaskStatus
from busscrape.telemetry import logs

GOALS = {"queued_rss": 400, "queued_store": 800, "remembered_rss": 200, "rate_ratio": 0.9}
IDLE = 15.0  # seconds of quiet before RSS is read: the file store's block caches expire in ~10s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def streams(server: EmbeddedNatsServer) -> dict[str, dict]:
    """Each stream's state from ``/jsz`` (messages, bytes, subjects)."""
    doc = server.jsz(streams="true", config="true")
    out = {}
    for account in doc.get("account_details", []):
        for stream in account.get("stream_detail", []):
            state = stream["state"]
            out[stream["name"]] = {"messages": state["messages"], "bytes": state["bytes"],
                                   "subjects": state.get("num_subjects", 0)}
    return out


_FRAME = re.compile(r"^#\s+0x[0-9a-f]+\s+(\S+)\+0x")
_OWN = "github.com/nats-io/nats-server/v2/"


def heap(profile_port: int, top: int = 14) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """(largest in-use allocation sites, runtime.MemStats) from nats-server's heap profile, after
    a forced GC (``gc=1``: an idle server collects nothing by itself). Go samples one allocation
    per ``rate`` bytes; each site is scaled back up the way ``go tool pprof`` does. Read twice:
    buffers parked in a ``sync.Pool`` survive the first collection (as its victim cache)."""
    for _ in range(2):
        with urllib.request.urlopen(f"http://127.0.0.1:{profile_port}/debug/pprof/heap?debug=1&gc=1",
                                    timeout=60) as r:
            text = r.read().decode()
    rate = int(re.search(r"@ heap/(\d+)", text).group(1)) // 2  # the header prints 2 * MemProfileRate
    sites: Counter[str] = Counter()
    stats: dict[str, int] = {}
    objects = inuse = 0
    frames: list[str] = []

    def flush() -> None:
        if objects and frames:
            scale = 1 / (1 - math.exp(-(inuse / objects) / rate))
            own = [f.removeprefix(_OWN) for f in frames if f.startswith(_OWN)]
            sites[" < ".join(own[:2]) if own else frames[0]] += int(inuse * scale)
    for line in text.splitlines():
        if m := re.match(r"^(\d+): (\d+) \[", line):
            flush()
            objects, inuse, frames = int(m.group(1)), int(m.group(2)), []
        elif m := _FRAME.match(line):
            frames.append(m.group(1))
        elif line.startswith("# ") and " = " in line:
            key, _, value = line[2:].partition(" = ")
            if value.strip().isdigit():
                stats[key] = int(value)
    flush()
    return sites.most_common(top), stats


def disk(path: Path) -> int:
    """Bytes the store takes on disk (what compression saves shows here, not in ``/jsz``)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


async def drain(bus: Bus, count: int, mode: str) -> float:
    """Take every task off TASKS as the workers would (see the module docstring); tasks/s.
    The STATUS records are the services' own encoding of ``TaskStatus``, built from one encoded
    sample per state with the task's fields put in (pydantic per record made the drain the
    slowest part of the run)."""
    js = bus.nc.jetstream(publish_async_max_pending=8192)
    sub = await js.pull_subscribe_bind(names.WORKERS_CONSUMER, stream=names.TASKS_STREAM)
    samples = [encode(TaskStatus(task_id="@ID@", state=state, url="@URL@", dispatched_at=None, **extra))
               for state, extra in (("running", {"attempt": 1, "worker": "bench-worker-1"}),
                                    ("rendered", {"attempt": 1, "worker": "bench-worker-1", "status": 200}),
                                    ("archived", {"archive": "archive/dt=2026-12-02/@ID@"}))]
    started, done = time.perf_counter(), 0
    while done < count:
        try:
            msgs = await sub.fetch(2000, timeout=10)
        except nats.errors.TimeoutError:
            continue  # a busy server (two shared cores) answered late: ask again
        for msg in msgs:
            if mode == "status":
                task = orjson.loads(msg.data)
                task_id, url = task["task_id"].encode(), orjson.dumps(task["url"])[1:-1]
                at = orjson.dumps(task["dispatched_at"])
                for sample in samples:
                    record = sample.replace(b"@ID@", task_id).replace(b"@URL@", url)
                    record = record.replace(b'"dispatched_at":null', b'"dispatched_at":' + at)
                    await js.publish_async(names.kv_subject(names.STATUS_BUCKET, task["task_id"]), record)
            await bus.nc.publish(msg.reply, b"+ACK")
        done += len(msgs)
    await js.publish_async_completed()
    await bus.nc.flush()
    await sub.unsubscribe()
    return count / (time.perf_counter() - started)


def snapshot(server: EmbeddedNatsServer, count: int, profile_port: int, with_heap: bool) -> dict:
    assert server.process is not None
    out: dict = {"rss": rss(server.process.pid), "streams": streams(server), "disk": disk(server.store_dir)}
    out["disk_per_task"] = round(out["disk"] / count)
    out["rss_per_task"] = round(out["rss"] / count)
    out["store_per_task"] = round(sum(s["bytes"] for s in out["streams"].values()) / count)
    for name, s in out["streams"].items():
        s["bytes_per_task"] = round(s["bytes"] / count)
        folders = list(server.store_dir.glob(f"**/streams/{name}"))
        s["disk_per_task"] = round(sum(disk(f) for f in folders) / count)
    if with_heap:
        sites, stats = heap(profile_port)
        out["heap"] = [(site, size) for site, size in sites]
        out["heap_inuse_per_task"] = round(stats.get("HeapInuse", 0) / count)
        out["rss_after_gc_per_task"] = round(rss(server.process.pid) / count)
    return out


async def measure_size(count: int, args: argparse.Namespace, workdir: Path) -> dict:
    profile_port = free_port()
    # As shipped: the memory `busscrape run` gives its server (GOMEMLIMIT from nats.server_memory).
    with EmbeddedNatsServer(workdir / f"nats-{count}", extra_args=("--profile", str(profile_port)),
                            memory=Settings().nats.server_memory) as server:
        assert server.process is not None
        settings = Settings(nats={"url": server.url})
        bus = await Bus.connect(settings, name="bench-scale")
        await fresh(bus, settings)
        empty = rss(server.process.pid)
        path = workdir / f"urls-{count}.txt"
        write_urls(path, count)
        rate, _ = await dispatched(bus, settings, path, count)
        path.unlink()
        await asyncio.sleep(IDLE)
        result: dict = {"tasks": count, "dispatch_per_s": round(rate), "rss_empty": empty,
                        "queued": snapshot(server, count, profile_port, args.heap)}
        print(orjson.dumps(result).decode(), file=sys.stderr)  # kept even if a later phase fails
        print(f"{count:,}: dispatched at {rate:,.0f}/s; queued: {result['queued']['rss_per_task']} B RSS, "
              f"{result['queued']['store_per_task']} B store per task", file=sys.stderr)
        if args.drain != "none":
            result["drain_per_s"] = round(await drain(bus, count, args.drain))
            await asyncio.sleep(IDLE)
            result["remembered"] = snapshot(server, count, profile_port, args.heap)
            print(orjson.dumps(result["remembered"]).decode(), file=sys.stderr)
            print(f"{count:,}: drained at {result['drain_per_s']:,}/s; remembered: "
                  f"{result['remembered']['rss_per_task']} B RSS, {result['remembered']['store_per_task']} B "
                  "store per task", file=sys.stderr)
        await bus.close()
    return result


def report(results: list[dict]) -> None:
    for r in results:
        print(f"\n{r['tasks']:,} tasks: dispatch {r['dispatch_per_s']:,}/s; nats-server RSS empty "
              f"{r['rss_empty'] / 2**20:.0f} MiB")
        for phase in ("queued", "remembered"):
            if phase not in r:
                continue
            p = r[phase]
            heap_note = (f", Go heap in use after GC {p['heap_inuse_per_task']} B, RSS then "
                         f"{p['rss_after_gc_per_task']} B") if "heap_inuse_per_task" in p else ""
            print(f"  {phase:<10} RSS {p['rss'] / 2**20:,.0f} MiB = {p['rss_per_task']} B/task{heap_note}; "
                  f"store {p['store_per_task']} B/task, on disk {p['disk_per_task']} B/task")
            for name, s in sorted(p["streams"].items()):
                if s["messages"] or s["bytes"]:
                    print(f"    {name:<16} {s['messages']:>10,} msgs {s['subjects']:>10,} subjects "
                          f"{s['bytes'] / 2**20:>9,.1f} MiB  {s['bytes_per_task']:>5} B/task, "
                          f"{s['disk_per_task']:>5} B/task on disk")
            for site, size in p.get("heap", []):
                print(f"    heap {size / r['tasks']:>7.0f} B/task  {site}")
    if len(results) > 1:
        first, last = results[0], results[-1]
        ratio = last["dispatch_per_s"] / first["dispatch_per_s"]
        print(f"\nrate at {last['tasks']:,} / rate at {first['tasks']:,}: {ratio:.2f} (goal >= {GOALS['rate_ratio']})")
    big = results[-1]
    print(f"goals at {big['tasks']:,}: queued RSS {big['queued']['rss_per_task']} B (<= {GOALS['queued_rss']}), "
          f"store {big['queued']['store_per_task']} B (<= {GOALS['queued_store']})"
          + (f", remembered RSS {big['remembered']['rss_per_task']} B (<= {GOALS['remembered_rss']})"
             if "remembered" in big else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="task counts, comma-separated")
    parser.add_argument("--10m", dest="ten_million", action="store_true", help="add a 10,000,000 run")
    parser.add_argument("--drain", choices=("status", "ack", "none"), default="status",
                        help="how TASKS is drained before the remembered-task figures (default: status)")
    parser.add_argument("--heap", action="store_true", help="attribute the server's heap by allocation site")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.ten_million:
        sizes.append(10_000_000)
    logs.configure("json", "warning")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for count in sizes:
            results.append(asyncio.run(measure_size(count, args, Path(tmp))))
    if args.json:
        print(orjson.dumps(results).decode())
    else:
        report(results)


if __name__ == "__main__":
    main()
