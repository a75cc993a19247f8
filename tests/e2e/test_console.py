"""The console of a real ``busscrape run`` (embedded NATS, its own workers and ingester), read by
``busscrape api`` on the run's state dir in a real Chromium: while the run goes, and after it ended
(the API then reopens the run's store, as ``status`` and ``dlq`` do)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import expect

from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from tests.conftest import make_settings
from tests.e2e.test_run import run_env
from tests.support.chromium import launched
from tests.support.procs import listening_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@contextlib.contextmanager
def api_process(tmp_path: Path, env: dict[str, str], log: str) -> Iterator[subprocess.Popen[bytes]]:
    """``busscrape api`` on a port of its own choosing (port 0): a port picked free beforehand can be
    taken by another test's server before the API binds it, and that server answers instead."""
    with (tmp_path / log).open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "busscrape", "api", "--port", "0"], cwd=tmp_path,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


async def serving(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> str:
    """The API's URL, once it answers."""
    url = f"http://127.0.0.1:{await listening_port(log, 'api.listening', proc, timeout)}"
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/healthz") as r:
                    if r.status == 200:
                        return url
            await asyncio.sleep(0.2)
    raise AssertionError(f"the API did not answer within {timeout}s: {log.read_text()[-3000:]}")


@contextlib.asynccontextmanager
async def chromium_page() -> AsyncIterator[object]:
    async with launched() as browser:
        yield await browser.new_page()


def figure(text: str) -> int | None:
    digits = text.strip().replace(",", "")
    return int(digits) if digits.isdigit() else None


def held_pages(site) -> threading.Event:
    """``/held?n=…``: a two-second page that is not answered before the returned event is set (at
    most 100 s), so a run's counts move while the console is watched. Without it a loaded machine
    once had 8 of 10 pages archived before the console first loaded, and saw them no more."""
    released = threading.Event()

    @site.route("/held")
    async def held(request: web.Request) -> web.StreamResponse:
        await asyncio.to_thread(released.wait, 100)
        await asyncio.sleep(2)
        return web.Response(text=f"<title>held {request.query.get('n')}</title>", content_type="text/html")

    return released


async def test_the_console_shows_a_runs_counts_moving_and_reaching_its_summary(tmp_path, site):
    released = held_pages(site)
    urls = [site.url(f"/held?n={i}") for i in range(10)] + [site.url(f"/missing-{i}") for i in range(2)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    # The held pages wait for the console: their navigation may take that long.
    env = run_env(tmp_path, site, BUSSCRAPE_WORKER__NAVIGATION_TIMEOUT="150s", BUSSCRAPE_WORKER__TASK_TIMEOUT="200s")
    runner = subprocess.Popen([sys.executable, "-m", "busscrape", "run", "urls.txt", "--workers", "1", "--json"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        ports = tmp_path / "state" / "nats" / "ports"
        deadline = time.monotonic() + 120
        while not list(ports.glob("*.ports")) and time.monotonic() < deadline:  # the run's server is up
            assert runner.poll() is None
            await asyncio.sleep(0.2)
        # And its streams applied: the API refuses a server without them (the ports file comes
        # first, and a fresh-clone run started the API in between).
        [found] = ports.glob("*.ports")
        settings = make_settings(tmp_path / "probe", json.loads(found.read_text())["nats"][0])
        async with await Bus.connect(settings, name="probe") as bus:
            await provision.require(bus.js, topology.load(settings), names.REQUIRED, wait=60)
        seen: list[tuple[int | None, int | None]] = []
        with api_process(tmp_path, env, "api-live.log") as api:
            url = await serving(api, tmp_path / "api-live.log")
            async with chromium_page() as page:
                await page.goto(url + "/")
                # A read the bus did not answer in time (a loaded machine, the run's streams just
                # made) is a 503 page that loads itself again: the overview comes all the same.
                await expect(page.locator("#total-archived")).to_be_visible(timeout=60_000)
                released.set()
                while runner.poll() is None:  # the page refreshes itself; read what it shows
                    seen.append((figure(await page.locator("#total-archived").inner_text()),
                                 figure(await page.locator("#total-dead").inner_text())))
                    await asyncio.sleep(0.3)
        output, _ = await asyncio.to_thread(runner.communicate, timeout=240)
    finally:
        released.set()
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 0, output[-3000:]
    summary = json.loads(output)
    assert (summary["archived"], summary["dead"]) == (10, 2)
    archived = [a for a, _ in seen if a is not None]
    # Moving: the archived count was seen below the summary's and then higher again.
    assert len(set(archived)) >= 2 and min(archived) < summary["archived"], seen

    # The run has ended and stopped its server: `busscrape api` on its state dir reopens its store.
    with api_process(tmp_path, env, "api-after.log") as api:
        url = await serving(api, tmp_path / "api-after.log")
        async with chromium_page() as page:
            await page.goto(url + "/")
            assert figure(await page.locator("#total-archived").inner_text()) == summary["archived"]
            assert figure(await page.locator("#total-dead").inner_text()) == summary["dead"]
            await page.goto(url + "/console/deadletters")
            text = await page.locator("table.letters").inner_text()
            assert all(site.url(f"/missing-{i}") in text for i in range(2))
