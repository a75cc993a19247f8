"""What an extractor file says: its fields, where each comes from, and what type it is.

An extractor is one TOML file in ``extractors/`` (``extractors/<name>.toml``)::

    version = 2                               # bump it when the fields change: records carry it
    description = "Product pages of the demo shop"

    [fields.name]
    css = "h1.product-name"                   # or xpath = "//h1", jsonld = "Product.name",
    required = true                           #    microdata = "Product.name", opengraph = "og:title"

    [fields.price]
    any = [{ css = ".price", attr = "content" }, { jsonld = "Product.offers.price" }]
    type = "decimal"                          # str int float decimal date datetime url bool
    regex = '([0-9][0-9.,]*)'                 # the first group (or the whole match) is the value
    required = true

    [fields.reviews]                          # a list of items, each with its own sub-fields
    css = ".review"
    multiple = true
    fields.author = { css = ".author" }
    fields.rating = { css = ".stars", attr = "data-rating", type = "int" }

A field has exactly one source: a CSS or XPath selector (parsel; the element's text by default,
``attr`` for an attribute, ``html = true`` for its inner HTML), a path into the page's JSON-LD,
microdata or OpenGraph (extruct; ``Type.key.key``: the first segment picks items of that
``@type``), or ``any``: alternatives tried in order, the first that finds something wins. Sub-fields
of a CSS/XPath field select within each item; those of a JSON-LD or microdata field are paths
within each item (``jsonld = "author.name"``). Every rule is checked when the file is loaded, so
an extractor that loads is one that can run.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from busscrape.model.messages import EXTRACTOR_NAME

FieldType = Literal["str", "int", "float", "decimal", "price", "date", "datetime", "url", "bool"]
SOURCES = ("css", "xpath", "jsonld", "microdata", "opengraph")
DOM_SOURCES = frozenset({"css", "xpath"})
NAME = re.compile(EXTRACTOR_NAME)
"""An extractor's name: its file name without ``.toml``."""
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_DEPTH = 4  # nested item lists; deeper is a mistake, not a page


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldSpec(_Strict):
    """One field of the record: where it comes from, post-processing, type, whether it must be there."""

    css: str | None = Field(None, min_length=1)
    xpath: str | None = Field(None, min_length=1)
    jsonld: str | None = Field(None, min_length=1)
    microdata: str | None = Field(None, min_length=1)
    opengraph: str | None = Field(None, min_length=1)
    attr: str | None = Field(None, min_length=1)
    """CSS/XPath: take this attribute of the element instead of its text."""
    html: bool = False
    """CSS/XPath: take the element's inner HTML instead of its text."""
    any: tuple[FieldSpec, ...] | None = Field(None, min_length=1)
    """Alternatives tried in order, the first that finds a value wins. Each is a source with its own
    ``attr``/``html``/``regex``/``type``/``format``/``fields`` where it gives them (else this field's);
    ``required``, ``multiple`` and ``default`` are this field's."""
    multiple: bool = False
    """A list of every match instead of the first."""
    regex: str | None = None
    """Applied to each text value: the first group (or the whole match) is kept; no match, no value."""
    type: FieldType = "str"
    format: str | None = None
    """``date``/``datetime``: a ``strptime`` format to read the value with (ISO 8601 is always read)."""
    required: bool = False
    """No value (or none that reads as ``type``) fails the extraction, naming this field."""
    default: Any = None
    """The value when nothing is found (a field that is not required)."""
    fields: dict[str, FieldSpec] | None = None
    """Sub-fields: then every match is an item, and the value is a record (a list with ``multiple``)."""
    _alternatives: tuple[FieldSpec, ...] = PrivateAttr(default=())

    @property
    def kind(self) -> str:
        return next(s for s in SOURCES if getattr(self, s) is not None)

    @property
    def expression(self) -> str:
        text: str = getattr(self, self.kind)
        return text

    @model_validator(mode="after")
    def _valid(self) -> FieldSpec:
        given = [s for s in SOURCES if getattr(self, s) is not None]
        if self.any is None:
            # An alternative of ``any`` is parsed before the field it inherits its type from: a
            # ``format`` without a ``type`` is checked once the type is known (``_check_formats``).
            _check(self, typed="type" in self.model_fields_set or self.format is None)
            self._alternatives = (self,)
            return self
        if given or self.attr is not None or self.html:
            raise ValueError("give either any or a source, not both")
        alternatives = []
        for number, alt in enumerate(self.any):
            owned = alt.model_fields_set & {"required", "multiple", "default", "any"}
            if owned:
                raise ValueError(f"any[{number}]: {', '.join(sorted(owned))} belong to the field, not to an "
                                 "alternative")
            inherited = {k: getattr(self, k) for k in ("regex", "type", "format", "fields")
                         if k not in alt.model_fields_set}
            effective = alt.model_copy(update={**inherited, "multiple": self.multiple})
            try:
                _check(effective)
            except ValueError as exc:
                raise ValueError(f"any[{number}]: {exc}") from None
            effective._alternatives = (effective,)
            alternatives.append(effective)
        self._alternatives = tuple(alternatives)
        return self

    def sources(self) -> tuple[FieldSpec, ...]:
        """The alternatives as complete specs (this field itself when it has one source)."""
        return self._alternatives

    def kinds(self) -> set[str]:
        return {s.kind for s in self.sources()}

    def depth(self) -> int:
        return 1 + max((f.depth() for alt in self.sources() for f in (alt.fields or {}).values()), default=0)


