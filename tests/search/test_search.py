"""The search index on both backends (SQLite FTS5 in a file, a real PostgreSQL on loopback), the
ingester's feed into it, and ``busscrape search``.

The end-to-end test renders a page whose searched word exists only once its JavaScript has run,
with a real worker in real Chromium, archives it with a real ingester, and finds the word.
"""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from busscrape.archive.layout import plan
from busscrape.archive.storage.local import FileStorage
from busscrape.bus import provision, topology
from busscrape.errors import ConfigurationError
from busscrape.ingest.daemon import Ingester
from busscrape.model.messages import ScrapeResult
from busscrape.model.steps import WaitFor
from busscrape.search import open_index
from busscrape.search.feed import SearchFeed, reindex
from busscrape.search.index import IndexedPage, InvalidQuery, SearchQuery, parse_since
from busscrape.settings import settings_env
from busscrape.status.records import StatusBoard
from busscrape.worker.daemon import Worker
from tests.conftest import make_settings
from tests.ingest.test_daemon import SCRAPED, produce
from tests.support.bus import enqueue
from tests.support.cli import busscrape

WORD = "glimmerquokka4242"
JS_PAGE = """<!doctype html><html><head><title>Quokka sightings</title></head><body>
<p>Plain words that the server sends.</p><div id=app>loading</div>
<script>setTimeout(() => {
  document.getElementById('app').textContent = 'seen: ' + 'glimmer' + 'quokka' + (4200 + 42); }, 50);
</script></body></html>"""
NOW = datetime.now(UTC).replace(microsecond=0)


def page(key: str, title: str, text: str, *, host: str = "a.example", age_days: int = 0) -> IndexedPage:
    return IndexedPage(archive_key=f"dt=x/host={host}/{key}", task_id=key.ljust(32, "0")[:32],
                       url=f"http://{host}/{key}", host=host, title=title, text=text,
                       scraped_at=NOW - timedelta(days=age_days))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path, nats_url):
    """Settings for one backend; PostgreSQL gets a fresh database on the session's server."""
    search = {"backend": request.param, "sqlite_path": str(tmp_path / "idx.sqlite3")}
    if request.param == "postgres":
        search["postgres_dsn"] = request.getfixturevalue("pg_dsn")
    return make_settings(tmp_path, nats_url, search=search)


async def test_ranked_search_with_snippets_filters_and_upserts(backend):
    async with open_index(backend) as index:
        await index.add([
            page("p1", "Fox facts", "the quick brown fox jumps over the lazy dog"),
            page("p2", "Dogs", "a dog sleeps; a fox is mentioned once, far away from anything", host="b.example"),
            page("p3", "Old fox", "fox fox fox", age_days=30),
        ])
        hits = await index.search(SearchQuery.parse("fox"))
        assert {h.archive_key.rsplit("/", 1)[1] for h in hits} == {"p1", "p2", "p3"}
        assert hits[0].title in ("Fox facts", "Old fox")  # title matches outrank a mention in the text
        assert all(h.score > 0 for h in hits) and [h.score for h in hits] == sorted((h.score for h in hits),
                                                                                      reverse=True)
        p2 = next(h for h in hits if h.title == "Dogs")
        assert "⟦fox⟧" in p2.snippet and p2.host == "b.example" and p2.url == "http://b.example/p2"

        assert [h.title for h in await index.search(SearchQuery.parse("fox", host="B.Example"))] == ["Dogs"]
        recent = await index.search(SearchQuery.parse("fox", since=NOW - timedelta(days=7)))
        assert {h.title for h in recent} == {"Fox facts", "Dogs"}
        assert [h.title for h in await index.search(SearchQuery.parse('"brown fox"'))] == ["Fox facts"]
        assert len(await index.search(SearchQuery.parse("fox", limit=1))) == 1
        assert await index.search(SearchQuery.parse("unicorn")) == []

        # the same archive folder again (a redelivery) replaces its row
        await index.add([page("p1", "Fox facts, revised", "no canine words remain")])
        assert await index.count() == 3
        assert [h.title for h in await index.search(SearchQuery.parse("revised"))] == ["Fox facts, revised"]
        assert "Fox facts, revised" not in [h.title for h in await index.search(SearchQuery.parse("quick"))]


