"""The HTTP API over real HTTP on loopback, against a real nats-server (and a real index file)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from datetime import UTC, datetime

import aiohttp
import pytest

from busscrape.api.server import ApiServer
from busscrape.bus import names
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.dispatch.identity import task_id_for_url
from busscrape.model.messages import TaskOptions, task_key
from busscrape.search import open_index
from busscrape.search.index import IndexedPage
from busscrape.settings import settings_env
from tests.support.bus import count, wait_until
from tests.support.procs import listening_port

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api_settings(settings):
    return settings.with_overrides(api={"port": 0, "token": TOKEN, "max_body_bytes": "4KiB", "max_tasks": 50})


@pytest.fixture
async def api(applied, api_settings):
    async with ApiServer(applied, api_settings) as server:
        yield server


@pytest.fixture
async def http(api):
    async with aiohttp.ClientSession(base_url=api.url, headers=AUTH) as session:
        yield session


async def call(http, method: str, path: str, **kwargs) -> tuple[int, dict]:
    async with http.request(method, path, **kwargs) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def tasks_queued(bus, expected: int) -> bool:
    return await count(bus.js, names.TASKS_STREAM) == expected


def error_of(body: dict) -> str:
    assert set(body["error"]) == {"reason", "message"} and body["error"]["message"]
    return body["error"]["reason"]


async def test_health_and_the_openapi_document_need_no_token(api):
    async with aiohttp.ClientSession(base_url=api.url) as anonymous:
        assert await call(anonymous, "GET", "/healthz") == (200, {"status": "ok", "nats": True})
        status, doc = await call(anonymous, "GET", "/openapi.json")
        assert status == 200 and doc["openapi"].startswith("3.1")
        assert set(doc["paths"]) == {"/tasks", "/tasks/{task_id}", "/crawls", "/crawls/{crawl_id}", "/search",
                                     "/healthz"}
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert doc["components"]["schemas"]["TaskRequest"]["properties"]["urls"]["maxItems"] == 50


@pytest.mark.parametrize("header, reason", [(None, "unauthorized"), ("Bearer wrong-token", "invalid_token"),
                                            (f"Basic {TOKEN}", "unauthorized"), ("Bearer ", "unauthorized")])
async def test_a_missing_or_wrong_token_is_refused_before_anything_happens(api, applied, header, reason):
    headers = {"Authorization": header} if header else {}
    async with aiohttp.ClientSession(base_url=api.url, headers=headers) as session:
        for method, path, body in [("POST", "/tasks", {"url": "http://example.com/"}), ("GET", f"/tasks/{'a' * 32}",
                                   None), ("GET", "/search?q=x", None)]:
            async with session.request(method, path, json=body) as response:
                assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
                assert error_of(await response.json()) == reason
    assert await count(applied.js, names.SEEN_STREAM) == 0


async def test_the_token_must_match_exactly(api):
    """Raw bytes on the socket: HTTP clients refuse to send control characters, fuzzers do not."""

    async def status_with(authorization: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(api.host, api.port)
        writer.write(b"GET /search?q=x HTTP/1.1\r\nHost: api\r\nAuthorization: " + authorization +
                     b"\r\nConnection: close\r\n\r\n")
        status = (await reader.readline()).split(b" ")[1]
        writer.close()
        return status

    assert await status_with(f"Bearer {TOKEN}".encode()) == b"200"
    assert await status_with(f"bearer   {TOKEN}".encode()) == b"200"  # the scheme is case-insensitive, 1*SP
    for near in (f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}{TOKEN}", f"Bearer {TOKEN}.", f"Bearer x{TOKEN}"):
        assert await status_with(near.encode()) == b"401", near
    for near in (f"Bearer {TOKEN}\x1f", f"Bearer \x1f{TOKEN}"):  # refused by the HTTP parser, or by us
        assert await status_with(near.encode()) in (b"400", b"401"), near
    for raw in (b"Bearer \xff" + TOKEN.encode(), b"Bearer " + TOKEN.encode() + b"\xc3", b"Bearer \xe9t\xe9"):
        assert await status_with(raw) == b"401", raw  # not UTF-8: refused, not a server error


async def test_post_tasks_queues_through_the_dispatcher_with_an_outcome_per_url(api, applied, http, api_settings):
    urls = ["https://Example.COM:443/a/../page#top", "https://example.com/page", "ftp://example.com/x",
            "http://exa mple.com/", "https://example.org/other"]
    status, body = await call(http, "POST", "/tasks", json={"urls": urls, "labels": {"job": "api"}})
    assert status == 202, body
    page_id = task_id_for_url(urls[0], api_settings)
    assert [(o["index"], o["outcome"], o["task_id"], o["reason"]) for o in body["tasks"]] == [
        (0, "queued", page_id, None), (1, "duplicate", page_id, None), (2, "rejected", None, "unsupported_scheme"),
        (3, "rejected", None, "invalid_characters"), (4, "queued", task_key("https://example.org/other"), None)]
    assert (body["queued"], body["duplicate"], body["rejected"], body["already_seen"]) == (2, 1, 2, 0)
    assert await count(applied.js, names.SEEN_STREAM) == 2  # created before the PubAck came
    await wait_until(lambda: tasks_queued(applied, 2))  # TASKS sources SEEN, a moment later

    # The same request again: nothing new; with force, queued again.
    _, again = await call(http, "POST", "/tasks", json={"url": urls[1]})
    assert [o["outcome"] for o in again["tasks"]] == ["already_seen"] and again["tasks"][0]["task_id"] == page_id
    before_force = datetime.now(UTC)
    _, forced = await call(http, "POST", "/tasks", json={"url": urls[1], "force": True})
    assert [o["outcome"] for o in forced["tasks"]] == ["queued"]
    await wait_until(lambda: tasks_queued(applied, 3))

    status, history = await call(http, "GET", f"/tasks/{page_id}")
    assert status == 200 and history["url"] == "https://example.com/page" and history["state"] == "queued"
    # Forced again before anything ran: SEEN holds only the new dispatch, and nothing recorded the first
    # (its STATUS records, once a worker takes it, bring it back as a generation of its own).
    [generation] = history["generations"]
    assert generation["events"][0]["source"] == "seen"
    assert datetime.fromisoformat(generation["dispatched_at"]) >= before_force
    _, by_url = await call(http, "GET", "/tasks", params={"url": "HTTPS://example.com/page"})
    assert by_url["task_id"] == page_id


async def test_task_specs_carry_their_own_options_and_are_validated_one_by_one(applied, http):
    specs = [{"url": "https://example.com/spec", "artifacts": ["html"], "labels": {"k": "v"}},
             {"url": "https://example.com/bad", "bogus_option": 1},
             {"url": "https://example.com/steps", "steps": [{"action": "nope"}]}]
    status, body = await call(http, "POST", "/tasks", json={"tasks": specs})
    assert status == 202, body
    first, bogus, steps = body["tasks"]
    assert first["outcome"] == "queued"
    assert first["task_id"] == task_key("https://example.com/spec", (), TaskOptions(artifacts=("html",)))
    assert bogus["outcome"] == steps["outcome"] == "rejected" and bogus["reason"] == "invalid_task"
    assert "bogus_option" in bogus["detail"] and "steps" in steps["detail"]


async def test_a_url_already_dispatched_from_a_file_is_already_seen_with_the_same_id(applied, http, api_settings):
    url = "https://example.net/shared?b=2&a=1"
    published: list[str] = []
    async with Dispatcher(applied, api_settings, on_published=published.append) as dispatcher:
        await dispatcher.dispatch([url])
    _, body = await call(http, "POST", "/tasks", json={"url": url})
    assert [(o["outcome"], o["task_id"]) for o in body["tasks"]] == [("already_seen", published[0])]


@pytest.mark.parametrize("url, reason", [("ftp://example.com/", "unsupported_scheme"), ("http:///x", "missing_host"),
                                         ("http://1.2.3.4.5/", "invalid_host"), ("not a url", "invalid_characters")])
async def test_a_request_whose_every_url_is_bad_is_a_400_with_the_reason(applied, http, url, reason):
    status, body = await call(http, "POST", "/tasks", json={"url": url})
    assert status == 400 and error_of(body) == reason
    assert body["tasks"][0]["outcome"] == "rejected" and body["tasks"][0]["reason"] == reason
    status, body = await call(http, "POST", "/tasks", json={"urls": [url, "gopher://x/"]})
    assert status == 400 and error_of(body) in (reason, "invalid_tasks") and len(body["tasks"]) == 2
    assert await count(applied.js, names.SEEN_STREAM) == 0


@pytest.mark.parametrize("data, reason", [
    (b"{not json", "invalid_json"), (b"", "invalid_json"), (b"[1, 2]", "invalid_request"),
    (b'{"urls": "http://example.com/"}', "invalid_request"), (b'{"url": 5}', "invalid_request"),
    (b'{"url": "http://a.example/", "urls": ["http://b.example/"]}', "invalid_request"), (b"{}", "invalid_request"),
    (b'{"url": "http://a.example/", "priority": 1}', "invalid_request"), (b'{"urls": []}', "invalid_request"),
    (b'{"url": "http://a.example/", "force": "yes"}', "invalid_request"), (b'{"url": null}', "invalid_request"),
    (b'{"urls": ["http://a.example/"], "labels": {"k": 1}}', "invalid_request"),
])
async def test_bad_bodies_are_400_with_the_reason(applied, http, data, reason):
    status, body = await call(http, "POST", "/tasks", data=data, headers={"Content-Type": "application/json"})
    assert status == 400 and error_of(body) == reason
    assert await count(applied.js, names.SEEN_STREAM) == 0


async def test_bodies_that_are_not_json_or_too_large_are_refused(applied, http):
    status, body = await call(http, "POST", "/tasks", data=b"url=http://a.example/",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415 and error_of(body) == "unsupported_media_type"
    big = b'{"urls": ["http://example.com/' + b"x" * 5000 + b'"]}'
    status, body = await call(http, "POST", "/tasks", data=big, headers={"Content-Type": "application/json"})
    assert status == 413 and error_of(body) == "body_too_large" and "4096" in body["error"]["message"]

    async def chunks():  # no Content-Length: refused once it passes the limit, not after reading it all
        yield b'{"urls": ["http://example.com/'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"]}'

    status, body = await call(http, "POST", "/tasks", data=chunks(), headers={"Content-Type": "application/json"})
    assert status == 413 and error_of(body) == "body_too_large"
    many = {"urls": [f"http://e.example/{n}" for n in range(51)]}
    status, body = await call(http, "POST", "/tasks", json=many)
    assert status == 400 and error_of(body) == "too_many_tasks"
    assert await count(applied.js, names.SEEN_STREAM) == 0


async def test_task_lookups_answer_404_400_as_they_should(http):
    status, body = await call(http, "GET", f"/tasks/{'0' * 32}")
    assert status == 404 and error_of(body) == "not_found" and "tasks" not in body  # as docs/api.md says
    status, body = await call(http, "GET", "/tasks/NOT-AN-ID")
    assert status == 400 and error_of(body) == "invalid_task_id"
    status, body = await call(http, "GET", "/tasks", params={"url": "javascript:alert(1)"})
    assert status == 400 and error_of(body) == "unsupported_scheme"
    status, body = await call(http, "GET", "/tasks")
    assert status == 400 and error_of(body) == "invalid_request"
    status, body = await call(http, "GET", "/nowhere")
    assert status == 404 and error_of(body) == "not_found"
    async with http.delete("/tasks") as response:
        assert response.status == 405 and "POST" in response.headers["Allow"]
        assert error_of(await response.json()) == "method_not_allowed"


async def test_search_over_http(api_settings, http):
    async with open_index(api_settings) as index:
        await index.add([IndexedPage(archive_key="dt=2025-06-30/host=a.example/t1", task_id="1" * 32,
                                     url="http://a.example/", host="a.example", title="River news",
                                     text="a wombat was seen near the river", scraped_at=datetime.now(UTC))])
    status, body = await call(http, "GET", "/search", params={"q": "wombat", "host": "a.example", "since": "1d"})
    assert status == 200 and body["backend"] == "sqlite"
    [hit] = body["results"]
    assert hit["title"] == "River news" and "⟦wombat⟧" in hit["snippet"]
    assert hit["archive_key"] == "dt=2025-06-30/host=a.example/t1"
    for params, reason in [({"q": "-wombat"}, "invalid_query"), ({}, "invalid_query"),
                           ({"q": "x", "limit": "0"}, "invalid_query"), ({"q": "x", "limit": "ten"}, "invalid_query"),
                           ({"q": "x", "since": "whenever"}, "invalid_query")]:
        status, body = await call(http, "GET", "/search", params=params)
        assert status == 400 and error_of(body) == reason, params


async def test_search_off_is_a_503_and_tasks_still_work(applied, api_settings):
    off = api_settings.with_overrides(search={"backend": "off"})
    async with ApiServer(applied, off) as server, aiohttp.ClientSession(base_url=server.url, headers=AUTH) as http:
        status, body = await call(http, "GET", "/search", params={"q": "x"})
        assert status == 503 and "search is off" in body["error"]["message"]
        status, _ = await call(http, "POST", "/tasks", json={"url": "http://example.com/"})
        assert status == 202


async def test_the_api_command_serves_until_sigterm(applied, api_settings, tmp_path):
    env = settings_env(api_settings.with_overrides(api={"port": 0}))  # its own free port, logged
    with (tmp_path / "api.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "busscrape", "api"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        port = await listening_port(tmp_path / "api.log", "api.listening", proc)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}", headers=AUTH) as http:
            for _ in range(200):
                try:
                    status, _ = await call(http, "GET", "/healthz")
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            status, body = await call(http, "POST", "/tasks", json={"url": "http://example.com/cli"})
            assert status == 202 and body["queued"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    assert code == 0, (tmp_path / "api.log").read_text()[-2000:]
