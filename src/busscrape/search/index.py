"""The full-text index of archived pages: one interface, two backends, chosen by a setting.

::

    SearchIndex ................ async context manager: add pages, search them
    ├── SqliteIndex              (search.sqlite) FTS5 in one local file: bm25 ranking, snippet();
    │                            the embedded default, BUSSCRAPE_SEARCH__BACKEND=sqlite
    └── PostgresIndex            (search.postgres) tsvector + GIN: ts_rank_cd ranking, ts_headline();
                                 production, several ingesters, BUSSCRAPE_SEARCH__BACKEND=postgres

``busscrape.search.open_index`` picks the backend; this interface imports neither.

A row is one archived page (``IndexedPage``), keyed by its archive folder: a redelivered result
rewrites its own row, a recrawl on another day adds a row of its own (the archive keeps both
too). Queries have one language on both backends (``search.terms``: ``word``, ``"a phrase"``,
``a or b``, ``-word``), parsed once into terms that each backend renders in its own syntax,
always bound as a parameter.

A page whose task had an extractor is indexed with its record: the record's text is searched with
the page's, and ``SearchQuery.where`` (``--where price<100``) keeps the pages whose record's
field holds the condition.

Errors, and what happens with them:

- ``InvalidQuery`` — the query is empty, too long, holds control characters or does not parse:
  ``busscrape search`` exits 2 with the reason, the API answers 400.
- ``SearchUnavailable`` — the index did not answer: the API answers 503; the ingester's feed
  logs and counts it, and the page stays archived (an index never fails archiving).
- ``ConfigurationError`` — the index cannot be opened as configured (no driver, bad DSN,
  unwritable file): the command exits 2 with the fix.
"""

from __future__ import annotations

import re
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from busscrape.errors import InputError, RetryableError
from busscrape.search.terms import Terms
from busscrape.search.terms import parse as parse_terms
from busscrape.units import parse_duration

MAX_QUERY_CHARS = 1000
MARK_START, MARK_END = "⟦", "⟧"
"""Around each matched term in a snippet: plain characters that page text almost never holds,
safe to show on a terminal and safe in JSON (unlike ``<b>``, which a client might render as HTML)."""
SNIPPET_WORDS = 24
LEAD_CHARS = 200
"""A result found without text (filters only) shows the start of its text, this long."""


class InvalidQuery(InputError):
    """A search query that cannot run: CLI exit 2, API 400. ``message`` says why."""

    reason = "invalid_query"


class SearchUnavailable(RetryableError):
    """The index did not answer in time or refused: API 503; the ingester's feed counts it and goes on."""

    reason = "search_unavailable"


@dataclass(frozen=True, slots=True)
class IndexedPage:
    """What the index keeps of one archived page."""

    archive_key: str
    """The page's archive folder (``dt=…/host=…/<task_id>``): the row's identity."""
    task_id: str
    url: str
    host: str
    title: str
    text: str
    """The page's visible text (the ``text`` artifact), cut at ``search.max_text_bytes``."""
    scraped_at: datetime
    extractor: str | None = None
    record: dict[str, Any] | None = None
    """The extractor's record, when the task had one: its text is indexed, its fields filter (``where``)."""
    crawl_id: str | None = None
    """The crawl the page was found by (``meta.json``'s ``crawl``), for ``--crawl``."""
    status: int | None = None
    """The page's HTTP status, for ``--status``."""


MAX_FILTERS = 8
FILTER_PATTERN = r"^\s*[A-Za-z_][A-Za-z0-9_]{0,63}\s*(<=|>=|!=|=|<|>)\s*\S"
_FILTER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]{0,63})\s*(<=|>=|!=|=|<|>)\s*(.*?)\s*$", re.S)
Operator = Literal["<", "<=", ">", ">=", "=", "!="]


@dataclass(frozen=True, slots=True)
class Filter:
    """``price<100``: a top-level field of the extracted record compared with a value. A value that
    reads as a number compares as a number (so ``"1299.00"``, a decimal, is more than 100); any
    other value compares as text (ISO dates then compare in time order)."""

    field: str
    op: Operator
    value: str
    number: Decimal | None

    @classmethod
    def parse(cls, text: str) -> Filter:
        match = _FILTER.match(text)
        if match is None or not match.group(3):
            raise InvalidQuery(f"where {text!r}: write FIELD<VALUE (operators < <= > >= = !=), e.g. price<100")
        name, op, value = match.groups()
        if any(unicodedata.category(c) == "Cc" for c in value) or len(value) > 200:
            raise InvalidQuery(f"where {text!r}: the value holds control characters or is over 200 characters")
        try:
            parsed = Decimal(value)
            number = parsed if parsed.is_finite() else None
        except InvalidOperation:
            number = None
        return cls(name, op, value, number)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.field}{self.op}{self.value}"


