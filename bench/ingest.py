"""Ingester throughput vs a raw obstore upload loop (the same library), in one run, on loopback.

    .venv/bin/python bench/ingest.py [--results 2000] [--concurrency 8] [--upload-concurrency 8]

Starts its own nats-server and S3-protocol server (MinIO through Docker when it answers, else
moto_server; reached directly, not through the tests' fault-injection proxy, or with ``--rtt-ms``
through ``bench/rtt_proxy.py``, which makes every request a round trip longer), queues N results
the way workers do (HTML ~100 KB, PNG ~300 KB, HAR ~200 KB in ARTIFACTS, the result on RESULTS),
then measures:

- raw:      obstore ``put_async`` of the very objects the ingester stores (gzipped HTML
            and HAR, the PNG, a meta.json) for N results, ``upload-concurrency`` at a time;
- ingester: ``Ingester`` archiving the N results end to end (read ARTIFACTS, verify, gzip,
            upload, meta.json, ack, release the artifacts) with the same upload concurrency.

The two alternate in ``--rounds`` rounds (N / rounds results each) and their times are summed,
so that load from other processes on the machine falls on both alike. Prints both rates and
their ratio (target: ingester >= 0.9 x raw), and the CPU seconds each process used.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import obstore
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.s3 import S3Server  # noqa: E402

from busscrape.archive.layout import GZIP_LEVEL  # noqa: E402
from busscrape.archive.storage.s3 import S3Storage  # noqa: E402
from busscrape.artifacts.store import ArtifactStore, object_name  # noqa: E402
from busscrape.bus import names, provision, topology  # noqa: E402
from busscrape.bus.connection import Bus  # noqa: E402
from busscrape.ingest.daemon import Ingester  # noqa: E402
from busscrape.model.messages import ScrapeResult, encode  # noqa: E402
from busscrape.ops.nats_server import EmbeddedNatsServer  # noqa: E402
from busscrape.settings import Settings  # noqa: E402
from busscrape.telemetry import logs  # noqa: E402

VARIANTS = 16  # distinct page sets; every result still has its own artifacts in ARTIFACTS
WORDS = b"the quick brown fox jumps over lazy dogs while busscrape renders pages into archives".split()


def page(rng: random.Random, size: int) -> bytes:
    """HTML that compresses like real pages do (markup and text, not random bytes)."""
    parts = [b"<!doctype html><html><head><title>bench</title></head><body>"]
    total = 0
    while total < size:
        text = b" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        line = b'<div class="item-%d"><a href="/p/%d">%s</a><p>%s</p></div>\n' % (
            rng.randint(0, 999), rng.randint(0, 10**6), text[:30], text)
        parts.append(line)
        total += len(line)
    return b"".join(parts) + b"</body></html>"


def har(rng: random.Random, size: int) -> bytes:
    entries, total = [], 0
    while total < size:
        entry = {"startedDateTime": "2025-01-01T00:00:00.000Z", "time": rng.random() * 100,
                 "request": {"method": "GET", "url": f"https://example.org/asset/{rng.randint(0, 10**9)}.js",
                             "headers": [{"name": "accept", "value": "*/*"}]},
                 "response": {"status": 200, "headers": [{"name": "content-type", "value": "text/javascript"}],
                              "content": {"size": rng.randint(100, 90000), "mimeType": "text/javascript"}},
                 "timings": {"wait": rng.random() * 50, "receive": rng.random() * 5}}
        entries.append(entry)
        total += 330
    return orjson.dumps({"log": {"version": "1.2", "creator": {"name": "bench"}, "entries": entries}})


def variants() -> list[dict[str, bytes]]:
    rng = random.Random(5)
    return [{"page.html": page(rng, 100_000), "screenshot.png": b"\x89PNG\r\n\x1a\n" + os.urandom(300_000),
             "page.har": har(rng, 200_000)} for _ in range(VARIANTS)]


KINDS = {"page.html": ("html", "text/html; charset=utf-8"), "screenshot.png": ("screenshot", "image/png"),
         "page.har": ("har", "application/json")}


async def produce(js, pages: list[dict[str, bytes]], count: int, window: int = 16) -> None:
    """Queue ``count`` results as workers do (artifacts first, then the result)."""
    store = ArtifactStore(js)
    gate = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with gate:
            task_id = uuid.uuid4().hex
            files = pages[i % len(pages)]
            refs = [await store.put(object_name(task_id, 1, 1, name), data, KINDS[name][1], kind=KINDS[name][0],
                                    file=name) for name, data in files.items()]
            result = ScrapeResult(task_id=task_id, task_seq=1, url=f"https://site{i % 50}.example/p/{i}",
                                  original_url=f"https://site{i % 50}.example/p/{i}", final_url="https://x/",
                                  status=200, artifacts=tuple(refs), worker="bench", attempt=1,
                                  scraped_at=datetime.now(UTC), timings={"total": 1000.0})
            await js.publish(names.result_subject(task_id), encode(result), headers={names.MSG_ID: task_id})

    await asyncio.gather(*(one(i) for i in range(count)))


def stored_objects(files: dict[str, bytes]) -> list[tuple[str, bytes, str]]:
    """What the ingester stores for one result: gzipped text, the image as is, a meta.json."""
    meta = orjson.dumps({"objects": [{"key": "x" * 80, "sha256": "0" * 64} for _ in files], "pad": "m" * 1500})
    return [("page.html.gz", gzip.compress(files["page.html"], GZIP_LEVEL), "text/html"),
            ("screenshot.png", files["screenshot.png"], "image/png"),
            ("page.har.gz", gzip.compress(files["page.har"], GZIP_LEVEL), "application/json"),
            ("meta.json", meta, "application/json")]


class Raw:
    """obstore put_async of the stored objects, ``concurrency`` at a time, into one bucket (the
    store the storage under test built: same client, credentials and connection pool settings)."""

    def __init__(self, cfg, pages: list[dict[str, bytes]], concurrency: int) -> None:
        self.objects = [stored_objects(files) for files in pages]
        self.storage = S3Storage(cfg, bucket=f"raw-{uuid.uuid4().hex[:8]}")
        self.concurrency = concurrency
        self.done = 0
        self.sent = 0

    async def round(self, count: int) -> float:
        if self.done == 0:
            await self.storage.__aenter__()  # creates the bucket
        gate = asyncio.Semaphore(self.concurrency)

        async def put(key: str, data: bytes, ctype: str) -> None:
            async with gate:
                await obstore.put_async(self.storage.store, key, data, attributes={"Content-Type": ctype},
                                        use_multipart=False)
                self.sent += len(data)

        started = time.perf_counter()
        await asyncio.gather(*(put(f"raw/{i}/{name}", data, ctype) for i in range(self.done, self.done + count)
                               for name, data, ctype in self.objects[i % len(self.objects)]))
        self.done += count
        return time.perf_counter() - started


async def ingester_round(bus: Bus, storage: S3Storage, settings: Settings, count: int) -> float:
    s = settings.with_overrides(ingester={"max_results": count})
    ingester = Ingester(bus, storage, s)
    async with ingester:
        started = time.perf_counter()
        counters = await ingester.run()
        elapsed = time.perf_counter() - started
    if counters["archived"] != count:
        raise SystemExit(f"ingester archived {counters['archived']} of {count}: {counters}")
    return elapsed


async def stored_bytes(storage: S3Storage) -> int:
    return sum([meta["size"] async for batch in obstore.list(storage.store) for meta in batch])


def start_relay(host: str, port: int, rtt_ms: float) -> tuple[subprocess.Popen[bytes], int]:
    """``bench/rtt_proxy.py`` in front of the server, and the port it listens on."""
    relay = subprocess.Popen([sys.executable, str(ROOT / "bench" / "rtt_proxy.py"), "--upstream", f"{host}:{port}",
                              "--delay-ms", str(rtt_ms)], stdout=subprocess.PIPE)
    assert relay.stdout is not None
    return relay, int(relay.stdout.readline())


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(args: argparse.Namespace) -> None:
    logs.configure("console", "warning")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        nats = EmbeddedNatsServer(Path(tmp) / "nats")
        nats.start()
        s3 = S3Server(Path(tmp)).start()
        relay: subprocess.Popen[bytes] | None = None
        try:
            host, port = s3.proxy.upstream  # straight to the server: no proxy thread in this process
            if args.rtt_ms:  # a store a round trip away: both loops reach it through the same relay
                relay, port = start_relay(host, port, args.rtt_ms)
                host = "127.0.0.1"
            settings = Settings(
                state_dir=Path(tmp) / "state", nats={"url": nats.url},
                s3={"endpoint": f"{host}:{port}", "access_key": s3.access_key, "secret_key": s3.secret_key,
                    "bucket": f"ingest-{uuid.uuid4().hex[:8]}"},
                ingester={"concurrency": args.concurrency, "upload_concurrency": args.upload_concurrency},
                telemetry={"http_port": None},
            )
            pages = variants()
            per_result = sum(len(d) for d in pages[0].values())
            away = f", {args.rtt_ms:g} ms away" if relay else ""
            print(f"S3 server: {s3.kind}{away}; {args.results} results of {per_result / 1000:.0f} KB (HTML, PNG, HAR) "
                  f"in {args.rounds} rounds; {args.concurrency} results and {args.upload_concurrency} uploads at once")
            raw = Raw(settings.s3, pages, args.upload_concurrency)
            raw_s = ing_s = 0.0
            pids = {"ingester": os.getpid(), "s3": s3._process.pid if s3._process else 0, "nats": nats.process.pid}
            if relay is not None:
                pids["relay"] = relay.pid
            cpu = {mode: {name: 0.0 for name in pids} for mode in ("raw", "ingester")}
            async with await Bus.connect(settings, name="bench-ingest") as bus, \
                    S3Storage(settings.s3, max_uploads=args.upload_concurrency) as storage:
                await provision.apply(bus.js, topology.load(settings))
                for r in range(args.rounds):
                    count = args.results // args.rounds + (1 if r < args.results % args.rounds else 0)
                    await produce(bus.js, pages, count)
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    raw_s += await raw.round(count)
                    middle = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    ing_s += await ingester_round(bus, storage, settings, count)
                    for name, pid in pids.items():
                        cpu["raw"][name] += middle[name] - before[name]
                        cpu["ingester"][name] += cpu_seconds(pid) - middle[name]
                ing_bytes = await stored_bytes(storage)
            await raw.storage.__aexit__(None, None, None)
        finally:
            if relay is not None:
                relay.kill()
                relay.wait()
            s3.stop()
            nats.stop()
    raw_bytes = raw.sent
    raw_rate, ing_rate = args.results / raw_s, args.results / ing_s
    print(f"raw obstore puts       : {raw_rate:8.1f} results/s  {raw_bytes / raw_s / 1e6:7.1f} MB/s stored  "
          f"({raw_s:.1f}s)")
    print(f"ingester end to end    : {ing_rate:8.1f} results/s  {ing_bytes / ing_s / 1e6:7.1f} MB/s stored  "
          f"({ing_s:.1f}s; {args.results * per_result / ing_s / 1e6:.1f} MB/s of artifacts read)")
    print(f"ratio ingester/raw     : {ing_rate / raw_rate:.2f}  (target >= 0.9)")
    for mode, used in cpu.items():
        print(f"CPU per result, {mode:8s}: " + ", ".join(
            f"{'bench process' if name == 'ingester' else name} {1000 * sec / args.results:.0f} ms"
            for name, sec in used.items()))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8, help="results archived at once")
    parser.add_argument("--upload-concurrency", type=int, default=8, help="objects uploaded at once (both runs)")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of raw and ingester")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="reach the S3 server through a relay that adds this round trip (bench/rtt_proxy.py)")
    asyncio.run(main(parser.parse_args()))
