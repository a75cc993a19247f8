"""Screenshots of every console page for docs/console.md, taken against a demo run.

    PYTHONPATH=src python scripts/console_screenshots.py [--out docs/images]

Runs ``busscrape demo`` in a scratch folder (the demo site, a run with extraction and a dead
letter, then a small crawl), serves ``busscrape api`` on that finished run's state dir (it reopens
the run's store), and photographs each page in Chromium: overview, crawls, one crawl, a search,
one page, the dead letters, one letter and the replay confirmation. Everything is on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

VIEWPORT = {"width": 1280, "height": 900}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"busscrape api exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.3)
    raise SystemExit(f"busscrape api did not answer at {url} within {timeout}s")


async def photograph(url: str, out: Path) -> list[Path]:
    from playwright.async_api import async_playwright

    from busscrape.settings import BrowserSettings
    from busscrape.worker.browser.chromium import find_chromium, launch_args

    taken: list[Path] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=find_chromium(BrowserSettings()).path,
                                                   args=launch_args(BrowserSettings()))
        page = await browser.new_page(viewport=VIEWPORT, base_url=url)

        async def shot(name: str, path: str | None = None, full: bool = False) -> Any:
            if path is not None:
                await page.goto(path)
            file = out / f"console-{name}.png"
            await page.screenshot(path=str(file), full_page=full)
            taken.append(file)

        await page.goto("/")
        await page.wait_for_timeout(8000)  # a few refreshes: the rate chart has points
        await shot("overview")
        await shot("crawls", "/console/crawls")
        await page.click("table a[href^='/console/crawls/']")
        await page.wait_for_selector("#crawl-progress")
        await shot("crawl")
        await shot("search", "/console/pages?q=kettle+or+lantern+or+stove")
        await page.goto("/console/pages?q=kettle")
        await page.click(".hit a.title")
        await page.wait_for_selector("#page-title")
        await shot("page", full=True)
        await shot("deadletters", "/console/deadletters")
        await page.click("table.letters td a")
        await page.wait_for_selector("table.facts")
        await shot("deadletter")
        await page.goto("/console/deadletters")
        reason = page.locator("a.reason").first
        await reason.click()
        await page.click("#replay-reason")
        await page.wait_for_selector("#replay-question")
        await shot("replay")
        await browser.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "images")
    out = parser.parse_args().out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="busscrape-console-") as scratch:
        demo = subprocess.run([sys.executable, "-m", "busscrape", "demo"], cwd=scratch, check=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=600)
        if demo.returncode != 0:
            raise SystemExit(f"busscrape demo exited with {demo.returncode}")
        port = free_port()
        api = subprocess.Popen([sys.executable, "-m", "busscrape", "api", "--port", str(port)], cwd=scratch,
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(url, api)
            for file in asyncio.run(photograph(url, out)):
                print(file)
        finally:
            api.terminate()
            api.wait(30)


if __name__ == "__main__":
    main()
