"""``GET /search`` and the console's Pages view: one reading of the query parameters into a
``SearchQuery`` (text, host, since, crawl, status, where, limit, offset), one index opened on
first use (and again after a failed open), one page of results and whether more follow."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping

from multidict import MultiMapping

from busscrape.api.answers import ApiError
from busscrape.api.schema import MAX_HOST_PARAM, MAX_SINCE_PARAM, SearchResults
from busscrape.errors import ConfigurationError
from busscrape.search import open_index
from busscrape.search.index import InvalidQuery, SearchIndex, SearchQuery, SearchUnavailable, parse_since
from busscrape.settings import Settings

_INTEGER = re.compile(r"^-?[0-9]{1,9}$")
Params = Mapping[str, str] | MultiMapping[str]


def _integer(q: Params, name: str, default: int | None) -> int | None:
    text = q.get(name)
    if text is None or (not text.strip() and default is None):
        return default
    if not _INTEGER.match(text):
        raise InvalidQuery(f"{name} must be an integer, not {text[:40]!r}")
    return int(text)


def query_of(q: Params, *, max_limit: int) -> SearchQuery:
    """The query the parameters ask for (``InvalidQuery`` naming the parameter and why)."""
    for name, longest in (("host", MAX_HOST_PARAM), ("since", MAX_SINCE_PARAM)):
        if len(q.get(name, "")) > longest:
            raise InvalidQuery(f"{name} is longer than {longest} characters")
    since = q.get("since", "").strip()
    return SearchQuery.parse(q.get("q", ""), host=q.get("host"), since=parse_since(since) if since else None,
                             limit=_integer(q, "limit", 10) or 0, max_limit=max_limit,
                             where=q.getall("where", []) if isinstance(q, MultiMapping) else [],
                             crawl=q.get("crawl"), status=_integer(q, "status", None),
                             offset=_integer(q, "offset", 0) or 0)


class Searching:
    """The API's search: its index, opened when first asked."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._index: SearchIndex | None = None
        self._lock = asyncio.Lock()

    async def find(self, q: Params) -> SearchResults:
        """One page of results for the query parameters ``q`` (``ApiError`` 400 or 503)."""
        try:
            query = query_of(q, max_limit=self.settings.api.max_search_results)
            index = await self.index()
            found = await index.page(query)
        except InvalidQuery as exc:
            raise ApiError(400, exc.reason, exc.message) from None
        except (SearchUnavailable, ConfigurationError) as exc:
            raise ApiError(503, exc.reason, exc.message) from None
        return SearchResults(query=query.text, backend=index.backend, results=found.hits, offset=query.offset,
                             more=found.more)

    async def index(self) -> SearchIndex:
        """The index, opened on first use (and again after a failed open)."""
        async with self._lock:
            if self._index is None:
                index = open_index(self.settings)
                await index.__aenter__()
                self._index = index
            return self._index

    async def close(self) -> None:
        if self._index is not None:
            index, self._index = self._index, None
            await index.close()
