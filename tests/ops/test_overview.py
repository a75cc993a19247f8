"""``busscrape status`` against a real nats-server: KEDA's lag, the counts, the rates, the exit codes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import orjson
import pytest

from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names, provision, topology
from busscrape.deadletters import filing
from busscrape.model.messages import DeadLetter
from busscrape.ops.overview import Counters, lag_from_jsz, rates
from busscrape.status.records import StatusBoard, TaskStatus
from tests.conftest import make_settings
from tests.support import cli
from tests.support.bus import count, enqueue, wait_until
from tests.support.net import refused_port


def cli_env(nats_url: str, **extra: str) -> dict[str, str]:
    """A child's environment: this test's NATS, JSON logs, a wide terminal, nothing else of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update({"BUSSCRAPE_NATS__URL": nats_url, "BUSSCRAPE_NATS__CONNECT_TIMEOUT": "2",
                "BUSSCRAPE_TELEMETRY__LOG_FORMAT": "json", "COLUMNS": "200", **extra})
    return env


async def busscrape(nats_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``busscrape ARGS`` as a child process (stdin not a terminal) and wait for it."""
    return await asyncio.to_thread(cli.busscrape, *args, env=cli_env(nats_url, **env), timeout=90)


async def workers_lag_from_jsz(nats_server) -> int:
    """Our own reading of the number KEDA scales on, straight from the server's /jsz."""
    doc = await asyncio.to_thread(nats_server.jsz, acc="$G", consumers="true", config="true")
    [account] = [a for a in doc["account_details"] if a["name"] == "$G"]
    [tasks] = [s for s in account["stream_detail"] if s["name"] == "TASKS"]
    [workers] = [c for c in tasks["consumer_detail"] if c["name"] == "workers"]
    return workers["num_pending"] + workers["num_ack_pending"]


async def test_status_json_lag_equals_jsz_pending_plus_ack_pending_under_a_backlog_and_0_when_drained(
        bus, tmp_path, nats_server):
    # ack_wait far beyond the test, so the held tasks stay ack-pending however slow the machine is
    settings = make_settings(tmp_path, nats_server.url, streams={"worker_ack_wait": "5m"})
    await provision.apply(bus.js, topology.load(settings))
    for i in range(12):
        await enqueue(bus.js, f"http://127.0.0.2:1/backlog/{i}")
    await wait_until(lambda: _equals(count(bus.js, names.TASKS_STREAM), 12), timeout=20)
    sub = await bus.js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    held = await sub.fetch(5, timeout=5)  # delivered and not acked: a worker busy with them
    assert len(held) == 5

    before = await workers_lag_from_jsz(nats_server)
    proc = await busscrape(nats_server.url, "status", "--json", BUSSCRAPE_NATS__MONITOR_URL=nats_server.monitor_url)
    after = await workers_lag_from_jsz(nats_server)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    assert before == after == 12
    assert doc["lag"]["value"] == before and doc["lag"]["source"] == "jsz"
    assert doc["lag"]["consumer"] == "TASKS/workers"
    assert (doc["lag"]["num_pending"], doc["lag"]["num_ack_pending"]) == (7, 5)
    assert doc["consumers"]["TASKS/workers"]["num_ack_pending"] == 5

    fallback = await busscrape(nats_server.url, "status", "--json")  # no monitoring URL: the JetStream API
    assert orjson.loads(fallback.stdout)["lag"] | {"note": None} == doc["lag"] | {
        "source": "jetstream_api", "monitor_url": None}

    for msg in held:
        await msg.ack_sync()
    while await workers_lag_from_jsz(nats_server):
        for msg in await sub.fetch(7, timeout=5):
            await msg.ack_sync()
    drained = await busscrape(nats_server.url, "status", "--json", "--monitor-url", nats_server.monitor_url)
    assert drained.returncode == 0, drained.stderr
    lag = orjson.loads(drained.stdout)["lag"]
    assert (lag["value"], lag["source"]) == (0, "jsz")
    assert await workers_lag_from_jsz(nats_server) == 0


async def test_a_monitoring_answer_over_its_bound_is_refused_and_the_lag_read_from_the_jetstream_api(
        bus, tmp_path, nats_server):
    from aiohttp import web

    from busscrape.ops.nats_server import MAX_JSZ_BYTES

    settings = make_settings(tmp_path, nats_server.url)
    await provision.apply(bus.js, topology.load(settings))
    # A /jsz that would parse, and name the consumer, but is past the bound: it must not be read.
    real = await asyncio.to_thread(nats_server.jsz, acc="$G", consumers="true", config="true")
    huge = orjson.dumps({**real, "padding": "x" * MAX_JSZ_BYTES})

    async def jsz(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for start in range(0, len(huge), 2**20):  # in pieces, with no length up front
            await resp.write(huge[start:start + 2**20])
        return resp

    app = web.Application()
    app.router.add_get("/jsz", jsz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # a port of its own: one picked free could be taken first
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        proc = await busscrape(nats_server.url, "status", "--json", "--monitor-url", f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert proc.returncode == 0, proc.stderr
    lag = orjson.loads(proc.stdout)["lag"]
    assert lag["source"] == "jetstream_api"
    assert "larger than 8 MiB" in lag["note"], lag


async def _equals(value, expected) -> bool:
    return await value == expected


async def test_status_counts_dead_letters_by_stage_and_reason_and_sizes_the_buckets(applied, settings):
    js = applied.js
    task = await enqueue(js, "http://127.0.0.2:1/page")
    await wait_until(lambda: _equals(count(js, names.TASKS_STREAM), 1), timeout=20)  # sourced from SEEN
    filed = [("worker", "http_500"), ("worker", "http_500"), ("worker", "timeout"), ("reaper", "max_deliveries"),
             ("ingester", "artifact_unusable")]
    for i, (stage, reason) in enumerate(filed):
        letter = DeadLetter(task_id=task.task_id, stage=stage, reason=reason, error="e", url=task.url, task=task)
        await filing.file(js, letter, msg_id=f"letter-{i}")
    board = StatusBoard(js)
    for state in ("running", "retrying", "running"):  # three revisions of one key
        await board.record(TaskStatus(task_id=task.task_id, state=state))
    await board.record(TaskStatus(task_id="f" * 32, state="dead"))
    ref = await ArtifactStore(js).put("t/1/1/page.html", b"<p>x</p>" * 2000, "text/html", kind="html",
                                      file="page.html")
    closed = f"http://127.0.0.1:{refused_port()}"  # a monitoring URL nobody answers on

    proc = await busscrape(settings.nats.url, "status", "--json", "--monitor-url", closed)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc["deadletters"] == {
        "total": 5, "by_stage": {"dispatch": 0, "worker": 3, "reaper": 1, "ingester": 1},
        "by_reason": {"ingester": {"artifact_unusable": 1}, "reaper": {"max_deliveries": 1},
                      "worker": {"http_500": 2, "timeout": 1}},
        "reasons_sampled": 5, "reasons_complete": True}
    assert doc["buckets"]["SEEN"]["keys"] == 1
    assert (doc["buckets"]["STATUS"]["keys"], doc["buckets"]["STATUS"]["messages"]) == (2, 4)
    assert doc["buckets"]["ARTIFACTS"]["bytes"] > ref.size
    assert doc["streams"]["TASKS"]["messages"] == 1 and doc["streams"]["DEADLETTER"]["messages"] == 5
    assert doc["consumers"]["DEADLETTER/archivist"]["num_pending"] == 5
    assert doc["lag"]["source"] == "jetstream_api" and doc["lag"]["value"] == 1
    assert "monitoring endpoint failed" in doc["lag"]["note"]
    assert 0.9 <= doc["rates"]["seconds"] <= 5 and doc["rates"]["messages_in"]["TASKS"] == 0

    table = await busscrape(settings.nats.url, "status")
    assert table.returncode == 0, table.stderr
    assert "workers' lag (KEDA) 1 = 1 pending + 0 ack pending" in table.stdout
    assert "http_500 ×2, timeout ×1" in table.stdout and "from the JetStream API" in table.stdout


async def test_watch_refreshes_with_rates_between_refreshes_and_ctrl_c_exits_0(applied, settings):
    js = applied.js
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busscrape", "status", "--watch", "--json", "--interval", "0.5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env(settings.nats.url))
    try:
        docs = [orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 30))]
        for i in range(40):  # 40 tasks in, while it watches ...
            await enqueue(js, f"http://127.0.0.2:1/rate/{i}")
            await asyncio.sleep(0.03)
        await wait_until(lambda: _equals(count(js, names.TASKS_STREAM), 40), timeout=20)
        sub = await js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
        for msg in await sub.fetch(10, timeout=5):  # ... and 10 of them done
            await msg.ack_sync()
        settled = await count(js, names.TASKS_STREAM)
        assert settled == 30
        while (docs[-1]["streams"]["TASKS"]["last_seq"], docs[-1]["streams"]["TASKS"]["messages"]) != (40, settled):
            docs.append(orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 30)))
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # Each refresh reports the rates since the one before: together they add up to what happened.
    later = [d["rates"] for d in docs[1:]]
    into_tasks = sum(r["messages_in"]["TASKS"] * r["seconds"] for r in later)
    acked = sum(r["acks"]["TASKS/workers"] * r["seconds"] for r in later)
    assert abs(into_tasks - 40) < 0.5 and abs(acked - 10) < 0.5
    assert all(0.4 <= r["seconds"] <= 10 for r in later) and len(later) >= 2


