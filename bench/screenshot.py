"""Benchmark: what a screenshot costs per page, by kind, on the pages of bench/site.py.

One Chromium, one reused tab (busscrape.tabs), pages loaded one at a time; on each page every
variant is taken in turn (the order rotates from page to page, so none always comes first)
and timed from the CDP call to the decoded bytes. The viewport PNG is the baseline that every
row is divided by: the machine is shared, absolute milliseconds move with it.

    .venv/bin/python bench/screenshot.py --pages 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.async_api import async_playwright

from bench.bare import CAP
from bench.benchsite import BenchSite
from busscrape.settings import BrowserSettings
from busscrape.worker.browser.chromium import launch_args, require_chromium
from busscrape.worker.browser.tabs import Tab

# name -> Page.captureScreenshot parameters beyond the clip; "full" ones are clipped to the page
# height (up to the cap) at viewport width, as the worker's full-page capture.
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "viewport png": (False, {"format": "png", "optimizeForSpeed": True}),
    "full png (default)": (True, {"format": "png", "optimizeForSpeed": True}),
    "full png, not optimizeForSpeed": (True, {"format": "png"}),
    "full jpeg q80": (True, {"format": "jpeg", "quality": 80, "optimizeForSpeed": True}),
    "full webp q80": (True, {"format": "webp", "quality": 80, "optimizeForSpeed": True}),
    "full png at scale 0.5": (True, {"format": "png", "optimizeForSpeed": True, "scale": 0.5}),
}


async def measure(urls: list[str]) -> dict[str, tuple[list[float], list[int]]]:
    settings = BrowserSettings()
    binary = require_chromium(settings)
    out: dict[str, tuple[list[float], list[int]]] = {k: ([], []) for k in VARIANTS}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=binary.path, args=launch_args(settings))
        tab = await Tab.open(browser, user_agent=None, generation=0)
        names = list(VARIANTS)
        for i, url in enumerate(urls):
            await tab.begin(viewport=(1280, 800), headers={})
            await tab.page.goto(url, wait_until="load")
            height = min(await tab.page.evaluate("() => document.documentElement.scrollHeight"), CAP)
            for name in names[i % len(names):] + names[:i % len(names)]:
                full, params = VARIANTS[name]
                params = dict(params)
                scale = params.pop("scale", 1)
                if full:
                    params["captureBeyondViewport"] = True
                    params["clip"] = {"x": 0, "y": 0, "width": 1280, "height": height, "scale": scale}
                started = time.perf_counter()
                data = base64.b64decode((await tab.cdp.send("Page.captureScreenshot", params))["data"])
                out[name][0].append((time.perf_counter() - started) * 1000)
                out[name][1].append(len(data))
            await tab.wipe()
        await tab.close()
        await browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=20)
    args = parser.parse_args()
    with BenchSite(pages=997) as site:
        results = asyncio.run(measure(site.urls(args.pages)))
    base = statistics.median(results["viewport png"][0])
    print(f"{'variant':32} {'ms p50':>8} {'x viewport':>10} {'KB p50':>8}")
    for name, (ms, sizes) in results.items():
        p50 = statistics.median(ms)
        print(f"{name:32} {p50:8.0f} {p50 / base:10.2f} {statistics.median(sizes) / 1024:8.0f}")


if __name__ == "__main__":
    main()
