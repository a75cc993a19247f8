"""The engine on the demo shop's pages and on the rules of every source and type."""

from __future__ import annotations

from pathlib import Path

import pytest

from busscrape.extract import engine
from busscrape.extract.coerce import NotThatType, coerce, number_text
from busscrape.extract.definition import Extractor
from busscrape.extract.registry import Registry
from busscrape.ops.demo_shop import EXPECTED
from busscrape.ops.demo_site import PAGES

DEMO = Registry.load(Path(__file__).resolve().parents[2] / "extractors")["demo-product"]


@pytest.mark.parametrize("path", ["/shop/kettle.html", "/shop/stove.html"])
def test_the_demo_extractor_reads_the_server_rendered_and_the_json_ld_product(path):
    outcome = engine.run(DEMO, PAGES[path], "http://127.0.0.1:1" + path)
    assert outcome.complete and outcome.warnings == []
    assert outcome.record == EXPECTED[path]


def test_without_javascript_the_lantern_has_no_price_and_the_mystery_box_never_has():
    for path in ("/shop/lantern.html", "/shop/mystery.html"):
        outcome = engine.run(DEMO, PAGES[path], "http://127.0.0.1:1" + path)
        assert outcome.missing == ["price: nothing matched"], path


def extractor(**fields) -> Extractor:
    return Extractor.model_validate({"name": "t", "version": 3, "fields": fields})


def test_attributes_inner_html_regex_multiple_urls_and_microdata_and_opengraph():
    html = """<html><head><base href="/catalog/"><meta property="og:title" content="OG name">
      </head><body><a class=next href="page2.html">next</a><div class=desc>Hi <b>there</b></div>
      <ul><li>SKU-1</li><li>SKU-2</li><li>none</li></ul>
      <div itemscope itemtype="http://schema.org/Product"><span itemprop="name">Micro</span>
        <span itemprop="offers" itemscope itemtype="http://schema.org/Offer"><meta itemprop="price" content="7.5">
        </span></div></body></html>"""
    e = extractor(next={"css": "a.next", "attr": "href", "type": "url"}, desc={"css": ".desc", "html": True},
                  skus={"css": "li", "multiple": True, "regex": r"SKU-(\d+)", "type": "int"},
                  og={"opengraph": "og:title"}, micro={"microdata": "Product.name"},
                  micro_price={"microdata": "Product.offers.price", "type": "float"},
                  absent={"css": ".nope", "default": "n/a"})
    outcome = engine.run(e, html, "http://shop.example/a/b.html")
    assert outcome.record == {"next": "http://shop.example/catalog/page2.html", "desc": "Hi <b>there</b>",
                              "skus": [1, 2], "og": "OG name", "micro": "Micro", "micro_price": 7.5, "absent": "n/a"}


def test_a_value_of_the_wrong_type_is_dropped_with_a_warning_or_fails_a_required_field():
    e = extractor(rating={"css": ".r", "type": "int"}, price={"css": ".p", "type": "decimal", "required": True})
    outcome = engine.run(e, "<p class=r>five</p><p class=p>call us</p>", "http://x/")
    assert outcome.record["rating"] is None and outcome.warnings == ["rating: 'five' does not read as int"]
    assert outcome.missing == ["price: 'call us' does not read as decimal"]


def test_a_required_sub_field_is_named_with_its_item():
    e = extractor(reviews={"css": ".rv", "multiple": True, "fields": {"author": {"css": ".a", "required": True}}})
    outcome = engine.run(e, "<div class=rv><i class=a>x</i></div><div class=rv></div>", "http://x/")
    assert outcome.missing == ["reviews[1].author: nothing matched"]


@pytest.mark.parametrize(("text", "number"), [("1.299,00 €", "1299.00"), ("$1,299", "1299"), ("12,5", "12.5"),
                                               ("EUR 24.50", "24.50"), ("1 299,95", "1299.95"), ("-3", "-3")])
def test_numbers_are_read_in_either_convention(text, number):
    assert number_text(text) == number


def test_types():
    assert coerce("March 5, 2024", "date", base_url="") == "2024-03-05"
    assert coerce("05.03.2024", "date", base_url="", fmt="%d.%m.%Y") == "2024-03-05"
    assert coerce("https://schema.org/InStock", "bool", base_url="") is True
    assert coerce(19.9, "decimal", base_url="") == "19.9"
    with pytest.raises(NotThatType):
        coerce("NaN", "decimal", base_url="")
    with pytest.raises(NotThatType):
        coerce("4.5", "int", base_url="")


def test_a_hostile_page_is_bounded():
    e = extractor(items={"css": "i", "multiple": True})
    outcome = engine.run(e, "<i>x</i>" * (engine.MAX_VALUES + 500), "http://x/")
    assert len(outcome.record["items"]) == engine.MAX_VALUES and "kept the first" in outcome.warnings[0]
