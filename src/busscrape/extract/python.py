"""Python extractors: ``extractors/NAME.py``, or an installed entry point in the group
``busscrape.extractors``, defining ``extract(page) -> dict``.

``page`` has ``url``, ``status``, ``headers``, ``html``, ``text`` (the visible text) and parsel's
``css(...)`` and ``xpath(...)``. The function runs where the TOML extractors run: in the
extraction processes (``extract.pool``), under the same time, memory and record-size limits, so
whatever it does fails its task, never the worker:

    it returns a dict of JSON values ──► the record (``extract.records``: over max_record_bytes → record_too_large)
    it raises ───────────────────────► extraction_failed, with the exception's last line
    it returns something else ───────► extraction_not_json (permanent: the same page gives the same)
    it hangs ────────────────────────► extraction_timeout (its process replaced, as for TOML)

The module is imported in the extraction process, never in the worker's (nor in ``list``/``show``,
which read ``VERSION`` and the docstring from the file's source without running it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import time
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field

from busscrape.extract.definition import Extractor, FieldSpec

ENTRY_POINT_GROUP = "busscrape.extractors"
_LOADED: dict[str, Any] = {}  # in an extraction process: each extractor's function, imported once


class PythonExtractor(Extractor):
    """An extractor that is a Python function (no declared fields)."""

    fields: dict[str, FieldSpec] = Field(default_factory=dict)
    python: str
    """``file:/path/NAME.py`` or ``entry:module:function``."""


class RecordNotJson(Exception):
    """The function returned something that is not a JSON object."""


def from_file(path: Path) -> PythonExtractor:
    """``NAME.py``'s extractor: ``VERSION`` (default 1) and the docstring read from its source."""
    from busscrape.extract.registry import ExtractorInvalid

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise ExtractorInvalid(f"{path}: not a Python module ({exc})") from None
    if not any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "extract"
               for node in tree.body):
        raise ExtractorInvalid(f"{path}: no `def extract(page)` at the top level")
    version = 1
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VERSION" for t in node.targets):
            if not isinstance(node.value, ast.Constant) or not isinstance(node.value.value, int):
                raise ExtractorInvalid(f"{path}: VERSION must be a whole number")
            version = node.value.value
    return PythonExtractor(name=path.stem, version=version, description=(ast.get_docstring(tree) or "").split("\n")[0],
                           python=f"file:{path.resolve()}")


def from_entry_points() -> dict[str, PythonExtractor]:
    """The extractors installed packages declare (``[project.entry-points."busscrape.extractors"]``)."""
    from importlib.metadata import entry_points

    return {ep.name: PythonExtractor(name=ep.name, version=1, description=f"entry point {ep.value}",
                                     python=f"entry:{ep.value}")
            for ep in entry_points(group=ENTRY_POINT_GROUP)}


class PythonPage:
    """What ``extract(page)`` is given."""

    def __init__(self, html: str, url: str, status: int | None, headers: dict[str, str] | None) -> None:
        from parsel import Selector

        self.url, self.status, self.headers, self.html = url, status, dict(headers or {}), html
        self.selector = Selector(text=html or "<html></html>", base_url=url)

    @cached_property
    def text(self) -> str:
        parts = self.selector.xpath("//body//text()[not(ancestor::script or ancestor::style)]").getall()
        return " ".join(" ".join(parts).split())

    def css(self, query: str) -> Any:
        return self.selector.css(query)

    def xpath(self, query: str, **kwargs: Any) -> Any:
        return self.selector.xpath(query, **kwargs)


def _function(extractor: PythonExtractor) -> Any:
    found = _LOADED.get(extractor.name)
    if found is None:
        kind, _, where = extractor.python.partition(":")
        if kind == "file":
            spec = importlib.util.spec_from_file_location(f"busscrape_extractor_{extractor.name}", where)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            found = module.extract
        else:
            module_name, _, attr = where.partition(":")
            found = getattr(importlib.import_module(module_name), attr or "extract")
        _LOADED[extractor.name] = found
    return found


def run(extractor: PythonExtractor, html: str, url: str, status: int | None = None,
        headers: dict[str, str] | None = None) -> Any:
    """The function on the page: its record as an ``engine.Outcome`` (``RecordNotJson`` when it is not one)."""
    from busscrape.extract.engine import Outcome

    started = time.perf_counter()
    record = _function(extractor)(PythonPage(html, url, status, headers))
    if not isinstance(record, dict):
        raise RecordNotJson(f"extract() returned {type(record).__name__}, not a dict")
    try:
        record = orjson.loads(orjson.dumps(record))
    except TypeError as exc:
        raise RecordNotJson(f"the record is not JSON: {exc}") from None
    return Outcome(record=record, ms=round((time.perf_counter() - started) * 1000, 3))
