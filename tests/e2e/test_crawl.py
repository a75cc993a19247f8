"""``busscrape crawl`` end to end: real nats-server, Chromium workers (two processes), an
ingester, the site graph of ``tests.support.crawl_site`` on two loopback hosts."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.crawl.progress import CrawlWatch
from busscrape.crawl.run import start_crawl
from busscrape.crawl.spec import CrawlSpec
from busscrape.crawl.state import CrawlState
from busscrape.model.messages import ScrapeResult, decode
from busscrape.status.records import StatusBoard
from busscrape.status.tracker import Tracker
from tests.conftest import make_settings, wipe
from tests.e2e.test_run import cli, metas, run_env
from tests.support import crawl_site, pages
from tests.support.bus import stream_messages, wait_until
from tests.support.procs import env_for, kill9, spawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def archived_paths(archive) -> Counter[str]:
    return Counter(m["url"].split("/", 3)[3] for m in metas(archive).values())


async def crawl(tmp_path, site, *args: str) -> tuple[int, str, dict]:
    proc = cli(["crawl", site.url("/"), "--workers", "2", "--json", *args], tmp_path, run_env(tmp_path, site))
    output, _ = await asyncio.to_thread(proc.communicate, timeout=300)
    (tmp_path / "crawl.out").write_text(output)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return proc.returncode, output, json.loads(lines[-1]) if lines else {}


async def test_crawl_follows_links_in_host_scope_to_depth_and_obeys_robots(tmp_path, site):
    crawl_site.install(site)
    code, output, summary = await crawl(tmp_path, site, "--depth", "2", "--strip-tracking")
    assert code == 0, output[-3000:]  # every page archived or dead-lettered (the download)
    archive = tmp_path / "state" / "archive"
    paths = archived_paths(archive)
    # Depth 0: the index; 1: its links in scope (the JavaScript-made one too; /b once for four
    # spellings; /out redirected off the host, recorded); 2: the chain's and the calendar's next.
    assert paths == Counter({"": 1, "a/1": 1, "b": 1, "js": 1, "out": 1, "calendar?d=1": 1, "a/2": 1,
                             "calendar?d=2": 1})
    assert summary["dead_by_reason"] == {"download": 1}, output[-3000:]
    hits = crawl_site.hit_paths(site)
    assert not any(p.startswith("/private") for p in hits)  # disallowed: never requested
    assert crawl_site.hit_paths(site, 1) == {"/landing"}  # off-host: only the redirect's target
    assert site.hits[(site.hosts[0], "/robots.txt")] == 1
    assert "/a/3" not in hits  # found at depth 2: not followed
    c = summary["crawl"]
    assert c["links"]["robots_disallowed"] == 1 and c["links"]["out_of_scope"] == 1
    assert c["links"]["queued"] == 9 and c["links"]["depth_cut"] >= 2
    assert c["not_followed"]["redirected_out_of_scope"] == 1
    meta = next(m for m in metas(archive).values() if m["url"].endswith("/a/2"))
    assert meta["crawl"]["depth"] == 2 and meta["crawl"]["crawl_id"] == c["crawl_id"]
    parent = next(m for m in metas(archive).values() if m["url"].endswith("/a/1"))
    assert meta["crawl"]["parent"] == parent["task_id"]


BUDGET = ("--depth", "50", "--max-pages", "4", "--robots", "ignore", "--strip-tracking")


async def test_max_pages_archives_exactly_that_many_across_two_workers(tmp_path, site):
    crawl_site.install(site)
    code, output, summary = await crawl(tmp_path, site, *BUDGET, "--wacz", "budget")
    assert code == 0, output[-3000:]
    archive = tmp_path / "state" / "archive"
    # The seed, then the index's first three new links in document order.
    assert archived_paths(archive) == Counter({"": 1, "a/1": 1, "b": 1, "private/x": 1})
    # A crawl is a web archive by default: every page has its WARC, and --wacz packed the four.
    assert all("page.warc.gz" in {o["name"] for o in m["objects"]} for m in metas(archive).values())
    assert summary["wacz"]["pages"] == 4 and (archive / summary["wacz"]["key"]).is_file()
    assert summary["crawl"]["budget_used"] == 4 and summary["crawl"]["links"]["budget_cut"] > 0
    # The same command again: the crawl is done already, nothing is rendered again.
    code, output, again = await crawl(tmp_path, site, *BUDGET)
    assert code == 0, output[-3000:]
    assert again["archived"] == 4 and sum(archived_paths(archive).values()) == 4
    # `crawl status ID` reads the same from the run's store, reopened.
    proc = cli(["crawl", "status", summary["crawl"]["crawl_id"], "--json"], tmp_path, run_env(tmp_path, site))
    output, _ = await asyncio.to_thread(proc.communicate, timeout=120)
    assert proc.returncode == 0, output[-3000:]
    status = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    assert (status["archived"], status["budget_used"], status["links"]["queued"]) == (4, 4, 4)


async def test_a_worker_killed_mid_crawl_loses_nothing_and_nothing_is_archived_twice(tmp_path, nats_url, site):
    crawl_site.install(site)
    for n in range(1, 201):  # a wider site, so the kill lands mid-crawl
        links = "".join(f"<a href='/w/{m}'>{m}</a>" for m in (n + 1, n * 2) if m <= 200)
        site.page(f"/w/{n}", f"<html><title>w{n}</title><body>{links}<a href='/slow?s=0.3&n={n}'>s</a></body></html>")
    pages.install(site)
    site.page("/", "<html><body><a href='/w/1'>w</a></body></html>")
    settings = make_settings(tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]})
    env = env_for(settings, BUSSCRAPE_WORKER__CONCURRENCY="2")
    async with await Bus.connect(settings, name="crawl-test") as bus:
        await wipe(bus)
        await provision.apply(bus.js, topology.load(settings))
        spawn(["streams", "apply"], env, tmp_path / "apply.log").wait(60)
        procs = {name: spawn(["worker"], {**env, "BUSSCRAPE_WORKER__NAME": name}, tmp_path / f"{name}.log")
                 for name in ("w1", "w2")}
        procs["ingester"] = spawn(["ingester"], env, tmp_path / "ingester.log")
        try:
            spec = CrawlSpec(seeds=(site.url("/"),), depth=30, robots="ignore", max_pages=60)
            tracker = Tracker(bus.js)
            await tracker.start()
            watch = CrawlWatch(CrawlState(bus.js), tracker, spec.crawl_id)
            await watch.start()
            watch.see("seeds", await start_crawl(bus, settings, spec))
            await wait_until(lambda: _archived_at_least(tracker, 6), timeout=180)
            kill9(procs["w1"])  # mid-crawl: it holds pages being rendered
            procs["w3"] = spawn(["worker"], {**env, "BUSSCRAPE_WORKER__NAME": "w3"}, tmp_path / "w3.log")

            async def done() -> bool:
                return watch.done

            await wait_until(done, timeout=300)
            counts = tracker.counts()
            await watch.stop()
            await tracker.stop()
            stored = [decode(ScrapeResult, m.data) for m in await stream_messages(bus.js, names.RESULTS_STREAM)]
            results = Counter(r.task_id for r in stored)
            board = StatusBoard(bus.js)
            archived_twice = [t for t in tracker.expected
                              if sum(s.state == "archived" for s in await board.history(t)) > 1]
        finally:
            for proc in procs.values():
                kill9(proc)
    assert dict(counts) == {"archived": 60}  # the budget, every page archived
    assert archived_twice == []
    assert all(n == 1 for n in results.values()), results.most_common(3)  # one result per page
    assert len(results) == 60
    assert any(r.attempt > 1 for r in stored)  # the kill did take pages down with it: they were redone


async def _archived_at_least(tracker: Tracker, n: int) -> bool:
    return tracker.counts().get("archived", 0) >= n
