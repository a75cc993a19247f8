"""The web archive end to end: ``busscrape run --artifacts …,warc --wacz NAME`` on a site served on
loopback, then tools nobody here wrote read what it archived: ``warcio check`` and ``cdxj-indexer``
every page's WARC, ``wacz validate`` the package, and pywb replays a page with the live site
stopped, in which Chromium sees what the page's JavaScript rendered."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from busscrape.settings import BrowserSettings
from busscrape.worker.browser.chromium import find_chromium, launch_args
from tests.e2e.test_run import cli, run_env
from tests.support.net import free_port
from tests.support.site import Site

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BIN = Path(sys.executable).parent
APP_JS = """fetch('/data.json').then(r => r.json()).then(d => {
  document.getElementById('app').innerHTML = '<h1 id=done>rendered: ' + d.items.join(', ') + '</h1>'; });"""


def tool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def live():
    """A site of its own (the test stops it half-way): JS-rendered pages sharing one script."""
    site = Site(hosts=("127.0.0.4",)).start()
    for path in ("/", "/second", "/third"):
        site.page(path, f"<title>page {path}</title><div id=app>loading</div><script src=/app.js></script>")
    site.page("/app.js", APP_JS + "\n//" + "x" * 2000, headers={"Content-Type": "text/javascript"})
    site.page("/data.json", json.dumps({"items": ["alpha", "beta", "gamma"]}),
              headers={"Content-Type": "application/json"})
    yield site
    if site._thread.is_alive():  # not stopped by the test
        site.stop()


def wait_for_port(host: str, port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"pywb exited: {proc.stdout.read() if proc.stdout else ''}")
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("pywb did not start listening")


async def test_run_archives_warcs_packs_a_wacz_and_pywb_replays_it(tmp_path, live):
    urls = [live.url(p) for p in ("/", "/second", "/third")]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    env = run_env(tmp_path, live)
    # networkidle: the pages render from a fetch that may still be in flight at `load` (on a busy
    # machine it was, and the WARC rightly had no /data.json), and a replay needs that response.
    proc = cli(["run", "urls.txt", "--artifacts", "html,screenshot,har,warc", "--wacz", "crawl",
                "--workers", "1", "--wait-until", "networkidle"], tmp_path, env)
    output, _ = await asyncio.to_thread(proc.communicate, timeout=300)
    assert proc.returncode == 0, output[-3000:]
    assert "wacz: wacz/crawl.wacz · 3 pages" in output, output[-2000:]
    archive = tmp_path / "state" / "archive"

    # Every page's WARC: stored as it is, valid, indexed.
    warcs = sorted(archive.glob("dt=*/host=*/*/page.warc.gz"))
    assert len(warcs) == 3
    for warc in warcs:
        meta = json.loads((warc.parent / "meta.json").read_text())
        [listed] = [o for o in meta["objects"] if o["name"] == "page.warc.gz"]
        assert listed["content_encoding"] is None and listed["size"] == warc.stat().st_size
        check = tool("warcio", "check", "-v", str(warc))
        assert check.returncode == 0 and "digest fail" not in check.stdout, check.stdout[-2000:]
        index = tool("cdxj-indexer", str(warc))
        assert index.returncode == 0 and "/data.json" in index.stdout and "/app.js" in index.stdout, index.stdout

    # The package: valid, every page in pages.jsonl, every WARC inside.
    wacz = archive / "wacz" / "crawl.wacz"
    validate = tool("wacz", "validate", "-f", str(wacz))
    assert validate.returncode == 0, validate.stdout + validate.stderr
    with zipfile.ZipFile(wacz) as package:
        names = package.namelist()
        lines = [json.loads(line) for line in package.read("pages/pages.jsonl").splitlines() if line.strip()]
    assert {"datapackage.json", "pages/pages.jsonl"} <= set(names)
    assert sum(n.startswith("archive/") for n in names) == 3
    assert sorted(p["url"] for p in lines[1:]) == sorted(urls)

    # Replay with pywb, the live site stopped: the page's script runs against the archive.
    live.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.4", live.port)) != 0, "the live site is still up"
    replay = tmp_path / "pywb"
    replay.mkdir()
    assert tool("wb-manager", "init", "crawl", cwd=replay).returncode == 0
    added = tool("wb-manager", "add", "crawl", *map(str, warcs), cwd=replay)
    assert added.returncode == 0, added.stdout + added.stderr
    port = free_port("127.0.0.1")
    server = subprocess.Popen([str(BIN / "wayback"), "-p", str(port), "-b", "127.0.0.1"], cwd=replay, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, server)
        binary = find_chromium(BrowserSettings())
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=binary.path, args=launch_args(BrowserSettings()))
            page = await browser.new_page()
            # pywb's framed replay: its banner on top, the archived page in an iframe (mp_ mode).
            await page.goto(f"http://127.0.0.1:{port}/crawl/{urls[1]}", timeout=60_000)
            replayed = page.frame_locator("iframe").first.locator("#done")
            await replayed.wait_for(timeout=60_000)
            assert await replayed.text_content() == "rendered: alpha, beta, gamma"
            await browser.close()
    finally:
        server.terminate()
        server.wait(20)