def _check(spec: FieldSpec, *, typed: bool = True) -> None:
    """The rules of a field with one source (``typed``: its type is its own, not inherited yet)."""
    given = [s for s in SOURCES if getattr(spec, s) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(SOURCES)} (or any)" + (f"; got {', '.join(given)}"
                                                                                if given else ""))
    kind = given[0]
    if (spec.attr is not None or spec.html) and kind not in DOM_SOURCES:
        raise ValueError("attr and html apply to css and xpath sources only")
    if spec.attr is not None and spec.html:
        raise ValueError("give attr or html, not both")
    if kind == "css":
        _check_css(spec.css or "")
    elif kind == "xpath":
        _check_xpath(spec.xpath or "")
    if spec.regex is not None:
        try:
            compiled = re.compile(spec.regex)
        except re.error as exc:
            raise ValueError(f"regex {spec.regex!r} does not compile: {exc}") from None
        if compiled.groups > 1:
            raise ValueError("regex has more than one group; the value is the first group (use (?:...) for the "
                             "others)")
    if typed:
        _check_format(spec)
    if spec.fields is None:
        return
    if spec.type != "str" or spec.regex is not None or spec.attr is not None or spec.html:
        raise ValueError("a field with sub-fields is a record: type, regex, attr and html belong to its sub-fields")
    if not spec.fields:
        raise ValueError("fields is empty")
    if kind == "opengraph":
        raise ValueError("opengraph values are text: they have no sub-fields")
    inner = kind in DOM_SOURCES
    for name, sub in spec.fields.items():
        _check_field_name(name)
        for sub_kind in sub.kinds():
            if (sub_kind in DOM_SOURCES) != inner or sub_kind == "opengraph":
                raise ValueError(f"sub-field {name!r}: a {sub_kind} source cannot select within "
                                 f"{'an element' if inner else 'a JSON item'}; use "
                                 f"{'css or xpath' if inner else 'a path of the same source: ' + kind}")


def _check_format(spec: FieldSpec) -> None:
    if spec.format is not None and spec.type not in ("date", "datetime"):
        raise ValueError("format applies to date and datetime fields only")


def _check_formats(spec: FieldSpec) -> None:
    """``_check_format`` on every source of a field and its sub-fields, types inherited."""
    for number, alt in enumerate(spec.sources()):
        try:
            _check_format(alt)
        except ValueError as exc:
            raise ValueError(f"any[{number}]: {exc}" if spec.any else str(exc)) from None
        for name, sub in (alt.fields or {}).items():
            try:
                _check_formats(sub)
            except ValueError as exc:
                raise ValueError(f"sub-field {name!r}: {exc}") from None


class Extractor(_Strict):
    """One extractor file, validated."""

    name: str
    """Its file name without ``.toml`` (a ``name`` key in the file must say the same)."""
    version: int = Field(ge=1)
    """Bump it when the fields change: every record names the version that made it."""
    description: str = ""
    fields: dict[str, FieldSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError(f"{value!r} is not an extractor name (lower-case letters, digits, '.', '_', '-'; "
                             "64 at most)")
        return value

    @field_validator("fields")
    @classmethod
    def _fields(cls, fields: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        for name, spec in fields.items():
            _check_field_name(name)
            try:
                _check_formats(spec)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            if spec.depth() > MAX_DEPTH:
                raise ValueError(f"{name}: sub-fields nested more than {MAX_DEPTH} deep")
        return fields

    def syntaxes(self) -> set[str]:
        """The embedded-metadata syntaxes (extruct's) that some field reads (the engine parses a
        syntax only when a field asks for it)."""
        found: set[str] = set()

        def walk(specs: dict[str, FieldSpec]) -> None:
            for spec in specs.values():
                found.update(spec.kinds() - DOM_SOURCES)
                if spec.fields:
                    walk(spec.fields)

        walk(self.fields)
        return found

    def required_fields(self) -> list[str]:
        return [name for name, spec in self.fields.items() if spec.required]


def _check_field_name(name: str) -> None:
    if not FIELD_NAME.match(name):
        raise ValueError(f"field name {name!r}: letters, digits and '_', not starting with a digit")


def _check_css(expression: str) -> None:
    from cssselect import SelectorError
    from parsel.csstranslator import HTMLTranslator

    try:
        HTMLTranslator().css_to_xpath(expression)
    except SelectorError as exc:
        raise ValueError(f"css {expression!r} is not a selector: {exc}") from None


def _check_xpath(expression: str) -> None:
    from lxml import etree

    try:
        etree.XPath(expression)
    except etree.XPathSyntaxError as exc:
        raise ValueError(f"xpath {expression!r} is not an expression: {exc}") from None
