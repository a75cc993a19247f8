"""Running one extractor on one page: the HTML in, a record (or the fields that are missing) out.

Synchronous and self-contained, so that it runs anywhere: in the worker's extraction process
(``extract.pool``), in ``busscrape extractors test``, in the benchmark. The page is parsed once
(lxml through parsel); the embedded metadata (JSON-LD, microdata, OpenGraph, read by extruct from
that same tree) only when a field asks for it, and each syntax once.

A field's value is found, post-processed (``regex``), typed (``coerce``); a value that does not
read as its type is dropped with a warning. A required field (or a required sub-field of an item)
that ends with no value makes ``Outcome.missing`` name it with why; the worker then fails the task
as ``extraction_failed`` (see docs/extraction.md for why that is a dead letter).
"""

from __future__ import annotations

import html as html_lib
import json
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urljoin

from lxml import etree
from parsel import Selector

from busscrape.extract.coerce import NotThatType, coerce
from busscrape.extract.definition import Extractor, FieldSpec

MAX_VALUES = 1000
"""Values one ``multiple`` field keeps; more are dropped with a warning (a hostile page can repeat
an element a million times)."""
MAX_WARNINGS = 20
_SKIPPED = frozenset({"script", "style", "template", "noscript"})
_BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "br", "dd", "details", "dialog", "div", "dl", "dt", "fieldset",
    "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main",
    "nav", "ol", "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
    "option", "img"})
"""Elements whose edges separate words, as a browser's ``innerText`` does; inline ones
(``sup``, ``b``, ``span`` …) do not: ``Nordlicht<sup>®</sup>`` is one word."""
_SPACE = re.compile(r"\s+")


@dataclass
class Outcome:
    """What one extraction made."""

    record: dict[str, Any]
    missing: list[str] = field(default_factory=list)
    """``price: nothing matched`` for each required field without a value (then the record is incomplete)."""
    warnings: list[str] = field(default_factory=list)
    ms: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.missing


class Page:
    """One parsed page and its metadata, each read once."""

    def __init__(self, html: str, url: str) -> None:
        self.url = url
        self.selector = Selector(text=html or "<html></html>", base_url=url)
        base = self.selector.xpath("//base/@href").get()
        self.base_url = urljoin(url, base.strip()) if base else url

    @cached_property
    def jsonld(self) -> list[Any]:
        from extruct.jsonld import JsonLdExtractor

        items: list[Any] = []
        for node in self.selector.root.xpath('//script[@type="application/ld+json"]'):
            try:
                found = list(JsonLdExtractor()._extract_items(node))
            except (ValueError, TypeError, RecursionError):
                continue  # one broken script does not hide the others
            for item in found:
                items.extend(item["@graph"] if isinstance(item, dict) and isinstance(item.get("@graph"), list)
                             else [item])
        return [i for i in items if isinstance(i, dict)]

    @cached_property
    def microdata(self) -> list[Any]:
        from extruct.w3cmicrodata import MicrodataExtractor

        items: list[Any] = MicrodataExtractor().extract_items(self.selector.root, self.base_url)
        return items

    @cached_property
    def opengraph(self) -> dict[str, list[str]]:
        from extruct.opengraph import OpenGraphExtractor

        found: dict[str, list[str]] = {}
        for item in OpenGraphExtractor().extract_items(self.selector.root, self.base_url):
            for name, value in item["properties"]:
                found.setdefault(name, []).append(value)
        return found


def run(extractor: Extractor, html: str, url: str, status: int | None = None,
        headers: dict[str, str] | None = None) -> Outcome:
    """``extractor`` on the page ``html`` found at ``url`` (a Python one: ``extract.python``)."""
    if getattr(extractor, "python", None):
        from busscrape.extract import python

        outcome: Outcome = python.run(extractor, html, url, status, headers)  # type: ignore[arg-type]
        return outcome
    started = time.perf_counter()
    page = Page(html, url)
    outcome = Outcome(record={})
    for name, spec in extractor.fields.items():
        outcome.record[name] = _field(page, spec, page.selector, name, outcome)
    outcome.ms = round((time.perf_counter() - started) * 1000, 3)
    return outcome


def _field(page: Page, spec: FieldSpec, scope: Any, path: str, outcome: Outcome) -> Any:
    """The value of one field within ``scope`` (the page, an element, or a JSON item)."""
    why = "nothing matched"
    values: list[Any] = []
    for source in spec.sources():
        found = _find(page, source, scope)
        if source.fields is None:
            values, problem = _typed(page, source, found)
            why = problem or why
        else:
            found = found[:MAX_VALUES + 1] if spec.multiple else found[:1]
            values = [_item(page, source, node, f"{path}[{i}]" if spec.multiple else path, outcome)
                      for i, node in enumerate(found)]
        if values:
            break
    if len(values) > MAX_VALUES:
        _warn(outcome, f"{path}: {len(values)} values, kept the first {MAX_VALUES}")
        values = values[:MAX_VALUES]
    if not values:
        if spec.required:
            outcome.missing.append(f"{path}: {why}")
        elif why != "nothing matched":
            _warn(outcome, f"{path}: {why}")
        return [] if spec.multiple and spec.default is None else spec.default
    return values if spec.multiple else values[0]