async def test_query_text_is_a_parameter_never_sql(backend):
    async with open_index(backend) as index:
        bobby = "Robert'); DROP TABLE pages;--"
        await index.add([page("p1", bobby, "little bobby tables"), page("p2", "Unrelated", "nothing in common")])
        searched = 0
        for hostile in ["'; DROP TABLE pages; --", "bobby' OR '1'='1", "tables); DELETE FROM busscrape_pages; --"]:
            try:
                hits = await index.search(SearchQuery.parse(hostile))
            except InvalidQuery:
                continue  # FTS5 may find it malformed: an answer, not an injection
            searched += 1
            # Searched as words, it can only find the page holding them: an injected condition
            # (OR '1'='1') would bring the unrelated page too.
            assert {h.title for h in hits} <= {bobby}, hostile
        # Valid full-text syntax in both backends (a word and a quoted phrase), so it is searched,
        # never refused: SQL in it is words of the phrase, found in the title that holds them.
        for hostile in ['bobby "\'); DROP TABLE pages;--"', '"\' OR \'1\'=\'1" tables']:
            hits = await index.search(SearchQuery.parse(hostile))
            searched += 1
            assert [h.title for h in hits] == ([bobby] if "DROP" in hostile else []), hostile
        assert searched >= 2  # the containment checks above ran, not only the refusals
        assert await index.count() == 2
        assert [h.title for h in await index.search(SearchQuery.parse("bobby"))] == ["Robert'); DROP TABLE pages;--"]


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b", "x" * 1001, "x" + "\x1e" * 1000])
def test_queries_no_backend_accepts_are_refused_alike(bad):
    with pytest.raises(InvalidQuery):
        SearchQuery.parse(bad)
    with pytest.raises(InvalidQuery):
        SearchQuery.parse("ok", limit=0)


PARITY_PAGES = [
    ("q1", "Pandemic notes", "covid-19 cases rose; see the e-mail from example.com"),
    ("q2", "Mail guide", "how to write an e-mail to a friend"),
    ("q3", "Domains", "example.com and example.org are reserved names"),
    ("q4", "Foxes", "the quick brown fox jumps over the lazy dog"),
    ("q5", "Dogs", "a lazy dog; covid 19 is mentioned; brown bears too"),
]
# query -> the pages both backends find (one language: websearch-style, search.terms)
PARITY = {
    "covid-19": {"q1", "q5"},  # the phrase "covid 19": tokenizers split the hyphen
    "example.com": {"q1", "q3"},
    "e-mail": {"q1", "q2"},
    '"brown fox"': {"q4"},
    "brown fox": {"q4"},
    "fox or bears": {"q4", "q5"},
    "lazy -fox": {"q5"},
    'dog -"brown fox"': {"q5"},
    "FOX OR e-mail -friend": {"q1", "q4"},
    '"unbalanced': set(),
    "nosuchcolumn:word": set(),
    "AND": {"q3"},  # a word like any other ("example.com and example.org")
    "NEAR(a b": set(),
    "C++ or covid-19": {"q1", "q5"},
    "'; DROP TABLE pages; --": set(),
}


async def test_one_query_language_finds_the_same_pages_on_both_backends(tmp_path, nats_url, pg_dsn):
    found = {}
    for name, extra in (("sqlite", {"sqlite_path": str(tmp_path / "p.sqlite3")}),
                        ("postgres", {"postgres_dsn": pg_dsn})):
        async with open_index(make_settings(tmp_path, nats_url, search={"backend": name, **extra})) as index:
            await index.add([page(key, title, text) for key, title, text in PARITY_PAGES])
            found[name] = {q: {h.archive_key.rsplit("/", 1)[1] for h in await index.search(SearchQuery.parse(q))}
                           for q in PARITY}
    assert found["sqlite"] == PARITY
    assert found["postgres"] == PARITY


@pytest.mark.parametrize("nothing", ["-fox", "--", "-a -b", "- -", '""', "-\"lazy dog\""])
def test_a_query_with_no_word_to_find_is_refused_on_every_backend(nothing):
    with pytest.raises(InvalidQuery, match="invalid query: it has no word to find"):
        SearchQuery.parse(nothing)


