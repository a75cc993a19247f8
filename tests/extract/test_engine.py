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


@pytest.mark.parametrize(("html", "text"), [
    ("<h1>Nordlicht<sup>®</sup> Thermos</h1>", "Nordlicht® Thermos"),
    ("<h1>H<sub>2</sub>O <em>bottle</em>,\n  <b>1</b>&nbsp;L</h1>", "H2O bottle, 1 L"),
    ("<div class=t><p>first</p><p>second</p></div>", "first second"),
    ("<h1>line<br>break</h1>", "line break"),
    ("<div class=t><table><tr><td>a</td><td>b</td></tr></table></div>", "a b"),
    ("<h1>x<script>var y = 1;</script>z<!-- note -->w</h1>", "xzw"),
    ("<div class=t>a<noscript><b>no</b> js</noscript>b</div>", "ab"),
])
def test_text_joins_the_text_of_inline_elements_without_a_space_inside_words(html, text):
    outcome = engine.run(extractor(name={"css": "h1, .t"}), f"<html><body>{html}</body></html>", "http://x/")
    assert outcome.record["name"] == text


def test_an_any_alternative_gives_its_own_format_to_the_fields_date_type():
    e = extractor(published={"type": "date", "any": [{"css": ".de", "format": "%d.%m.%Y"},
                                                     {"css": ".us", "format": "%m/%d/%Y"}]})
    assert engine.run(e, "<p class=de>05.03.2024</p>", "http://x/").record == {"published": "2024-03-05"}
    assert engine.run(e, "<p class=us>03/05/2024</p>", "http://x/").record == {"published": "2024-03-05"}
    with pytest.raises(ValueError, match="format applies to date and datetime fields only"):
        extractor(title={"css": "h1", "format": "%Y"})
    with pytest.raises(ValueError, match="format applies to date and datetime fields only"):
        extractor(title={"any": [{"css": "h1", "format": "%Y"}]})


@pytest.mark.parametrize(("text", "amount", "currency"), [
    ("1.299 €", "1299", "€"), ("€1.299", "1299", "€"), ("1.299,00 €", "1299.00", "€"),
    ("$1,299.99", "1299.99", "$"), ("EUR 12,50", "12.50", "EUR"), ("Preis: 19,99 zł", "19.99", "zł"),
    ("12.5", "12.5", None),
])
def test_a_price_reads_its_amount_and_currency(text, amount, currency):
    assert coerce(text, "price", base_url="") == {"amount": amount, "currency": currency}
    e = extractor(price={"css": ".p", "type": "price", "required": True})
    assert engine.run(e, f"<p class=p>{text}</p>", "http://x/").record == {"price": {"amount": amount,
                                                                                     "currency": currency}}


def test_a_number_with_a_currency_is_read_as_a_price_is():
    assert coerce("1.299 €", "decimal", base_url="") == "1299"
    assert coerce("€1.299", "int", base_url="") == 1299
    assert coerce(19.9, "price", base_url="") == {"amount": "19.9", "currency": None}
    with pytest.raises(NotThatType):
        coerce("call us", "price", base_url="")