def _item(page: Page, spec: FieldSpec, node: Any, path: str, outcome: Outcome) -> dict[str, Any]:
    assert spec.fields is not None
    return {name: _field(page, sub, node, f"{path}.{name}", outcome) for name, sub in spec.fields.items()}


def _find(page: Page, source: FieldSpec, scope: Any) -> list[Any]:
    """Every match of ``source`` in ``scope``: elements (or text) for css/xpath, JSON values otherwise."""
    kind = source.kind
    if kind in ("css", "xpath"):
        if not isinstance(scope, Selector):
            return []
        return list(scope.css(source.expression) if kind == "css" else scope.xpath(source.expression))
    if kind == "opengraph":
        return list(page.opengraph.get(source.expression, []))
    items = page.jsonld if kind == "jsonld" else page.microdata
    segments = source.expression.split(".")
    if isinstance(scope, Selector):  # from the page: the first segment is the items' type
        wanted, segments = segments[0], segments[1:]
        items = [i for i in items if wanted == "*" or wanted in _types(i, kind)]
    else:
        items = [scope]
    return _walk(items, segments, kind)


def _types(item: dict[str, Any], kind: str) -> set[str]:
    declared = item.get("@type" if kind == "jsonld" else "type")
    declared = declared if isinstance(declared, list) else [declared]
    # "http://schema.org/Product" and "Product" are the same type to a reader.
    return {str(t).rstrip("/").rsplit("/", 1)[-1] for t in declared if t}


def _walk(values: list[Any], segments: list[str], kind: str) -> list[Any]:
    for segment in segments:
        step: list[Any] = []
        for value in values:
            if kind == "microdata" and isinstance(value, dict) and "properties" in value:
                value = value["properties"]
            if isinstance(value, dict) and segment in value:
                got = value[segment]
                step.extend(got if isinstance(got, list) else [got])
        values = step
    flat: list[Any] = []
    for value in values:
        flat.extend(value if isinstance(value, list) else [value])
    if kind == "microdata":
        flat = [v["properties"] if isinstance(v, dict) and "properties" in v else v for v in flat]
    return [v for v in flat if v is not None]


def _typed(page: Page, spec: FieldSpec, found: list[Any]) -> tuple[list[Any], str | None]:
    """The found values as text, through ``regex``, typed; and why the last one dropped was dropped."""
    values, problem = [], None
    pattern = re.compile(spec.regex) if spec.regex else None
    for node in found[: MAX_VALUES + 1]:
        value = _raw(spec, node)
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
            if pattern is not None:
                match = pattern.search(value)
                if match is None:
                    problem = f"{value[:60]!r} does not match regex {spec.regex!r}"
                    continue
                value = (match.group(1) if pattern.groups else match.group(0)).strip()
            if not value:
                continue
        try:
            values.append(coerce(value, spec.type, base_url=page.base_url, fmt=spec.format))
        except NotThatType as exc:
            problem = str(exc)
    return values, problem


def _raw(source: FieldSpec, node: Any) -> Any:
    """What a match gives: the element's text, attribute or inner HTML; a JSON leaf as it is."""
    if not isinstance(node, Selector):
        if isinstance(node, dict):  # an item where a value was wanted: its name, or its @value
            for key in ("name", "@value", "value", "@id", "url"):
                if key in node and not isinstance(node[key], dict | list):
                    return node[key]
            return json.dumps(node, sort_keys=True, ensure_ascii=False)
        return node
    root = node.root
    if isinstance(root, str):  # ::text, ::attr(x), or an xpath ending in text() / @x
        return root
    if not isinstance(root, etree._Element):
        return str(root)
    if source.attr is not None:
        return root.get(source.attr)
    if source.html:
        inner = html_lib.escape(root.text or "", quote=False)
        return inner + "".join(etree.tostring(child, encoding="unicode", method="html") for child in root)
    return _SPACE.sub(" ", _text(root)).strip()


def _text(root: etree._Element) -> str:
    """The element's text as a reader sees it: its text nodes in order, joined as they stand in
    the page, with a space at the edges of block elements (whitespace is normalised after).
    Iterative: a hostile page's nesting depth costs no recursion."""
    parts: list[str] = []
    skipping = 0  # inside a script, a style …: their text is no one's to read
    for event, element in etree.iterwalk(root, events=("start", "end", "comment", "pi")):
        if not isinstance(element.tag, str):  # a comment or processing instruction: only its tail
            if not skipping and element is not root:
                parts.append(element.tail or "")
            continue
        tag = element.tag.lower()
        unread = tag in _SKIPPED
        if event == "start":
            skipping += unread
            if not skipping:
                parts.append(" " if tag in _BLOCK else "")
                parts.append(element.text or "")
            continue
        skipping -= unread
        if skipping:
            continue
        parts.append(" " if tag in _BLOCK else "")
        if element is not root:
            parts.append(element.tail or "")
    return "".join(parts)


def _warn(outcome: Outcome, text: str) -> None:
    if len(outcome.warnings) < MAX_WARNINGS:
        outcome.warnings.append(text)
