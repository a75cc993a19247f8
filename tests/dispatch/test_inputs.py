"""The dispatcher's input reader: formats, gzip, stdin, bad bytes and bounded memory."""

import asyncio
import gzip
import io
import os
import sys

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from busscrape.dispatch import inputs
from busscrape.dispatch.inputs import Rejection, TaskDefaults, TaskSpec, open_reader
from busscrape.dispatch.urls import REASONS as URL_REASONS
from busscrape.dispatch.urls import UrlNormaliser
from busscrape.errors import ConfigurationError, InputError
from busscrape.model.messages import TaskOptions
from busscrape.model.steps import Click

DEFAULTS = TaskDefaults(steps=(Click(selector="#more"),), options=TaskOptions(har_content="embed"),
                        labels={"job": "daily"})


async def read_all(source, fmt="auto", defaults=DEFAULTS, **kw) -> list:
    reader = open_reader(source, fmt, defaults, **kw)
    items = []
    async for batch in reader:
        items.extend(batch)
    return items


async def test_a_url_list_skips_blanks_and_comments_and_keeps_line_numbers(tmp_path):
    path = tmp_path / "urls.txt"
    path.write_bytes(b"\xef\xbb\xbfhttp://example.com/a\r\n\n   \n# a comment\n  http://example.com/b  \n"
                     b"http://example.com/c")
    items = await read_all(path)
    assert [(i.line, i.url) for i in items] == [(1, "http://example.com/a"), (5, "http://example.com/b"),
                                                (6, "http://example.com/c")]
    # Every URL of a list carries the command line's steps, options and labels (the very objects).
    assert all(i.steps is DEFAULTS.steps and i.options is DEFAULTS.options and i.labels is DEFAULTS.labels
               for i in items)


async def test_gzip_is_recognised_by_its_bytes_for_lists_and_jsonl(tmp_path):
    lists = tmp_path / "urls.txt.gz"
    lists.write_bytes(gzip.compress(b"http://example.com/1\nhttp://example.com/2\n"))
    specs = tmp_path / "specs.jsonl.gz"
    specs.write_bytes(gzip.compress(b'{"url": "http://example.com/3"}\n'))
    odd_name = tmp_path / "urls.data"
    odd_name.write_bytes(gzip.compress(b"http://example.com/4\n"))
    assert [i.url for i in await read_all(lists)] == ["http://example.com/1", "http://example.com/2"]
    assert [i.url for i in await read_all(specs)] == ["http://example.com/3"]
    assert [i.url for i in await read_all(odd_name)] == ["http://example.com/4"]


async def test_stdin_with_dash(monkeypatch):
    data = gzip.compress(b"http://example.com/from-stdin\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    assert [i.url for i in await read_all("-")] == ["http://example.com/from-stdin"]


async def test_a_slow_pipe_hands_each_line_over_at_once_and_lets_go_on_close(monkeypatch):
    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "r"))
    reader = open_reader("-")
    batches = aiter(reader)
    try:
        os.write(write_end, b"http://example.com/1\n")
        first = await asyncio.wait_for(anext(batches), 5)  # not held back until a batch fills
        os.write(write_end, b"http://example.com/2\nhttp://exa")  # a half-written line waits for its end
        second = await asyncio.wait_for(anext(batches), 5)
        assert [[i.url for i in b] for b in (first, second)] == [["http://example.com/1"], ["http://example.com/2"]]
        reader.close()
        await asyncio.to_thread(reader._thread.join, 5)
        assert not reader._thread.is_alive()  # the writer never closed the pipe, yet the thread is gone
    finally:
        os.close(write_end)


