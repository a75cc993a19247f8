"""Python extractors (``extract.python``): from a folder's ``NAME.py`` or an installed entry point,
run in the real extraction processes (``extract.pool``) with the TOML extractors' limits."""

from __future__ import annotations

import sys

import pytest

from busscrape.errors import ExtractionFailed, ExtractionStalled
from busscrape.extract.pool import ExtractionPool
from busscrape.extract.registry import ExtractorInvalid, Registry

HTML = "<html><head><title>Kettle</title></head><body><h1>Kettle</h1><p class=price>12.50</p></body></html>"

EXTRACTORS = {
    "product.py": '''"""Title, price and what the worker saw."""
VERSION = 3

def extract(page):
    return {"title": page.css("title::text").get(), "price": float(page.xpath("//p[@class='price']/text()").get()),
            "status": page.status, "type": page.headers.get("content-type"), "text": page.text, "url": page.url}
''',
    "raises.py": '''def extract(page):
    raise ValueError("no price here\\nprice missing on " + page.url)
''',
    "hangs.py": '''import time

def extract(page):
    time.sleep(60)
''',
    "not-json.py": '''def extract(page):
    return {"when": object()}
''',
    "not-a-dict.py": '''def extract(page):
    return ["a", "list"]
''',
    "_helpers.py": "X = 1\n",  # a helper module, not an extractor
}


@pytest.fixture
def registry(tmp_path):
    folder = tmp_path / "extractors"
    folder.mkdir()
    for name, source in EXTRACTORS.items():
        (folder / name).write_text(source)
    (folder / "heading.toml").write_text('version = 1\n[fields.h]\ncss = "h1"\n')
    return Registry.load(folder)


def test_the_folder_lists_python_beside_toml_without_running_it(registry):
    assert sorted(registry) == ["hangs", "heading", "not-a-dict", "not-json", "product", "raises"]
    product = registry["product"]
    assert (product.version, product.description) == (3, "Title, price and what the worker saw.")


def test_a_module_without_extract_is_refused_at_load(tmp_path):
    (tmp_path / "bad.py").write_text("def parse(page):\n    return {}\n")
    with pytest.raises(ExtractorInvalid, match=r"bad.py: no `def extract\(page\)`"):
        Registry.load(tmp_path)


async def test_python_extractors_run_in_the_pool_with_the_toml_limits(registry):
    async with ExtractionPool(registry, timeout=3) as pool:
        outcome = await pool.extract("product", HTML, "http://shop.example/k", 200,
                                     {"content-type": "text/html"})
        assert outcome.record == {"title": "Kettle", "price": 12.5, "status": 200, "type": "text/html",
                                  "text": "Kettle 12.50", "url": "http://shop.example/k"}
        with pytest.raises(ExtractionFailed) as raised:
            await pool.extract("raises", HTML, "http://shop.example/k")
        assert raised.value.reason == "extraction_failed"
        assert str(raised.value).endswith("raised on this page: ValueError: price missing on http://shop.example/k")
        with pytest.raises(ExtractionFailed) as raised:
            await pool.extract("not-json", HTML, "http://shop.example/k")
        assert raised.value.reason == "extraction_not_json" and "not JSON" in str(raised.value)
        with pytest.raises(ExtractionFailed) as raised:
            await pool.extract("not-a-dict", HTML, "http://shop.example/k")
        assert raised.value.reason == "extraction_not_json" and "returned list, not a dict" in str(raised.value)
        with pytest.raises(ExtractionStalled) as stalled:
            await pool.extract("hangs", HTML, "http://shop.example/k")
        assert stalled.value.reason == "extraction_timeout" and pool.replaced == 1
        # The TOML one beside them, in the new processes.
        assert (await pool.extract("heading", HTML, "http://shop.example/k")).record == {"h": "Kettle"}


async def test_an_entry_point_is_an_extractor_too(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "shopextract-1.0.dist-info").mkdir(parents=True)
    (site / "shopextract-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: shopextract\n"
                                                                 "Version: 1.0\n")
    (site / "shopextract-1.0.dist-info" / "entry_points.txt").write_text(
        "[busscrape.extractors]\nshop = shopextract:parse\n")
    (site / "shopextract.py").write_text("def parse(page):\n    return {'h1': page.css('h1::text').get()}\n")
    monkeypatch.syspath_prepend(str(site))  # the spawned extraction processes get the same sys.path
    registry = Registry.load(tmp_path / "no-folder")
    assert list(registry) == ["shop"] and registry["shop"].python == "entry:shopextract:parse"
    async with ExtractionPool(registry, timeout=10) as pool:
        assert (await pool.extract("shop", HTML, "http://shop.example/k")).record == {"h1": "Kettle"}
    assert "shopextract" not in sys.modules  # imported in the extraction process only
