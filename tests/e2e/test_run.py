"""``busscrape run`` and ``busscrape demo`` end to end: real processes, embedded or external NATS."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.model.messages import ScrapeResult, decode
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.status.records import StatusBoard
from tests.conftest import make_settings
from tests.support import pages
from tests.support.bus import stream_messages, wait_until
from tests.support.procs import env_for, spawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "busscrape", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def clean_env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update({"COLUMNS": "200", **extra})
    return env


def metas(archive: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in archive.glob("dt=*/host=*/*/meta.json")}


async def test_demo_archives_every_page_and_dead_letters_the_broken_link(tmp_path):
    proc = cli(["demo"], tmp_path, clean_env())
    output, _ = await asyncio.to_thread(proc.communicate, timeout=240)
    assert proc.returncode == 0, output[-3000:]
    assert "demo ok" in output and "http_404" in output
    found = metas(tmp_path / ".busscrape" / "archive")
    titles = {m["title"] for m in found.values()}
    assert len(found) == 6
    assert {"busscrape demo", "A static article", "Live feed", "Gallery", "A slow page"} <= titles
    spa = next(m for m in found.values() if m["title"] == "Live feed")
    assert spa["status"] == 200
    redirected = [m for m in found.values() if m["redirect_chain"]]
    assert len(redirected) == 1 and redirected[0]["final_url"].endswith("/static.html")
    [letter] = (tmp_path / ".busscrape" / "archive").glob("deadletter/dt=*/*.json")
    dead = json.loads(letter.read_text())
    assert dead["reason"] == "http_404" and dead["url"].endswith("/missing.html")


@pytest.fixture
def slow_urls(site, tmp_path):
    pages.install(site)
    urls = [site.url(f"/slow?s=1&n={i}") for i in range(12)]
    path = tmp_path / "urls.txt"
    path.write_text("\n".join(urls) + "\n")
    return path, urls


def run_env(tmp_path, site, **extra):
    return clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"),
                     BUSSCRAPE_NETWORK__ALLOW=json.dumps([f"{h}/32" for h in site.hosts]),
                     BUSSCRAPE_WORKER__CONCURRENCY="2", **extra)


async def results_by_task(store: Path, tmp_path: Path) -> dict[str, int]:
    """Count results per task in the run's own (embedded) NATS store, opened again."""
    with EmbeddedNatsServer(store) as server:
        settings = make_settings(tmp_path, server.url)
        async with await Bus.connect(settings, name="inspect") as bus:
            counts: dict[str, int] = {}
            for msg in await stream_messages(bus.js, names.RESULTS_STREAM):
                task_id = decode(ScrapeResult, msg.data).task_id
                counts[task_id] = counts.get(task_id, 0) + 1
            board = StatusBoard(bus.js)
            archived_twice = [t for t in counts if sum(s.state == "archived" for s in await board.history(t)) > 1]
            # what `busscrape status`, the API and a resumed run read: the outcome, not a step before it
            latest = {t: (await board.latest(t))[0].state for t in counts}  # type: ignore[index]
            assert (await bus.js.stream_info(names.TASKS_STREAM)).state.messages == 0
    assert archived_twice == []
    assert set(latest.values()) == {"archived"}, latest
    return counts


async def test_interrupted_run_resumes_and_archives_every_url_exactly_once(tmp_path, site, slow_urls):
    path, urls = slow_urls
    env = run_env(tmp_path, site)
    first = cli(["run", str(path), "--workers", "1"], tmp_path, env)
    archive = tmp_path / "state" / "archive"
    for _ in range(600):  # wait until some pages are archived, not all
        if len(metas(archive)) >= 3:
            break
        await asyncio.sleep(0.1)
    first.send_signal(signal.SIGINT)
    output, _ = await asyncio.to_thread(first.communicate, timeout=120)
    assert first.returncode == 130, output[-3000:]
    assert "interrupted" in output
    done_first = len(metas(archive))
    assert 3 <= done_first < len(urls)

    second = cli(["run", str(path), "--workers", "1"], tmp_path, env)
    output, _ = await asyncio.to_thread(second.communicate, timeout=240)
    assert second.returncode == 0, output[-3000:]
    found = metas(archive)
    assert sorted(m["url"] for m in found.values()) == sorted(urls)
    counts = await results_by_task(tmp_path / "state" / "nats", tmp_path)
    assert len(counts) == len(urls) and set(counts.values()) == {1}