async def test_status_exits_2_with_the_fix_when_streams_are_missing_or_nats_is_unreachable(bus, settings):
    missing = await busscrape(settings.nats.url, "status", "--json")  # `bus` wiped the server: nothing applied
    assert missing.returncode == 2 and "busscrape streams apply" in missing.stderr, missing.stderr
    nobody = await busscrape(settings.nats.url, "status", "--nats-url", f"nats://127.0.0.1:{refused_port()}")
    assert nobody.returncode == 2 and "cannot connect to NATS" in nobody.stderr, nobody.stderr


def test_rates_count_messages_in_and_messages_leaving_each_backlog():
    before = Counters(at=10.0, last_seq={"TASKS": 100, "RESULTS": 50, "DEADLETTER": 7},
                      backlog={"TASKS/workers": 20, "RESULTS/ingesters": 0}, stream_of={
                          "TASKS/workers": "TASKS", "RESULTS/ingesters": "RESULTS"})
    after = Counters(at=12.0, last_seq={"TASKS": 140, "RESULTS": 80, "DEADLETTER": 3},  # DEADLETTER recreated
                     backlog={"TASKS/workers": 30, "RESULTS/ingesters": 4}, stream_of=before.stream_of)
    assert rates(before, after) == {"seconds": 2.0, "messages_in": {"TASKS": 20.0, "RESULTS": 15.0, "DEADLETTER": 0.0},
                                    "acks": {"TASKS/workers": 15.0, "RESULTS/ingesters": 13.0}}


