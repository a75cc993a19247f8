"""The production search index: PostgreSQL full-text search (tsvector + GIN), through asyncpg.

One table, ``busscrape_pages``, keyed by archive folder. Its ``document`` column is computed at
write time: the title (weight A), the text (B) and the URL (C) under the configured text-search
configuration (``BUSSCRAPE_SEARCH__POSTGRES_CONFIG``, ``simple`` by default: no stemming, so any
language indexes alike) and the extracted record's text (B; the record itself in ``record jsonb``,
which ``where`` filters read). A GIN index serves ``@@``; results are ranked by ``ts_rank_cd`` (cover
density, which rewards matched terms that stand close together) and shown with ``ts_headline``.
Queries go through ``websearch_to_tsquery``, from the terms of ``search.terms`` rendered as a
normalised websearch text (``websearch``: the same query means the same on SQLite); everything is
a bound parameter, the configuration name included.

Several ingesters share the table: the tables are created under an advisory lock, so two
processes starting at once do not race on ``CREATE TABLE IF NOT EXISTS``.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import orjson

from busscrape.errors import AuthenticationFailed, ConfigurationError
from busscrape.extract import records
from busscrape.search.index import (
    LEAD_CHARS,
    MARK_END,
    MARK_START,
    SNIPPET_WORDS,
    IndexedPage,
    InvalidQuery,
    SearchHit,
    SearchIndex,
    SearchQuery,
    SearchUnavailable,
    utc,
)
from busscrape.search.terms import Term, Terms

TABLE = "busscrape_pages"
SCHEMA_LOCK = zlib.crc32(b"busscrape.search.schema")  # the advisory lock that serialises schema creation
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    archive_key text PRIMARY KEY,
    task_id text NOT NULL,
    url text NOT NULL,
    host text NOT NULL,
    title text NOT NULL,
    body text NOT NULL,
    scraped_at timestamptz NOT NULL,
    indexed_at timestamptz NOT NULL DEFAULT now(),
    document tsvector NOT NULL
);
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS extracted text NOT NULL DEFAULT '';
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS extractor text;
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS record jsonb;
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS crawl_id text;
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS status integer;
CREATE INDEX IF NOT EXISTS {TABLE}_document ON {TABLE} USING gin (document);
CREATE INDEX IF NOT EXISTS {TABLE}_host ON {TABLE} (host, scraped_at);
CREATE INDEX IF NOT EXISTS {TABLE}_task ON {TABLE} (task_id);
CREATE INDEX IF NOT EXISTS {TABLE}_crawl ON {TABLE} (crawl_id, scraped_at);
CREATE INDEX IF NOT EXISTS {TABLE}_newest ON {TABLE} (scraped_at, archive_key);
"""



def _words(text: str) -> str:
    """SQL: ``text`` with a hyphen inside a word made a space, as queries are (``websearch``):
    PostgreSQL's parser reads ``covid-19`` as ``covid`` and ``-19``, FTS5 as ``covid 19``."""
    return f"regexp_replace({text}, '(?<=\\w)-(?=\\w)', ' ', 'g')"


DOCUMENT = (f"setweight(to_tsvector($1::regconfig, {_words('$6')}), 'A') "
            f"|| setweight(to_tsvector($1::regconfig, {_words('$7')}), 'B') "
            f"|| setweight(to_tsvector('simple', {_words('$4')}), 'C') "
            f"|| setweight(to_tsvector($1::regconfig, {_words('$9')}), 'B')")
UPSERT = f"""
INSERT INTO {TABLE} (archive_key, task_id, url, host, title, body, scraped_at, extracted, extractor, record, crawl_id,
                     status, document)
VALUES ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, {DOCUMENT})
ON CONFLICT (archive_key) DO UPDATE SET
    task_id = excluded.task_id, url = excluded.url, host = excluded.host, title = excluded.title,
    body = excluded.body, scraped_at = excluded.scraped_at, extracted = excluded.extracted,
    extractor = excluded.extractor, record = excluded.record, crawl_id = excluded.crawl_id, status = excluded.status,
    document = excluded.document, indexed_at = now()
"""
# A record's value as a number where it is one ("1299.00" is; "abc" is not: no cast error).
NUMBER = ("(CASE WHEN p.record->>(${k}::text) ~ '^\\s*[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)\\s*$' "
          "THEN (p.record->>(${k}::text))::numeric END)")