async def test_run_against_an_external_nats_server(tmp_path, site, slow_urls, nats_server):
    from busscrape.bus import provision, topology

    path, urls = slow_urls
    settings = make_settings(tmp_path, nats_server.url)
    async with await Bus.connect(settings, name="prep") as bus:
        for info in await bus.js.streams_info():
            await bus.js.delete_stream(info.config.name)
        await provision.apply(bus.js, topology.load(settings))
    env = run_env(tmp_path, site, BUSSCRAPE_NATS__URL=nats_server.url)
    proc = cli(["run", str(path), "--with-daemons", "--workers", "1"], tmp_path, env)
    output, _ = await asyncio.to_thread(proc.communicate, timeout=240)
    assert proc.returncode == 0, output[-3000:]
    assert sorted(m["url"] for m in metas(tmp_path / "state" / "archive").values()) == sorted(urls)
    assert not (tmp_path / "state" / "nats").exists()  # no embedded server was started


async def test_run_without_daemons_waits_for_daemons_elsewhere(tmp_path, site, slow_urls, nats_server):
    from busscrape.bus import provision, topology

    path, urls = slow_urls
    settings = make_settings(tmp_path, nats_server.url, network={"allow": [f"{h}/32" for h in site.hosts]},
                             archive={"dir": str(tmp_path / "state" / "archive")})
    async with await Bus.connect(settings, name="prep") as bus:
        for info in await bus.js.streams_info():
            await bus.js.delete_stream(info.config.name)
        await provision.apply(bus.js, topology.load(settings))
    env = run_env(tmp_path, site, BUSSCRAPE_NATS__URL=nats_server.url)
    runner = cli(["run", str(path)], tmp_path, env)
    async with await Bus.connect(settings, name="watch") as bus:
        async def dispatched() -> bool:
            assert runner.poll() is None, "run returned before any daemon ran"
            return (await bus.js.stream_info(names.TASKS_STREAM)).state.messages == len(urls)

        await wait_until(dispatched, timeout=120)
    assert runner.poll() is None  # dispatched, waiting: nothing renders yet
    elsewhere = [spawn([cmd], env_for(settings), tmp_path / f"{cmd}.log") for cmd in ("worker", "ingester")]
    try:
        output, _ = await asyncio.to_thread(runner.communicate, timeout=240)
    finally:
        for proc in elsewhere:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    assert runner.returncode == 0, output[-3000:]
    assert len(metas(tmp_path / "state" / "archive")) == len(urls)


async def test_run_returns_only_once_every_dead_letter_it_counts_is_archived(tmp_path, site, nats_server):
    """The `dead` record comes before the archivist copies the letter: `run` waits for the copy."""
    from busscrape.bus import provision, topology

    pages.install(site)
    path = tmp_path / "urls.txt"
    path.write_text(f"{site.url('/missing-1')}\n{site.url('/missing-2')}\n")
    archive = tmp_path / "state" / "archive"
    settings = make_settings(tmp_path, nats_server.url, network={"allow": [f"{h}/32" for h in site.hosts]},
                             archive={"dir": str(archive)})
    async with await Bus.connect(settings, name="prep") as bus:
        for info in await bus.js.streams_info():
            await bus.js.delete_stream(info.config.name)
        await provision.apply(bus.js, topology.load(settings))
        env = run_env(tmp_path, site, BUSSCRAPE_NATS__URL=nats_server.url)
        worker = spawn(["worker"], env_for(settings), tmp_path / "worker.log")
        runner = cli(["run", str(path)], tmp_path, env)
        ingester = None
        try:
            async def both_dead() -> bool:  # both tasks dead-lettered by the worker; no ingester runs yet
                return (await bus.js.stream_info(names.DEADLETTER_STREAM)).state.messages == 2

            await wait_until(both_dead, timeout=60)
            await asyncio.sleep(2)  # not synchronisation: the time a wrong `run` would have to return
            assert runner.poll() is None, "run returned before the dead letters were archived"
            ingester = spawn(["ingester"], env_for(settings), tmp_path / "ingester.log")
            output, _ = await asyncio.to_thread(runner.communicate, timeout=120)
        finally:
            for proc in (worker, ingester):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
    assert runner.returncode == 0, output[-3000:]
    assert len(list(archive.glob("deadletter/dt=*/*.json"))) == 2  # there when `run` returned