MAX_OFFSET = 100_000
"""The furthest page of results a query may ask for (``offset``): deeper paging is a narrower query."""
CRAWL_ID = re.compile(r"^[0-9a-f]{16}$")
Column = Literal["host", "scraped_at", "crawl_id", "status"]


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A validated query: build it with ``SearchQuery.parse``.

    With text, the best matches first; without (``terms`` None, at least one filter given), every
    page the filters keep, newest first. Either order ends on the archive key, so pages of results
    (``offset``, ``limit``) neither repeat nor skip a page while the index stands still.
    """

    text: str
    host: str | None = None
    since: datetime | None = None
    limit: int = 10
    where: tuple[Filter, ...] = ()
    """Conditions on the extracted record's fields, all of which must hold."""
    terms: Terms | None = None
    """``text`` parsed (``search.terms``): what the backends search for; None: no text, filters only."""
    crawl: str | None = None
    status: int | None = None
    offset: int = 0
    """How many results (in the query's order) to skip: the start of a page of results."""

    @classmethod
    def parse(cls, text: str, *, host: str | None = None, since: datetime | None = None, limit: int = 10,
              max_limit: int = 100, where: list[str] | tuple[str, ...] = (), crawl: str | None = None,
              status: int | None = None, offset: int = 0) -> SearchQuery:
        """Check what no backend would accept, so both refuse it alike (``InvalidQuery``)."""
        # Length and characters are checked as given, before stripping: what the API document promises.
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidQuery(f"the query is longer than {MAX_QUERY_CHARS} characters")
        if any(unicodedata.category(c) == "Cc" for c in text):
            raise InvalidQuery("the query holds control characters")
        if not 1 <= limit <= max_limit:
            raise InvalidQuery(f"limit must be between 1 and {max_limit}, not {limit}")
        if not 0 <= offset <= MAX_OFFSET:
            raise InvalidQuery(f"offset must be between 0 and {MAX_OFFSET:,}, not {offset}")
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        if len(where) > MAX_FILTERS:
            raise InvalidQuery(f"at most {MAX_FILTERS} where conditions")
        crawl = crawl.strip().lower() if crawl and crawl.strip() else None
        if crawl is not None and not CRAWL_ID.match(crawl):
            raise InvalidQuery(f"crawl {crawl[:40]!r}: a crawl id is 16 lower-case hex characters")
        if status is not None and not 100 <= status <= 599:
            raise InvalidQuery(f"status must be an HTTP status (100 to 599), not {status}")
        host = host.strip().lower() if host and host.strip() else None
        filters = tuple(Filter.parse(w) for w in where)
        stripped = text.strip()
        terms = parse_terms(stripped) if stripped else None
        if not stripped and not (host or since or filters or crawl or status is not None):
            raise InvalidQuery("the query is empty (give words to find, or a filter: host, since, where, crawl, "
                               "status)")
        if stripped and terms is None:
            raise InvalidQuery("invalid query: it has no word to find (a query of only -exclusions, operators or "
                               "punctuation finds nothing)")
        return cls(stripped, host, since, limit, filters, terms, crawl, status, offset)

    def columns(self) -> list[tuple[Column, str, Any]]:
        """The filters on the page's own columns as (column, operator, value), all of which must
        hold; each backend writes them in its SQL (``where`` filters read the record: ``Filter``)."""
        given: list[tuple[Column, str, Any]] = [("host", "=", self.host), ("scraped_at", ">=", self.since),
                                                ("crawl_id", "=", self.crawl), ("status", "=", self.status)]
        return [(column, op, value) for column, op, value in given if value is not None]


class SearchHit(BaseModel):
    """One ranked result."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    url: str
    host: str
    title: str
    scraped_at: datetime
    archive_key: str
    snippet: str
    """Text around the best matches, each matched term between ``⟦`` and ``⟧``."""
    score: float
    """Higher is better (bm25 negated / ts_rank_cd); comparable within one result list only."""
    extractor: str | None = None
    record: dict[str, Any] | None = None
    """The page's extracted record, when its task had an extractor."""
    crawl_id: str | None = None
    status: int | None = None


class SearchPage(BaseModel):
    """One page of a query's results, and whether another follows."""

    model_config = ConfigDict(frozen=True)

    hits: list[SearchHit]
    more: bool


class SearchIndex(ABC):
    """An index of archived pages. ``async with index: await index.search(...)``."""

    backend: str
    where: str
    """What it points at, for logs and messages (a file path, a DSN without its password)."""

    def __init__(self) -> None:
        self._entered = False

    async def __aenter__(self) -> SearchIndex:
        if self._entered:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        self._entered = True
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abstractmethod
    async def open(self) -> None:
        """Connect and create the tables when missing (``ConfigurationError`` when it cannot)."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connection(s)."""

    @abstractmethod
    async def add(self, pages: list[IndexedPage]) -> None:
        """Insert or replace pages (by archive key) in one transaction (``SearchUnavailable``)."""

    @abstractmethod
    async def search(self, query: SearchQuery) -> list[SearchHit]:
        """The best matches first, or the newest first without text (``InvalidQuery``, ``SearchUnavailable``)."""

    async def page(self, query: SearchQuery) -> SearchPage:
        """``query``'s results, and whether there are more after them (one more is read to know)."""
        hits = await self.search(replace(query, limit=query.limit + 1))
        return SearchPage(hits=hits[:query.limit], more=len(hits) > query.limit)

    @abstractmethod
    async def count(self) -> int:
        """How many pages the index holds."""


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC (a naive time is taken as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``2025-06-30``, ``2025-06-30T12:00:00Z`` or an age (``7d``, ``36h``) as a UTC time."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=parse_duration(text))
        except (ValueError, OverflowError):
            raise InvalidQuery(f"since: {text!r} is neither a date, a time (ISO 8601) nor an age (7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