# {where} is one "AND <condition>" per filter (``_conditions``). The archive key ends every order:
# pages of results (OFFSET) neither repeat nor skip a row.
COLUMNS = ("p.task_id, p.url, p.host, p.title, p.scraped_at, p.archive_key, p.extractor, p.record::text AS record, "
           "p.crawl_id, p.status")
SEARCH = f"""
WITH q AS (SELECT websearch_to_tsquery($3::regconfig, $4) AS query)
SELECT {COLUMNS}, ts_headline($3::regconfig, p.body || ' ' || p.extracted, q.query, $5) AS snippet,
       ts_rank_cd(p.document, q.query) AS score
FROM {TABLE} p, q
WHERE p.document @@ q.query
  {{where}}
ORDER BY score DESC, p.scraped_at DESC, p.archive_key
LIMIT $1 OFFSET $2
"""
# No text: every page the filters keep, newest first; the snippet is the text's start.
LISTING = f"""
SELECT {COLUMNS}, left(p.body, {LEAD_CHARS}) AS snippet, 0.0 AS score
FROM {TABLE} p
WHERE true
  {{where}}
ORDER BY p.scraped_at DESC, p.archive_key DESC
LIMIT $1 OFFSET $2
"""
COLUMN_TYPES = {"host": "text", "scraped_at": "timestamptz", "crawl_id": "text", "status": "integer"}
HEADLINE = (f'StartSel="{MARK_START}", StopSel="{MARK_END}", MaxWords={SNIPPET_WORDS}, MinWords=8, '
            'MaxFragments=2, FragmentDelimiter=" … "')


def masked(dsn: str) -> str:
    """The DSN with its password replaced, for messages and logs."""
    # The user may be empty (``postgresql://:pw@host``) and the password may hold ``@`` or ``/``:
    # everything up to the last ``@`` before the host is the secret.
    return re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", re.sub(r"(password=)\S+", r"\1***", dsn))


_HYPHEN = re.compile(r"(?<=\w)-(?=\w)")


def websearch(terms: Terms) -> str:
    """The terms as a ``websearch_to_tsquery`` text: every term quoted (a phrase of the
    configuration's tokens: nothing in it is an operator), ``or`` within a group, ``-`` excluded.
    A hyphen inside a word is a space: PostgreSQL's parser keeps ``covid-19`` as one token
    beside its parts, FTS5 only has the parts; the phrase of the parts finds both spellings on
    both backends (``covid-19`` and ``covid 19``)."""
    def quoted(term: Term) -> str:
        return '"' + _HYPHEN.sub(" ", term.text) + '"'  # terms hold no double quote (search.terms)

    return " ".join([" or ".join(map(quoted, g)) for g in terms.groups] + [f"-{quoted(t)}" for t in terms.excluded])