def test_lag_from_jsz_reads_the_named_account_stream_and_consumer_as_keda_does():
    def account(name: str, pending: int, ack_pending: int) -> dict:
        consumers = [{"name": "ingesters", "num_pending": 99, "num_ack_pending": 99},
                     {"name": "workers", "num_pending": pending, "num_ack_pending": ack_pending}]
        return {"name": name, "id": name, "stream_detail": [
            {"name": "RESULTS", "consumer_detail": [{"name": "workers", "num_pending": 50, "num_ack_pending": 50}]},
            {"name": "TASKS", "consumer_detail": consumers}]}

    doc = {"account_details": [account("OTHER", 1000, 1000), account("$G", 7, 5)]}
    assert lag_from_jsz(doc, "$G", "TASKS", "workers") == (7, 5)
    assert lag_from_jsz(doc, "OTHER", "TASKS", "workers") == (1000, 1000)
    with pytest.raises(LookupError, match="TASKS/reaper"):
        lag_from_jsz(doc, "$G", "TASKS", "reaper")



async def test_status_lists_the_hosts_cooling_for_the_fleet(applied, settings):
    from busscrape.worker.fleet_gate import FleetGate
    from busscrape.worker.host_rules import HostRules, Limit

    gate = FleetGate(applied.js, HostRules(Limit(1, 0)), holder="w7", busy_retry=1)
    await gate.cool("hot.example", 120, status=429, worker="w7")
    await gate.cool("over.example", 0.001, status=503, worker="w7")  # over by the time status looks
    out = await busscrape(settings.nats.url, "status", "--json")
    assert out.returncode == 0, out.stderr
    [row] = orjson.loads(out.stdout)["cooling"]
    assert row["host"] == "hot.example" and row["status"] == 429 and row["worker"] == "w7"
    assert 60 < row["seconds_left"] <= 120
    table = await busscrape(settings.nats.url, "status")
    assert "hosts cooling" in table.stdout and "hot.example" in table.stdout and "over.example" not in table.stdout


