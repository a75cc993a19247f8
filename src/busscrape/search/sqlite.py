"""The embedded search index: SQLite FTS5 in one local file (``<state_dir>/search.sqlite3``).

Pages live in a plain table; an external-content FTS5 table indexes their title, text, URL and
extracted record's text (``where`` filters read the record's JSON with ``json_extract``),
kept in step by triggers, so a row is stored once and ``snippet()`` reads it from the table.
Ranking is ``bm25`` with the title weighted above the text and the URL below it.

sqlite3 blocks, so every call runs on one thread of the index's own (one connection, used
from that thread only, calls in order); the event loop never waits on the disk. The file is
in WAL mode, so ``busscrape search`` and the API read while an ingester writes, and a second
ingester on the same machine waits its turn (``busy_timeout``) instead of failing.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson

from busscrape.errors import ConfigurationError
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

T = TypeVar("T")

SCHEMA_VERSION = 3
# Version 3: the crawl and the HTTP status of each page, filters of their own (and the newest first).
INDEXES_3 = """
CREATE INDEX IF NOT EXISTS pages_crawl ON pages(crawl_id, scraped_at);
CREATE INDEX IF NOT EXISTS pages_newest ON pages(scraped_at, archive_key);
"""
MIGRATE_2 = """
ALTER TABLE pages ADD COLUMN crawl_id TEXT;
ALTER TABLE pages ADD COLUMN status INTEGER;
""" + INDEXES_3
TABLES = """
CREATE TABLE IF NOT EXISTS pages (
    id INTEGER PRIMARY KEY,
    archive_key TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    url TEXT NOT NULL,
    host TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    scraped_at TEXT NOT NULL,
    indexed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    extracted TEXT NOT NULL DEFAULT '',
    extractor TEXT,
    record TEXT,
    crawl_id TEXT,
    status INTEGER
);
CREATE INDEX IF NOT EXISTS pages_host ON pages(host, scraped_at);
CREATE INDEX IF NOT EXISTS pages_task ON pages(task_id);
""" + INDEXES_3
FTS = """
CREATE VIRTUAL TABLE IF NOT EXISTS pages_fts USING fts5(
    title, body, url, extracted, content='pages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS pages_ai AFTER INSERT ON pages BEGIN
    INSERT INTO pages_fts(rowid, title, body, url, extracted) VALUES (new.id, new.title, new.body, new.url,
                                                                       new.extracted);
END;
CREATE TRIGGER IF NOT EXISTS pages_ad AFTER DELETE ON pages BEGIN
    INSERT INTO pages_fts(pages_fts, rowid, title, body, url, extracted)
    VALUES ('delete', old.id, old.title, old.body, old.url, old.extracted);
END;
CREATE TRIGGER IF NOT EXISTS pages_au AFTER UPDATE ON pages BEGIN
    INSERT INTO pages_fts(pages_fts, rowid, title, body, url, extracted)
    VALUES ('delete', old.id, old.title, old.body, old.url, old.extracted);
    INSERT INTO pages_fts(rowid, title, body, url, extracted) VALUES (new.id, new.title, new.body, new.url,
                                                                       new.extracted);
END;
"""
SCHEMA = TABLES + FTS
# Version 1 (before extraction): the record's columns added, the FTS table made again with its
# extracted column and rebuilt from the pages.
MIGRATE_1 = """
ALTER TABLE pages ADD COLUMN extracted TEXT NOT NULL DEFAULT '';
ALTER TABLE pages ADD COLUMN extractor TEXT;
ALTER TABLE pages ADD COLUMN record TEXT;
DROP TRIGGER IF EXISTS pages_ai; DROP TRIGGER IF EXISTS pages_ad; DROP TRIGGER IF EXISTS pages_au;
DROP TABLE IF EXISTS pages_fts;
""" + FTS + "INSERT INTO pages_fts(pages_fts) VALUES ('rebuild');" + MIGRATE_2
MIGRATIONS = {1: MIGRATE_1, 2: MIGRATE_2}

UPSERT = """
INSERT INTO pages (archive_key, task_id, url, host, title, body, scraped_at, extracted, extractor, record,
                   crawl_id, status)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (archive_key) DO UPDATE SET
    task_id = excluded.task_id, url = excluded.url, host = excluded.host, title = excluded.title,
    body = excluded.body, scraped_at = excluded.scraped_at, extracted = excluded.extracted,
    extractor = excluded.extractor, record = excluded.record, crawl_id = excluded.crawl_id,
    status = excluded.status,
    indexed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
"""

# Weights of bm25 per FTS column (title, body, url, extracted). bm25 is lower-is-better; the hit's
# score is negated. {where} is one "AND <condition>" per filter (``_conditions``). The archive key
# ends every order: pages of results (OFFSET) neither repeat nor skip a row.
COLUMNS = "p.task_id, p.url, p.host, p.title, p.scraped_at, p.archive_key, p.extractor, p.record, p.crawl_id, p.status"
SEARCH = f"""
SELECT {COLUMNS}, snippet(pages_fts, -1, ?, ?, '…', {SNIPPET_WORDS}) AS snippet,
       bm25(pages_fts, 5.0, 1.0, 2.0, 3.0) AS rank
FROM pages_fts JOIN pages p ON p.id = pages_fts.rowid
WHERE pages_fts MATCH ?
  {{where}}
ORDER BY rank, p.scraped_at DESC, p.archive_key
LIMIT ? OFFSET ?
"""
# No text: every page the filters keep, newest first; the snippet is the text's start.
LISTING = f"""
SELECT {COLUMNS}, substr(p.body, 1, {LEAD_CHARS}) AS snippet, 0.0 AS rank
FROM pages p
WHERE 1 = 1
  {{where}}
ORDER BY p.scraped_at DESC, p.archive_key DESC
LIMIT ? OFFSET ?
"""


def _number(value: Any) -> float | None:
    """A record's value as a number, or NULL (``"1299.00"`` is a number; ``"abc"`` is not)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _conditions(query: SearchQuery) -> tuple[str, list[Any]]:
    """SQL and parameters for the query's filters (columns and operators come from fixed sets)."""
    sql: list[str] = []
    params: list[Any] = []
    for column, op, value in query.columns():
        sql.append(f"AND p.{column} {op} ?")
        params.append(_timestamp(value) if isinstance(value, datetime) else value)
    for f in query.where:
        if f.number is not None:
            sql.append(f"AND busscrape_number(json_extract(p.record, ?)) {f.op} ?")
            params += [f"$.{f.field}", float(f.number)]
        else:
            sql.append(f"AND json_extract(p.record, ?) {f.op} ?")
            params += [f"$.{f.field}", f.value]
    return "\n  ".join(sql), params

SYNTAX = 'query syntax: words, "a phrase", a or b, -word'
# What SQLite says when the MATCH expression itself is wrong (as opposed to the file or the disk):
# never for what fts5() renders, but said as a query's fault, not the index's, should it happen.
_QUERY_ERRORS = ("fts5:", "no such column", "unterminated string", "unknown special query", "syntax error")


def fts5(terms: Terms) -> str:
    """The terms as an FTS5 MATCH expression: every term a quoted string (FTS5 splits it into the
    phrase of its tokens, ``"covid-19"`` → covid 19: nothing in it is an operator)."""
    def quoted(term: Term) -> str:
        return '"' + term.text.replace('"', '""') + '"'

    groups = [quoted(g[0]) if len(g) == 1 else "(" + " OR ".join(map(quoted, g)) + ")" for g in terms.groups]
    return " AND ".join(groups) + "".join(f" NOT {quoted(t)}" for t in terms.excluded)


def _timestamp(moment: datetime) -> str:
    """A sortable UTC text form: every stored time has the same shape, so text order is time order."""
    return utc(moment).isoformat(timespec="microseconds")


class SqliteIndex(SearchIndex):
    """FTS5 in ``path``; the folder is created when missing."""

    backend = "sqlite"

    def __init__(self, path: Path, *, timeout: float = 10.0) -> None:
        super().__init__()
        self.path = Path(path).expanduser()
        self.where = str(self.path)
        self.timeout = timeout
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search-sqlite")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._thread, fn, *args), self.timeout)
        except TimeoutError:
            raise SearchUnavailable(f"the search index {self.path} did not answer within {self.timeout:g}s") from None

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        try:
            await self._call(self._open)
        except (sqlite3.Error, OSError) as exc:
            raise ConfigurationError(
                f"cannot open the search index {self.path} ({exc}); fix the folder's permissions, point "
                "BUSSCRAPE_SEARCH__SQLITE_PATH elsewhere, or set BUSSCRAPE_SEARCH__BACKEND=off") from None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # A power cut may cost the last commits, never the file: the archive is the record, and
            # `busscrape search --reindex` rebuilds the index from it.
            db.execute("PRAGMA synchronous=NORMAL")
            db.create_function("busscrape_number", 1, _number, deterministic=True)
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                # One script, one transaction: a second process opening the file at the same moment
                # waits for it, then finds every IF NOT EXISTS satisfied (and the version it wrote).
                script = MIGRATIONS.get(version, SCHEMA)
                try:
                    db.executescript(f"BEGIN IMMEDIATE;{script}PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
                except sqlite3.Error as exc:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    if "fts5" in str(exc):
                        raise ConfigurationError(f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5; "
                                                 "use BUSSCRAPE_SEARCH__BACKEND=postgres") from None
                    raise
        except BaseException:
            db.close()
            raise
        self._db = db

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.get_running_loop().run_in_executor(self._thread, db.close)
        self._thread.shutdown(wait=False)

    # -- writes and reads ---------------------------------------------------------------------

    async def add(self, pages: list[IndexedPage]) -> None:
        if pages:
            await self._guarded(self._add, pages)

    def _add(self, pages: list[IndexedPage]) -> None:
        db = self._connection()
        rows = [(p.archive_key, p.task_id, p.url, p.host, p.title, p.text, _timestamp(p.scraped_at),
                 records.text_of(p.record) if p.record else "", p.extractor,
                 orjson.dumps(p.record).decode() if p.record is not None else None, p.crawl_id, p.status)
                for p in pages]
        with _transaction(db):
            db.executemany(UPSERT, rows)

    async def search(self, query: SearchQuery) -> list[SearchHit]:
        where, filters = _conditions(query)
        if query.terms is None:
            sql, params = LISTING, (*filters, query.limit, query.offset)
        else:
            sql, params = SEARCH, (MARK_START, MARK_END, fts5(query.terms), *filters, query.limit, query.offset)
        rows = await self._guarded(self._search, sql.format(where=where), params)
        return [SearchHit(task_id=r[0], url=r[1], host=r[2], title=r[3], scraped_at=datetime.fromisoformat(r[4]),
                          archive_key=r[5], extractor=r[6], record=orjson.loads(r[7]) if r[7] else None,
                          crawl_id=r[8], status=r[9], snippet=r[10] or "", score=-r[11]) for r in rows]

    def _search(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._connection().execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            message = str(exc)
            if any(marker in message for marker in _QUERY_ERRORS):
                raise InvalidQuery(f"invalid query: {message.removeprefix('fts5: ')} ({SYNTAX})") from None
            raise

    async def count(self) -> int:
        return await self._guarded(lambda: self._connection().execute("SELECT count(*) FROM pages").fetchone()[0])

    async def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._call(fn, *args)
        except (sqlite3.Error, OSError) as exc:
            raise SearchUnavailable(f"the search index {self.path} failed: {exc}") from None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError("the index is not open (use `async with`)")
        return self._db


class _transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection.

    IMMEDIATE takes the write lock at once, so two writers queue on ``busy_timeout`` rather than
    one failing with "database is locked" when it tries to upgrade a read lock.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        if not self.db.in_transaction:
            return
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")