async def test_jsonl_specs_take_defaults_and_override_them(tmp_path):
    path = tmp_path / "specs.jsonl"
    lines = [
        {"url": "http://example.com/plain"},
        {"url": "http://example.com/own", "steps": [], "labels": {"customer": "c1"}, "artifacts": ["html"],
         "viewport": {"width": 400}, "wait_until": "networkidle", "extractor": "demo-product"},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    plain, own = await read_all(path)
    assert plain.options is DEFAULTS.options and plain.steps is DEFAULTS.steps
    assert own.steps == ()
    assert own.labels == {"job": "daily", "customer": "c1"}
    assert own.options.artifacts == ("html",)
    assert own.options.har_content == "embed"  # from the defaults
    assert (own.options.viewport.width, own.options.viewport.height) == (400, 800)  # merged, not replaced
    assert own.options.wait_until == "networkidle"
    assert own.options.extractor == "demo-product" and plain.options.extractor is None


async def test_every_bad_line_is_a_rejection_with_its_line_number(tmp_path):
    path = tmp_path / "specs.jsonl"
    path.write_bytes(b"\n".join([
        b'{"url": "http://example.com/ok"}',
        b'{"url": "http://example.com/x",',                       # 2 invalid_json
        b'["http://example.com/"]',                                 # 3 invalid_task: not an object
        b'{"steps": []}',                                           # 4 invalid_task: no url
        b'{"url": "http://example.com/", "colour": "red"}',         # 5 invalid_task: unknown field
        b'{"url": "http://example.com/", "steps": [{"action": "fly"}]}',  # 6 invalid_task: bad step
        b'{"url": "http://example.com/", "viewport": {"width": 1}}',      # 7 invalid_task: bad option
        b'{"url": "http://example.com/\xff"}',                      # 8 invalid_encoding
    ]) + b"\n")
    items = await read_all(path)
    assert isinstance(items[0], TaskSpec)
    got = [(r.line, r.reason) for r in items[1:]]
    assert got == [(2, "invalid_json"), (3, "invalid_task"), (4, "invalid_task"), (5, "invalid_task"),
                   (6, "invalid_task"), (7, "invalid_task"), (8, "invalid_encoding")]
    by_line = {r.line: r for r in items[1:]}
    assert "url" in by_line[4].detail and "colour" in by_line[5].detail and "viewport.width" in by_line[7].detail
    assert by_line[8].text.endswith('\\xff"}')  # bytes escaped, never a crash


async def test_what_would_fail_every_attempt_in_the_worker_is_refused_at_dispatch(tmp_path):
    path = tmp_path / "specs.jsonl"
    shots = '[{"action": "screenshot", "name": "top"}, {"action": "screenshot", "name": "top"}]'
    path.write_text("\n".join([
        f'{{"url": "http://example.com/1", "steps": {shots}}}',              # one archive file for two
        '{"url": "http://example.com/2", "headers": {"X-Bad": "a\\nb"}}',  # Chromium: invalid value
        '{"url": "http://example.com/3", "headers": {"Bad Name": "v"}}',    # Chromium: invalid name
        '{"url": "http://example.com/4", "headers": {"Host": "other"}}',     # Chromium: ERR_INVALID_ARGUMENT
        '{"url": "http://example.com/5", "user_agent": "agent\\r\\nX: y"}',
        '{"url": "http://example.com/6", "steps": [{"action": "goto", "url": "http://u:pw@example.com/"}]}',
        '{"url": "http://example.com/7", "headers": {"Authorization": "Basic dTpw"}, "user_agent": "Bot/1.0 (ü)"}',
    ]) + "\n")
    items = await read_all(path)
    rejected = {r.line: r.detail for r in items if isinstance(r, Rejection)}
    assert sorted(rejected) == [1, 2, 3, 4, 5, 6]
    assert "screenshot step names must be unique" in rejected[1] and "top" in rejected[1]
    assert "control character" in rejected[2] and "not an HTTP token" in rejected[3]
    assert "the browser's own to set" in rejected[4] and "user_agent holds a control character" in rejected[5]
    assert "options.headers" in rejected[6] and "pw@" not in rejected[6]
    assert isinstance(items[-1], TaskSpec) and items[-1].options.headers == {"Authorization": "Basic dTpw"}


async def test_an_overlong_line_is_skipped_without_holding_it(tmp_path):
    path = tmp_path / "urls.txt"
    path.write_bytes(b"http://example.com/1\nhttp://example.com/" + b"x" * 5000 + b"\nhttp://example.com/3\n")
    items = await read_all(path, max_line_bytes=1000)
    assert isinstance(items[1], Rejection) and items[1].reason == "line_too_long" and items[1].line == 2
    assert len(items[1].text) <= inputs.TEXT_PREVIEW + 1
    assert (items[2].line, items[2].url) == (3, "http://example.com/3")


async def test_a_truncated_gzip_keeps_what_was_read_and_says_so(tmp_path):
    path = tmp_path / "urls.txt.gz"
    whole = gzip.compress(b"".join(b"http://example.com/%d\n" % i for i in range(2000)))
    path.write_bytes(whole[: len(whole) // 2])
    items = await read_all(path)
    assert all(isinstance(i, TaskSpec) for i in items[:-1]) and len(items) > 10
    assert items[-1].reason == "unreadable_input"


async def test_the_input_is_streamed_not_slurped(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"".join(b"http://example.com/page/%d\n" % i for i in range(200_000)))
    reader = open_reader(path, batch_size=100, ahead=2)
    batches = aiter(reader)
    first = await anext(batches)
    assert len(first) == 100
    assert reader.bytes_total == path.stat().st_size
    assert reader.bytes_read < reader.bytes_total / 10  # a few batches ahead, not the whole file
    reader.close()


async def test_a_python_iterable_works_as_a_source():
    items = await read_all(["http://example.com/a", "", "# no", "http://example.com/b"], defaults=TaskDefaults())
    assert [(i.line, i.url) for i in items] == [(1, "http://example.com/a"), (4, "http://example.com/b")]


def test_a_missing_file_or_a_directory_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="cannot read the input"):
        open_reader(tmp_path / "nope.txt")
    with pytest.raises(ConfigurationError, match="is a directory"):
        open_reader(tmp_path)


_LINE = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode),
                  st.sampled_from([b"http://example.com/", b"# c", b"", b"{}", b'{"url": "http://a/"}', b"\xff",
                                   b"\xef\xbb\xbf", b" \r", b"\xef\xbb\xbf# c"]))


@hsettings(max_examples=150, deadline=None)
@given(lines=st.lists(_LINE, max_size=25), jsonl=st.booleans())
def test_fuzz_every_line_is_classified(tmp_path_factory, lines, jsonl):
    """Arbitrary bytes: each line is skipped (blank/comment), or exactly one spec or rejection."""
    path = tmp_path_factory.mktemp("fuzz") / "in.data"
    body = b"\n".join(line.replace(b"\n", b" ") for line in lines)
    path.write_bytes(body)
    items = asyncio.run(read_all(path, "jsonl" if jsonl else "urls"))
    assert [i.line for i in items] == content_lines(body)
    normaliser = UrlNormaliser()
    for item in items:
        if isinstance(item, Rejection):
            assert item.reason in inputs.REASONS
            continue
        try:
            normaliser(item.url)
        except InputError as exc:
            assert exc.reason in URL_REASONS


def content_lines(body: bytes) -> list[int]:
    """Numbers of the lines a reader must report on: all but blanks and comments (BOM on line 1 only).

    A body that starts like gzip but is not is read as gzip: one ``unreadable_input`` at line 1.
    """
    if body.startswith(b"\x1f\x8b"):
        return [1]
    numbers = []
    for number, raw in enumerate(body.split(b"\n") if body else [], 1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = "undecodable"
        if text and not text.startswith("#"):
            numbers.append(number)
    return numbers