def test_since_takes_dates_times_and_ages():
    now = datetime(2025, 7, 1, 12, tzinfo=UTC)
    assert parse_since("2025-06-30", now) == datetime(2025, 6, 30, tzinfo=UTC)
    assert parse_since("2025-06-30T10:00:00+02:00", now) == datetime(2025, 6, 30, 8, tzinfo=UTC)
    assert parse_since("36h", now) == datetime(2025, 6, 30, tzinfo=UTC)
    with pytest.raises(InvalidQuery):
        parse_since("yesterday-ish", now)


async def test_a_wrong_postgres_password_or_off_backend_is_a_configuration_error(tmp_path, nats_url, postgres):
    s = make_settings(tmp_path, nats_url, search={"backend": "postgres",
                                                  "postgres_dsn": postgres.dsn("postgres", password="wrong")})
    with pytest.raises(ConfigurationError) as info:
        await open_index(s).__aenter__()
    assert "refused the credentials" in str(info.value) and "wrong" not in str(info.value)
    with pytest.raises(ConfigurationError):
        open_index(make_settings(tmp_path, nats_url, search={"backend": "off"}))


# -- the ingester's feed ------------------------------------------------------------------------


@pytest.fixture
def js_site(site):
    site.page("/quokka", JS_PAGE)
    return site


async def scrape(bus, settings, site, path: str = "/quokka"):
    """Render ``path`` with a real worker, then archive it with a real ingester (and its feed)."""
    await provision.apply(bus.js, topology.load(settings))
    task = await enqueue(bus.js, site.url(path), steps=(WaitFor(selector=f"text={WORD}"),))
    async with Worker(bus, settings.with_overrides(worker={"exit_when_idle": "1s", "concurrency": 1})) as worker:
        await worker.run()
    async with FileStorage(settings.archive_dir()) as storage:
        ingester = Ingester(bus, storage, settings.with_overrides(ingester={"exit_when_idle": "1s"}))
        async with ingester:
            await asyncio.wait_for(ingester.run(), 60)
    return task, ingester


@pytest.mark.browser
async def test_search_finds_a_word_only_javascript_wrote(bus, backend, js_site):
    assert WORD not in JS_PAGE  # only a browser running the script can produce it
    s = backend.with_overrides(network={"allow": [f"{h}/32" for h in js_site.hosts]},
                               worker={"navigation_timeout": "10s"})
    task, ingester = await scrape(bus, s, js_site)
    assert ingester.counters["archived"] == 1 and ingester.counters["indexed"] == 1, ingester.counters
    async with open_index(s) as index:
        [hit] = await index.search(SearchQuery.parse(WORD))
        assert await index.search(SearchQuery.parse("loading")) == []  # the text before the script ran is gone
    assert hit.task_id == task.task_id and hit.url == js_site.url("/quokka") and hit.title == "Quokka sightings"
    assert f"⟦{WORD}⟧" in hit.snippet
    [archived] = [e for e in await StatusBoard(bus.js).history(task.task_id) if e.state == "archived"]
    assert archived.archive is not None and archived.archive.endswith(hit.archive_key)


async def test_an_unusable_index_never_fails_archiving(bus, tmp_path, nats_url):
    """PostgreSQL configured but not there: results are archived and acked, the misses counted."""
    s = make_settings(tmp_path, nats_url, search={"backend": "postgres", "timeout": "2s",
                                                  "postgres_dsn": "postgresql://u:p@127.0.0.1:1/none"})
    await provision.apply(bus.js, topology.load(s))
    for n in range(3):
        await produce(bus.js, url=f"http://127.0.0.2:8000/p{n}", files={"page.txt": b"words %d" % n})
    async with FileStorage(tmp_path / "archive") as storage:
        ingester = Ingester(bus, storage, s.with_overrides(ingester={"max_results": 3}))
        async with ingester:
            await asyncio.wait_for(ingester.run(), 60)
        assert ingester.counters["archived"] == 3
        assert ingester.counters["index_failed"] == 3 and ingester.counters["indexed"] == 0
        assert len([k for k in await storage.keys() if k.endswith("meta.json")]) == 3


