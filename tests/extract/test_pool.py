"""The extraction processes: an extractor that raises, hangs or dies costs one extraction, never the
pool, and the event loop keeps running while a page is extracted."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from busscrape.errors import ExtractionFailed, ExtractionStalled
from busscrape.extract.pool import ExtractionPool
from busscrape.extract.registry import Registry
from busscrape.ops.demo_shop import EXPECTED
from busscrape.ops.demo_site import PAGES

REPO = Path(__file__).resolve().parents[2]
BOMB = "<p class=bomb>" + "a" * 40 + "b</p>"


@pytest.fixture
def registry(tmp_path):
    folder = tmp_path / "extractors"
    folder.mkdir()
    (folder / "demo-product.toml").write_text((REPO / "extractors" / "demo-product.toml").read_text())
    (folder / "hostile.toml").write_text('version = 1\n[fields.x]\ncss = "p.bomb"\nregex = \'^(a+)+$\'\n')
    return Registry.load(folder)


async def demo(pool: ExtractionPool) -> None:
    outcome = await pool.extract("demo-product", PAGES["/shop/kettle.html"], "http://shop.example/k")
    assert outcome.record == EXPECTED["/shop/kettle.html"]


async def test_a_timeout_replaces_the_process_and_the_loop_never_waits(registry):
    async with ExtractionPool(registry, timeout=1.5) as pool:
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        with pytest.raises(ExtractionStalled) as caught:
            await pool.extract("hostile", BOMB, "http://x/")
        ticker.cancel()
        assert caught.value.reason == "extraction_timeout" and pool.replaced == 1
        assert ticks >= 10  # the loop ran all along (1.5 s of 50 ms ticks, on a busy machine at least 10)
        await demo(pool)  # the new process serves


async def test_a_process_that_dies_is_replaced_and_an_extractor_that_raises_fails_only_its_page(registry):
    async with ExtractionPool(registry, timeout=30) as pool:
        await demo(pool)  # the processes start on the first extraction
        [pid] = [p.pid for p in pool._executor._processes.values()]  # type: ignore[union-attr]
        slow = asyncio.ensure_future(pool.extract("hostile", BOMB, "http://x/"))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer would
        with pytest.raises(ExtractionStalled) as caught:
            await slow
        assert caught.value.reason == "extraction_crashed" and pool.replaced == 1
        await demo(pool)
        # An extractor that raises in its process (here: one the process was not loaded with).
        with pytest.raises(ExtractionFailed, match="raised on this page: KeyError"):
            await pool.extract("not-loaded", "<p>", "http://x/")
        await demo(pool)
