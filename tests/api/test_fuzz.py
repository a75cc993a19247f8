"""Property-based fuzzing of the HTTP API against its own OpenAPI document (schemathesis).

The API runs for real on loopback (its own event loop in a thread, a real nats-server behind
it, a real SQLite index); schemathesis loads ``/openapi.json`` from it and, per operation,
sends schema-valid and schema-violating requests, checking every answer: no 5xx, a documented
status, content type and body schema, violations refused with a 4xx, the bearer token not
ignored, undocumented methods answered 405.

One check is left out: ``positive_data_acceptance`` (schema-valid input must succeed). No
schema can say which strings are URLs a browser accepts or well-formed FTS5 queries, so a
valid-looking ``"ftp://x"`` or ``"a AND"`` is rightly refused with 400 and a reason.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from busscrape.api.schema import openapi_document
from busscrape.api.server import ApiServer
from busscrape.bus import provision, topology
from busscrape.bus.connection import Bus
from busscrape.search import open_index
from busscrape.search.index import IndexedPage
from busscrape.settings import Settings
from tests.conftest import make_settings, wipe

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 30  # per operation: the whole run stays well under a minute


class LiveApi:
    """``ApiServer`` in a background thread with its own event loop, reachable from sync tests."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="live-api")
        self.url = ""

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> None:
        self.bus = await Bus.connect(self.settings, name=f"fuzz-{uuid.uuid4().hex[:6]}")
        await wipe(self.bus)
        await provision.apply(self.bus.js, topology.load(self.settings))
        async with open_index(self.settings) as index:  # something for /search to find
            await index.add([IndexedPage(archive_key="dt=2025-06-30/host=a.example/f", task_id="f" * 32,
                                         url="http://a.example/", host="a.example", title="Fuzz",
                                         text="hypothesis generated this", scraped_at=datetime.now(UTC))])
        self.server = ApiServer(self.bus, self.settings)
        await self.server.__aenter__()
        self.url = self.server.url

    async def _stop(self) -> None:
        await self.server.__aexit__(None, None, None)
        await self.bus.close()

    def __enter__(self) -> LiveApi:
        self.thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


API_SETTINGS = {"port": 0, "token": TOKEN, "max_body_bytes": "64KiB", "max_tasks": 20}


@pytest.fixture(scope="module")
def live_api(tmp_path_factory, nats_server) -> Iterator[LiveApi]:
    """One server for every operation and example: what earlier examples queued, later ones see."""
    with LiveApi(make_settings(tmp_path_factory.mktemp("fuzz"), nats_server.url, api=API_SETTINGS)) as api:
        yield api


@pytest.fixture(scope="module")
def served_schema(live_api) -> schemathesis.BaseSchema:
    """The document the live server serves. Loaded lazily, when the test runs: building the
    examples of schemathesis' coverage phase at collection cost ~5 s of CPU in every xdist worker,
    though only one runs the test."""
    return schemathesis.openapi.from_url(f"{live_api.url}/openapi.json")


served = schemathesis.pytest.from_fixture("served_schema")


def test_the_server_serves_the_document_its_settings_describe(live_api):
    import urllib.request

    with urllib.request.urlopen(f"{live_api.url}/openapi.json", timeout=10) as response:
        served_document = orjson.loads(response.read())
    assert served_document == orjson.loads(orjson.dumps(openapi_document(Settings(api=API_SETTINGS))))
    assert served_document["paths"], "the document names no operation: the fuzzing below would check nothing"


# One test, each operation a subtest ("[POST /tasks]" …): a failing operation fails it. ~15 s
# alone, but every request waits for the cores (a thread, the API's loop, NATS and back): 116 s
# in a fresh-clone run (load 12–20), 322 s with four CPU hogs beside the suite (over the default
# 300 s timeout), for 11–14 s of CPU each time.
@pytest.mark.timeout(900)
@served.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_the_api_keeps_to_its_openapi_document(case, live_api):
    case.call_and_validate(base_url=live_api.url, headers=AUTH, excluded_checks=[positive_data_acceptance])
