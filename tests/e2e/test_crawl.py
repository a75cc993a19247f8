"""``busscrape crawl`` end to end: real nats-server, Chromium workers (two processes), an
ingester, the site graph of ``tests.support.crawl_site`` on two loopback hosts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections import Counter
from urllib.parse import urlsplit

import pytest
from aiohttp import web

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
from tests.e2e.test_run import clean_env, cli, metas, run_env
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
    hits = crawl_site.hit_paths(site)
    assert not any(p.startswith("/private") for p in hits)  # disallowed: never requested
    assert crawl_site.hit_paths(site, 1) == {"/landing"}  # off-host: only the redirect's target
    assert site.hits[(site.hosts[0], "/robots.txt")] == 1
    assert "/a/3" not in hits  # found at depth 2: not followed
    c = summary["crawl"]
    assert c["dead"] == 1  # the download
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


HUBS, LEAVES = 6, 10


def hub_site(site) -> None:
    """An index of six hubs of ten leaves each: the hubs, rendered side by side on two workers,
    race for what is left of the budget when their links are followed. The site answers no hub
    before all six are asked for (or 20 s passed), so their follows come together."""
    site.page("/", "<title>index</title>" + "".join(f"<a href='/hub/{i}'>hub</a>" for i in range(HUBS)))
    asked: set[str] = set()
    together: list[asyncio.Event] = []

    async def hub(request: web.Request) -> web.StreamResponse:
        if not together:
            together.append(asyncio.Event())  # on the site's own loop
        asked.add(request.path)
        if len(asked) == HUBS:
            together[0].set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(together[0].wait(), 20)
        i = request.path.rsplit("/", 1)[1]
        return web.Response(text=f"<title>hub {i}</title>" + "".join(
            f"<a href='/hub/{i}/leaf/{j}'>leaf</a>" for j in range(LEAVES)), content_type="text/html")

    for i in range(HUBS):
        site.route(f"/hub/{i}")(hub)
        for j in range(LEAVES):
            site.page(f"/hub/{i}/leaf/{j}", f"<title>leaf {i}.{j}</title>")


async def test_max_pages_holds_when_pages_on_two_workers_race_for_the_last_slots(tmp_path, site):
    """--max-pages 10: the seed and its six hubs take seven; six hubs on two workers (three tabs
    each) then reserve the last three slots at once. Exactly ten pages, whoever won."""
    hub_site(site)
    proc = cli(["crawl", site.url("/"), "--workers", "2", "--concurrency", "3", "--json", "--max-pages", "10",
                "--depth", "5", "--robots", "ignore", "--artifacts", "html"], tmp_path,
               run_env(tmp_path, site, BUSSCRAPE_WORKER__HOST_CONCURRENCY="6"))
    output, _ = await asyncio.to_thread(proc.communicate, timeout=300)
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    archived = metas(tmp_path / "state" / "archive").values()
    paths = Counter(m["url"].split("/", 3)[3] for m in archived)
    assert sum(paths.values()) == 10 and max(paths.values()) == 1, paths
    assert {f"hub/{i}" for i in range(HUBS)} <= set(paths), paths
    assert sum(1 for p in paths if "/leaf/" in p) == 3, paths
    assert summary["crawl"]["budget_used"] == 10 and summary["crawl"]["links"]["budget_cut"] == HUBS * LEAVES - 3
    hubs_by_worker = Counter(m["worker"] for m in archived if m["url"].split("/", 3)[3].startswith("hub/")
                             and "/leaf/" not in m["url"])
    assert len(hubs_by_worker) == 2, hubs_by_worker  # the hubs (the racers) were on both workers


async def test_a_worker_killed_mid_crawl_loses_nothing_and_nothing_is_archived_twice(tmp_path, nats_url, site):
    crawl_site.install(site)
    images = threading.Event()
    images.set()
    waiting: set[str] = set()
    """The pages (``/w/<n>``) whose image is held: their load cannot end until ``images`` is set."""

    @site.route("/img")
    async def image(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        if not images.is_set():  # closed for the kill: the page's load waits until it opens
            waiting.add(f"/w/{request.query['n']}")
            await asyncio.to_thread(images.wait, 120)
        return web.Response(body=b"GIF89a", content_type="image/gif")

    for n in range(1, 201):  # a wider site, so the kill lands mid-crawl
        links = "".join(f"<a href='/w/{m}'>{m}</a>" for m in (n + 1, n * 2) if m <= 200)
        site.page(f"/w/{n}", f"<html><title>w{n}</title><body>{links}<a href='/slow?s=0.3&n={n}'>s</a>"
                             f"<img src='/img?n={n}'></body></html>")
    pages.install(site)
    site.page("/", "<html><body><a href='/w/1'>w</a></body></html>")
    settings = make_settings(tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]})
    # The fleet's per-host limit above what the workers hold (2 × 2): fleet-wide politeness would
    # otherwise leave a worker with only deferred tasks at times, and the kill could take no page down.
    env = env_for(settings, BUSSCRAPE_WORKER__CONCURRENCY="2", BUSSCRAPE_WORKER__HOST_CONCURRENCY="8")
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
            # Mid-crawl, while w1 holds a page (on a loaded machine its browser can still be
            # starting when the other worker has archived six): the kill must take pages down.
            # The images close first, and the pages held are those whose image waits: their load
            # cannot end, so they are surely in flight when the kill lands (a page merely seen
            # running could be done by then: reading STATUS takes longer than a page under load).
            images.clear()
            held: list[str] = []

            async def w1_holds_a_page() -> bool:
                held[:] = await _running_on(bus, tracker, "w1", paths=frozenset(waiting))
                return bool(held)

            try:
                await wait_until(w1_holds_a_page, timeout=120, every=0.2)
                kill9(procs["w1"])
            finally:
                images.set()
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
    # The kill took the pages w1 held down with it, and another worker redid them. (Not "attempt > 1":
    # killed before its `reached` mark, a delivery rightly spends no attempt.)
    redone = {r.task_id: r.worker for r in stored if r.task_id in held}
    assert redone.keys() == set(held) and all(worker != "w1" for worker in redone.values()), (held, redone)


async def _running_on(bus: Bus, tracker: Tracker, worker: str, paths: frozenset[str] | None = None) -> list[str]:
    """The tasks ``worker`` holds: those whose latest STATUS record is ``running`` there (and
    whose URL's path is one of ``paths``, when given)."""
    board = StatusBoard(bus.js)
    held = []
    for task_id, state in list(tracker.state.items()):
        if state == "running":
            found = await board.latest(task_id)
            record = found[0] if found is not None else None
            if record is not None and record.state == "running" and record.worker == worker and (
                    paths is None or urlsplit(record.url or "").path in paths):
                held.append(task_id)
    return held


async def _archived_at_least(tracker: Tracker, n: int) -> bool:
    return tracker.counts().get("archived", 0) >= n


GRAPH = ("--depth", str(crawl_site.GRAPH_DEPTH), "--strip-tracking", "--sitemaps", "--artifacts", "html",
         "--workers", "2", "--concurrency", "3", "--json")


@pytest.mark.long
@pytest.mark.timeout(900)  # three crawls, ~580 renders: 264 s serially on a loaded machine, past 300 s in parallel
async def test_a_500_page_graph_over_two_hosts_interrupted_and_resumed_archives_exactly_its_pages_once(tmp_path):
    from tests.e2e.test_run import EmbeddedNatsServer
    from tests.support.site import Site

    with Site(hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4")) as site:
        expected = crawl_site.install_graph(site)
        assert len(expected) >= 500
        env = run_env(tmp_path, site)
        command = ["crawl", site.url("/"), site.url("/", host=1), *GRAPH]
        archive = tmp_path / "state" / "archive"
        first = cli(command, tmp_path, env)
        await wait_until(lambda: _at_least(archive, len(expected) // 3), timeout=240)
        first.send_signal(signal.SIGINT)  # halfway: pages in flight on both workers
        output, _ = await asyncio.to_thread(first.communicate, timeout=120)
        assert first.returncode == 130, output[-3000:]
        assert len(metas(archive)) < len(expected)
        second = cli(command, tmp_path, env)  # the same command again resumes the crawl
        output, _ = await asyncio.to_thread(second.communicate, timeout=300)
        assert second.returncode == 0, output[-3000:]
        summary = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
        hits = dict(site.hits)
        # The budget, on the same graph: another crawl (other options, another id), cut at 40.
        budget = cli(["crawl", site.url("/"), site.url("/", host=1), *GRAPH, "--max-pages", "40",
                      "--label", "budget=1"], tmp_path, env)
        budget_output, _ = await asyncio.to_thread(budget.communicate, timeout=300)
        assert budget.returncode == 0, budget_output[-3000:]
    hosts = {addr: n for n, addr in enumerate(site.hosts)}
    found = list(metas(archive).values())
    crawl_id = summary["crawl"]["crawl_id"]
    graph = [m for m in found if m["crawl"]["crawl_id"] == crawl_id]

    def key(url: str) -> tuple[int, str]:
        rest = url.split("://", 1)[1]
        authority, _, path = rest.partition("/")
        return hosts[authority.split(":")[0]], "/" + path

    # Exactly the in-scope reachable pages, at their depth (seeds and sitemap pages are 0).
    assert {key(m["url"]): m["crawl"]["depth"] for m in graph} == expected
    assert len(graph) == len(expected)
    # Each once, though the first run was interrupted with pages in flight: one result and one
    # `archived` per task in the run's store.
    with EmbeddedNatsServer(tmp_path / "state" / "nats") as server:
        async with await Bus.connect(make_settings(tmp_path, server.url), name="inspect") as bus:
            results = Counter(decode(ScrapeResult, m.data).task_id
                              for m in await stream_messages(bus.js, names.RESULTS_STREAM))
            board = StatusBoard(bus.js)
            twice = [t for t in results if sum(s.state == "archived" for s in await board.history(t)) > 1]
    assert twice == [] and max(results.values()) == 1
    # Nothing out of scope, disallowed or past the depth was requested (the site logs every request).
    asked = {(hosts[h], path) for (h, path), n in hits.items() if n}
    assert not any(path.startswith(("/private", "/deeper")) for _, path in asked)
    assert {path for h, path in asked if h == 2} == {"/landing"}  # off-host: only the redirect's target
    pages_asked = {(h, path.split("?")[0]) for h, path in expected} | {(0, "/file.bin"), (2, "/landing")}
    assert {(h, p) for h, p in asked - pages_asked if p != "/robots.txt" and "sitemap" not in p} == set()
    assert hits[(site.hosts[0], "/cal")] <= 3 + 2 * 3  # d=1..3, a render in flight at the SIGINT redone at most
    c = summary["crawl"]
    assert c["dead"] == 1  # the download
    assert c["links"]["robots_disallowed"] > 0 and c["links"]["out_of_scope"] > 0 and c["links"]["depth_cut"] > 0
    assert c["links"]["duplicate"] > 3 * len(expected) // 2  # the spellings, loops and cross-host links
    # The budget: exactly 40 pages of that crawl queued, however the two workers raced; each
    # archived but the download if it was among them (dead-lettered: a page of the budget too).
    b = json.loads([line for line in budget_output.splitlines() if line.startswith("{")][-1])["crawl"]
    cut = [m for m in metas(archive).values() if m["crawl"]["crawl_id"] == b["crawl_id"]]
    assert b["budget_used"] == 40 and b["links"]["queued"] == 40 and len(cut) + b["dead"] == 40
    assert len(cut) == b["archived"] and b["links"]["budget_cut"] > 0
    assert {key(m["url"]) for m in cut} <= set(expected)


async def _at_least(archive, n: int) -> bool:
    return len(metas(archive)) >= n


async def test_a_crawl_whose_seed_was_blocked_says_so_and_runs_when_asked_again_with_allow(tmp_path, site):
    """Issue 36.1, as docs/crawl.md runs it: without --allow the seed is refused (exit 2, which seed
    and how to open it); the same command with --allow resumes the same crawl and archives it."""
    crawl_site.install(site)
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    args = ["crawl", site.url("/b"), "--depth", "0", "-w", "1", "--json"]
    proc = cli(args, tmp_path, env)
    output, _ = await asyncio.to_thread(proc.communicate, timeout=300)
    assert proc.returncode == 2, output[-3000:]
    assert "nothing to crawl" in output and f"{site.url('/b')}: blocked" in output and "--allow" in output
    first = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    proc = cli([*args, "--allow", site.hosts[0]], tmp_path, env)
    output, _ = await asyncio.to_thread(proc.communicate, timeout=300)
    assert proc.returncode == 0, output[-3000:]
    again = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    assert again["crawl"]["crawl_id"] == first["crawl"]["crawl_id"] and again["archived"] == 1
    assert archived_paths(tmp_path / "state" / "archive") == Counter({"b": 1})
