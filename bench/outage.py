"""Benchmark: what an outage costs a run — time, and how much (never a page: #34).

In one run, the same ``busscrape run --with-daemons`` over the same ``--pages`` bench pages on
a fresh three-node loopback cluster (every stream R3) and a fresh S3-protocol archive, once per
scenario:

- ``baseline``: no fault;
- ``node_kill``: the node leading TASKS SIGKILLed once the first page is archived, started
  again ``--outage`` seconds later (its streams elect leaders elsewhere, it catches up on return);
- ``election``: every stream and bucket's leader asked to step down at once, twice, ``--outage``
  seconds apart (leaders move, no node goes away): its figure is per election;
- ``s3_down``: the archive refuses connections for ``--outage`` seconds.

For each it prints the run's wall time (start to exit), its extra time over the baseline, that
extra per second of outage, and what the run ended with (it must archive every page: an outage
costs no page). The baseline runs first and again last, and the spread of the two says how much
of a figure is the machine's noise.

    .venv/bin/python bench/outage.py [--pages 60] [--outage 10] [--workers 2] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.harness import Fleet
from tests.support.cluster import NatsCluster
from tests.support.s3 import S3Server

from bench.benchsite import ORIGINS, BenchSite
from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.settings import Settings
from busscrape.telemetry.logs import configure as configure_logs

Fault = Callable[[Fleet, Bus, float], Awaitable[None]]


async def node_kill(fleet: Fleet, bus: Bus, outage: float) -> None:
    leader = (await bus.js.stream_info(names.TASKS_STREAM)).cluster
    assert isinstance(fleet.nats, NatsCluster) and leader is not None
    index = next(i for i, node in enumerate(fleet.nats.nodes) if node.name == leader.leader)
    await fleet.kill_node(index, down_for=outage)


async def election(fleet: Fleet, bus: Bus, outage: float) -> None:
    for turn in range(2):
        if turn:
            await asyncio.sleep(outage)
        for info in await bus.js.streams_info():
            # The leader steps down; the group elects another (no node goes away).
            await bus.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{info.config.name}", b"", timeout=10)
        fleet.faults["elections"] += 1


async def s3_down(fleet: Fleet, bus: Bus, outage: float) -> None:
    await fleet.s3_outage(outage)


SCENARIOS: dict[str, Fault | None] = {"baseline": None, "node_kill": node_kill, "election": election,
                                      "s3_down": s3_down, "baseline_again": None}


def settings_for(workdir: Path, url: str, s3: S3Server, concurrency: int) -> Settings:
    return Settings(state_dir=workdir / "state", nats={"url": url, "connect_timeout": 5},
                    network={"allow": [f"{o}/32" for o in ORIGINS]},
                    worker={"concurrency": concurrency, "host_concurrency": concurrency},
                    streams={"replicas": 3}, s3=s3.settings(f"outage-{workdir.name.replace('_', '-')}"),
                    telemetry={"http_port": None, "log_level": "warning"})


async def scenario(workdir: Path, s3: S3Server, urls: list[str], fault: Fault | None, outage: float,
                   workers: int, concurrency: int) -> dict[str, object]:
    workdir.mkdir()
    cluster = NatsCluster(workdir / "cluster")
    await asyncio.to_thread(cluster.start)
    settings = settings_for(workdir, cluster.url, s3, concurrency)
    fleet = Fleet(workdir, settings, cluster, s3)
    try:
        async with await Bus.connect(settings, name="bench-outage") as bus:
            await provision.apply(bus.js, topology.load(settings))
            started = time.perf_counter()
            run = fleet.start_run(["--nats-url", cluster.url], workers=workers)
            fleet.feed([f"{url}\n" for url in urls])
            fleet.close_input()
            await fleet.archiving()
            if fault is not None:
                await fault(fleet, bus, outage)
            await asyncio.to_thread(run.wait, 3600)
            seconds = time.perf_counter() - started
            assert run.stdout is not None
            summary = json.loads(run.stdout.read() or b"{}")
            tasks = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
            logs = "".join(path.read_text(errors="replace") for path in fleet.log_dir.glob("*.log"))
    finally:
        fleet.stop()
        await asyncio.to_thread(cluster.stop)
    return {"seconds": seconds, "code": run.returncode, "archived": summary.get("archived"),
            "dead": summary.get("dead"), "faults": dict(fleet.faults),
            # Where the time went: deliveries again (a lost ack waits out ack_wait), deliveries
            # that met an outage (nak'ed, no attempt), the workers' pauses for the bus.
            "redelivered": tasks.num_redelivered or 0, "outages": logs.count('"task.outage"'),
            "pauses": logs.count('"bus_unavailable"'), "not_archived": logs.count('"result.not_archived"')}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--outage", type=float, default=10.0, help="seconds each outage lasts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="pages at once per worker")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="these scenarios (baseline always)")
    args = parser.parse_args()
    configure_logs(level="error")
    wanted = [name for name in SCENARIOS if not args.only or name in args.only or name == "baseline"]
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s3").mkdir()
        s3 = S3Server(Path(tmp) / "s3").start()
        urls = site.urls(args.pages)
        outcomes: dict[str, dict[str, object]] = {}
        try:
            for name in wanted:
                outcome = await scenario(Path(tmp) / name, s3, urls, SCENARIOS[name], args.outage,
                                         args.workers, args.concurrency)
                outcomes[name] = outcome
                print(f"{name:>14}: {outcome['seconds']:6.1f}s  exit {outcome['code']}  archived "
                      f"{outcome['archived']}/{args.pages}  dead {outcome['dead']}  redelivered "
                      f"{outcome['redelivered']}  outages met {outcome['outages']}  worker pauses {outcome['pauses']}  "
                      f"archive retries {outcome['not_archived']}  {outcome['faults'] or ''}",
                      flush=True)
        finally:
            s3.stop()
    base = float(outcomes["baseline"]["seconds"])  # type: ignore[arg-type]
    print(f"\n{args.pages} pages, {args.workers} workers x {args.concurrency}; outages of {args.outage:.0f}s")
    for name, outcome in outcomes.items():
        if name == "baseline":
            continue
        extra = float(outcome["seconds"]) - base  # type: ignore[arg-type]
        faults = outcome["faults"]
        assert isinstance(faults, dict)
        per = ("" if SCENARIOS[name] is None else f"  {extra / faults['elections']:+.1f}s per election"
               if "elections" in faults else f"  {extra / args.outage:+.2f}s per second of outage")
        print(f"{name:>14}: {float(outcome['seconds']) / base:.2f}x the baseline, {extra:+.1f}s{per}")  # type: ignore[arg-type]
    lost = [name for name, o in outcomes.items() if o["code"] != 0 or o["archived"] != args.pages]
    if lost:
        print(f"runs that did not archive every page or exit 0: {', '.join(lost)}")
    raise SystemExit(1 if lost else 0)


if __name__ == "__main__":
    asyncio.run(main())