class PostgresIndex(SearchIndex):
    """``busscrape_pages`` in the database ``dsn`` names (created when missing)."""

    backend = "postgres"

    def __init__(self, dsn: str, *, config: str = "simple", timeout: float = 10.0, pool_size: int = 4) -> None:
        super().__init__()
        self.dsn = dsn
        self.where = masked(dsn)
        self.config = config
        self.timeout = timeout
        self.pool_size = pool_size
        self._pool: Any = None

    async def open(self) -> None:
        try:
            import asyncpg
        except ImportError:
            raise ConfigurationError("the postgres search backend needs asyncpg: pip install 'busscrape[postgres]'") \
                from None
        try:
            self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size,
                                                   command_timeout=self.timeout, timeout=self.timeout)
            async with self._pool.acquire() as db, db.transaction():
                await db.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
                await db.execute(SCHEMA)
                await db.execute("SELECT $1::regconfig", self.config)
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            await self.close()
            raise AuthenticationFailed(f"PostgreSQL at {self.where} refused the credentials ({exc}); "
                                       "check BUSSCRAPE_SEARCH__POSTGRES_DSN") from None
        except asyncpg.UndefinedObjectError as exc:
            await self.close()
            raise ConfigurationError(f"PostgreSQL at {self.where}: {exc}; set BUSSCRAPE_SEARCH__POSTGRES_CONFIG to "
                                     "one of `SELECT cfgname FROM pg_ts_config` (simple, english …)") from None
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            raise ConfigurationError(f"cannot use PostgreSQL at {self.where} for search ({type(exc).__name__}: "
                                     f"{exc}); check BUSSCRAPE_SEARCH__POSTGRES_DSN, or set "
                                     "BUSSCRAPE_SEARCH__BACKEND=sqlite") from None

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await pool.close()
            except (OSError, TimeoutError):
                pool.terminate()

    async def add(self, pages: list[IndexedPage]) -> None:
        if not pages:
            return
        rows = [(self.config, p.archive_key, p.task_id, p.url, p.host, _clean(p.title), _clean(p.text),
                 utc(p.scraped_at), _clean(records.text_of(p.record)) if p.record else "", p.extractor,
                 _clean(orjson.dumps(p.record).decode()) if p.record is not None else None, p.crawl_id, p.status)
                for p in pages]
        await self._run("executemany", UPSERT, rows, write=True)

    async def search(self, query: SearchQuery) -> list[SearchHit]:
        params: list[Any] = [query.limit, query.offset]
        if query.terms is None:
            sql = LISTING
        else:
            sql = SEARCH
            params += [self.config, websearch(query.terms), HEADLINE]
        where, filters = _conditions(query, first=len(params) + 1)
        rows = await self._run("fetch", sql.format(where=where), *params, *filters)
        return [SearchHit(task_id=r["task_id"], url=r["url"], host=r["host"], title=r["title"],
                          scraped_at=r["scraped_at"], archive_key=r["archive_key"], snippet=r["snippet"] or "",
                          score=float(r["score"]), extractor=r["extractor"],
                          record=orjson.loads(r["record"]) if r["record"] else None, crawl_id=r["crawl_id"],
                          status=r["status"]) for r in rows]

    async def count(self) -> int:
        return int(await self._run("fetchval", f"SELECT count(*) FROM {TABLE}"))

    async def _run(self, method: str, *args: Any, write: bool = False) -> Any:
        import asyncpg

        if self._pool is None:
            raise SearchUnavailable(f"the search index at {self.where} is not open")
        try:
            async with self._pool.acquire(timeout=self.timeout) as db:
                if not write:
                    return await getattr(db, method)(*args)
                async with db.transaction():
                    return await getattr(db, method)(*args)
        except asyncpg.DataError as exc:
            if write:
                raise SearchUnavailable(f"PostgreSQL at {self.where} refused a page: {exc}") from None
            # What a query holds that PostgreSQL cannot take (an encoding, a parameter value).
            raise InvalidQuery(f"invalid query: {exc}") from None
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise SearchUnavailable(f"PostgreSQL at {self.where} failed: {type(exc).__name__}: {exc}") from None


def _conditions(query: SearchQuery, *, first: int) -> tuple[str, list[Any]]:
    """SQL and parameters (numbered from ``$first``) for the query's filters (columns and operators
    come from fixed sets)."""
    sql: list[str] = []
    params: list[Any] = []
    for column, op, value in query.columns():
        sql.append(f"AND p.{column} {op} ${first + len(params)}::{COLUMN_TYPES[column]}")
        params.append(value)
    for f in query.where:
        k, v = first + len(params), first + len(params) + 1
        if f.number is not None:
            sql.append(f"AND {NUMBER.format(k=k)} {f.op} ${v}::numeric")
            params += [f.field, f.number]
        else:
            sql.append(f"AND p.record->>(${k}::text) {f.op} ${v}::text")
            params += [f.field, f.value]
    return "\n  ".join(sql), params


def _clean(text: str) -> str:
    """PostgreSQL text cannot hold NUL; pages occasionally do."""
    return text.replace("\x00", "") if "\x00" in text else text