async def test_status_counts_a_page_written_in_parts_once(applied, settings):
    """A page record too large for one CRAWLS value is written as a head and ``<page>.<n>`` parts
    (``CrawlState.record_page``): status counts pages, not records (before: 3 followed pages for
    the one page whose 40,000 queued ids took two parts)."""
    from busscrape.crawl.frontier import Frontier
    from busscrape.crawl.spec import CrawlSpec
    from busscrape.net.policy import NetworkPolicy

    frontier = Frontier(applied.js, settings, NetworkPolicy.from_settings(["127.0.0.2/32"]))
    spec = CrawlSpec(seeds=("http://127.0.0.2:9/",), robots="ignore")
    await frontier.seed(spec)
    queued = [f"{i:032x}" for i in range(40_000)]  # 1.4 MB of task ids: over one value
    await frontier.state.record_page(spec.crawl_id, "ab" * 16, {"queued": queued})
    record = await frontier.state.page(spec.crawl_id, "ab" * 16)
    assert record is not None and record["parts"] > 1 and len(record["queued"]) == 40_000
    proc = await busscrape(settings.nats.url, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    [crawl] = orjson.loads(proc.stdout)["crawls"]
    assert crawl["followed"] == 1, crawl


async def test_status_lists_each_workers_host_slots_while_held(applied, settings):
    from busscrape.worker.fleet_gate import FleetGate, Slot
    from busscrape.worker.host_rules import HostRules, Limit

    w1 = FleetGate(applied.js, HostRules(Limit(2, 0)), holder="worker-one", busy_retry=1)
    w2 = FleetGate(applied.js, HostRules(Limit(2, 0)), holder="worker two", busy_retry=1)  # a space in a name
    held = [await w1.enter("a.example"), await w1.enter("[::1]"), await w1.enter("a.example"),
            await w2.enter("b.example")]
    assert all(isinstance(slot, Slot) for slot in held)
    out = await busscrape(settings.nats.url, "status", "--json")
    assert out.returncode == 0, out.stderr
    assert orjson.loads(out.stdout)["workers"] == [
        {"worker": "worker two", "slots": 1, "hosts": {"b.example": 1}},
        {"worker": "worker-one", "slots": 3, "hosts": {"[::1]": 1, "a.example": 2}}]
    table = await busscrape(settings.nats.url, "status")
    assert "workers rendering" in table.stdout and "a.example ×2" in table.stdout
    for slot in held:
        await slot.release()  # type: ignore[union-attr]
    out = await busscrape(settings.nats.url, "status", "--json")
    assert orjson.loads(out.stdout)["workers"] == []


async def test_status_lists_the_crawls_newest_first_with_their_counts(applied, settings):
    from busscrape.crawl.frontier import Frontier
    from busscrape.crawl.links import PageLinks
    from busscrape.crawl.spec import CrawlSpec
    from busscrape.net.policy import NetworkPolicy
    from tests.crawl.test_frontier import page_task

    frontier = Frontier(applied.js, settings, NetworkPolicy.from_settings(["127.0.0.2/32"]))
    older = CrawlSpec(seeds=("http://127.0.0.2:9/",), robots="ignore", max_pages=3)
    newer = CrawlSpec(seeds=("http://127.0.0.2:9/a", "http://127.0.0.2:9/b"), robots="ignore", depth=1)
    for spec in (older, newer):
        await frontier.seed(spec)
    page = page_task(older, "http://127.0.0.2:9/")
    await frontier.follow(page, page.url, PageLinks(tuple(f"http://127.0.0.2:9/{i}" for i in range(5)), 5,
                                                    "text/html"))
    proc = await busscrape(settings.nats.url, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    crawls = orjson.loads(proc.stdout)["crawls"]
    assert [c["crawl_id"] for c in crawls] == [newer.crawl_id, older.crawl_id]
    first, second = crawls
    assert (first["seed_count"], first["queued"], first["followed"], first["unfollowed"]) == (2, 2, 0, 2)
    assert (second["queued"], second["max_pages"], second["followed"], second["unfollowed"]) == (3, 3, 1, 2)
    assert second["holds"] == 0 and second["scope"] == "host"
    table = await busscrape(settings.nats.url, "status")
    assert table.returncode == 0, table.stderr
    assert older.crawl_id in table.stdout and "3 / 3" in table.stdout