async def test_a_full_queue_drops_pages_instead_of_waiting(tmp_path, nats_url):
    s = make_settings(tmp_path, nats_url, search={"queue": 1})
    async with FileStorage(tmp_path / "archive") as storage:
        feed = SearchFeed(s, storage)  # not started: nothing takes from the queue
        result = ScrapeResult(task_id="a" * 32, task_seq=1, url="http://x/", original_url="http://x/",
                              final_url="http://x/", worker="w", attempt=1, scraped_at=SCRAPED)
        for _ in range(3):
            feed.archived(result, plan(result))
        assert feed.counters["index_dropped"] == 2
        await feed.close(timeout=0)
        assert feed.counters["index_dropped"] == 3  # what was still queued at close is not silently lost either


async def test_reindex_rebuilds_the_index_from_the_archive(bus, tmp_path, nats_url, backend):
    off = backend.with_overrides(search={"backend": "off"})
    await provision.apply(bus.js, topology.load(off))
    for n in range(3):
        await produce(bus.js, url=f"http://127.0.0.2:8000/r{n}", files={"page.txt": f"archived words {n}".encode()})
    async with FileStorage(off.archive_dir()) as storage:
        ingester = Ingester(bus, storage, off.with_overrides(ingester={"max_results": 3}))
        async with ingester:
            await asyncio.wait_for(ingester.run(), 60)
        assert ingester.counters["indexed"] == 0  # search was off while these were archived
        async with open_index(backend) as index:
            assert await reindex(storage, index, limit=1 << 20) == 3
            hits = await index.search(SearchQuery.parse("archived"))
            assert len(hits) == 3 and all(h.url.startswith("http://127.0.0.2:8000/r") for h in hits)
            # meta.json's HTTP status is indexed: a filter of its own, with or without text
            assert {h.archive_key for h in await index.search(SearchQuery.parse("", status=200))} == \
                {h.archive_key for h in hits}


# -- the command --------------------------------------------------------------------------------


def cli(settings, *args: str) -> subprocess.CompletedProcess[str]:
    return busscrape("search", *args, env=settings_env(settings), timeout=60)


async def test_the_search_command_prints_results_json_and_refuses_bad_queries(tmp_path, nats_url):
    s = make_settings(tmp_path, nats_url)
    async with open_index(s) as index:
        await index.add([page("c1", "Command line", "the quokka is a small marsupial")])
    shown = await asyncio.to_thread(cli, s, "quokka")
    assert shown.returncode == 0, shown.stderr
    assert "Command line" in shown.stdout and "http://a.example/c1" in shown.stdout and "dt=x/host=a.example/c1" \
        in shown.stdout
    as_json = await asyncio.to_thread(cli, s, "marsupial", "--json", "--host", "a.example", "--since", "1d")
    doc = orjson.loads(as_json.stdout)
    assert doc["backend"] == "sqlite" and [r["title"] for r in doc["results"]] == ["Command line"]
    bad = await asyncio.to_thread(cli, s, "--", "-quokka")
    assert bad.returncode == 2 and "invalid query" in bad.stderr and "Traceback" not in bad.stderr
    off = await asyncio.to_thread(cli, s.with_overrides(search={"backend": "off"}), "quokka")
    assert off.returncode == 2 and "search is off" in off.stderr


@pytest.mark.parametrize(("env", "fails"), [({}, False), ({"CI": "0"}, False), ({"CI": "true"}, True),
                                            ({"BUSSCRAPE_REQUIRE_POSTGRES": "1"}, True)])
def test_a_missing_postgresql_skips_outside_ci_and_fails_in_it(env, fails):
    from tests.support.postgres import unavailable

    try:
        unavailable("PostgreSQL is not installed", env)
    except BaseException as exc:  # pytest's outcomes are BaseExceptions: caught here, not acted on
        outcome = exc
    else:
        raise AssertionError("neither skipped nor failed")
    assert type(outcome) is (pytest.fail.Exception if fails else pytest.skip.Exception), outcome
    assert "PostgreSQL is not installed" in str(outcome)


def test_make_test_requires_postgresql():
    from tests.support.deploy import make_test_pytest

    variables, pytest_command = make_test_pytest()
    assert "BUSSCRAPE_REQUIRE_POSTGRES=1" in variables.split()
    assert pytest_command.endswith(".venv/bin/python -m pytest"), pytest_command
