"""The dispatcher against a real nats-server: exact counts, three layers of dedup, crashes and cuts."""

import asyncio
import gzip
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.publisher import WRONG_LAST_SEQUENCE, Publication, PublishFailed
from busscrape.dispatch import inputs, urls
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.dispatch.fingerprints import FingerprintSet
from busscrape.dispatch.inputs import TaskDefaults
from busscrape.dispatch.template import TaskTemplate
from busscrape.errors import ConfigurationError, StreamsMissing
from busscrape.model.messages import ScrapeTask, TaskOptions, decode, encode, task_key
from busscrape.model.steps import Click, Scroll
from tests.conftest import make_settings, wipe
from tests.dispatch.test_inputs import content_lines
from tests.support.bus import wait_until
from tests.support.cli import busscrape
from tests.support.net import TcpProxy
from tests.support.procs import env_for, kill9, spawn
from tests.support.relay import Relay

DEFAULTS = TaskDefaults(steps=(Click(selector="#more"),), options=TaskOptions(har_content="embed"),
                        labels={"job": "test"})


async def dispatch(bus, settings, source, **kw):
    async with Dispatcher(bus, settings, kw.pop("defaults", DEFAULTS), **kw) as dispatcher:
        return await dispatcher.dispatch(source)


async def tasks_by_id(js) -> Counter:
    """How many times TASKS holds each task id (its subjects are partitions, not task ids)."""
    state = (await js.stream_info(names.TASKS_STREAM)).state
    seqs = list(range(state.first_seq, state.last_seq + 1)) if state.messages else []
    counts: Counter = Counter()
    for i in range(0, len(seqs), 500):
        for msg in await asyncio.gather(*(js.get_msg(names.TASKS_STREAM, q) for q in seqs[i:i + 500])):
            assert msg.subject == names.task_subject(orjson.loads(msg.data)["task_id"])
            counts[orjson.loads(msg.data)["task_id"]] += 1
    return counts


async def settled(js) -> int:
    """TASKS sources SEEN asynchronously: wait until it holds what SEEN accepted, then count."""
    for _ in range(200):
        seen = (await js.stream_info(names.SEEN_STREAM)).state.last_seq
        tasks = (await js.stream_info(names.TASKS_STREAM)).state.messages
        if tasks >= seen:
            return tasks
        await asyncio.sleep(0.05)
    raise AssertionError(f"TASKS holds {tasks} of the {seen} tasks SEEN accepted")


def task_id_of(url: str, defaults: TaskDefaults = DEFAULTS) -> str:
    return task_key(urls.normalise(url), defaults.steps, defaults.options)


MIXED = b"\n".join([
    b"http://example.com/a",                       # 1 published
    b"HTTP://EXAMPLE.com:80/a#top",                # 2 duplicate of 1 once normalised
    b"http://example.com/b?utm_source=x",          # 3 published
    b"ftp://example.com/",                         # 4 unsupported_scheme
    b"http://",                                    # 5 missing_host
    b"http://example.com/" + b"x" * 3000,          # 6 too_long
    b"http://xn--zz.example/",                     # 7 invalid_idna
    b"http://1.2.3.4.5/",                          # 8 invalid_host
    b"http://[::1",                                # 9 invalid_url
    b"http://exa mple.com/",                       # 10 invalid_characters
    b"\xff\xfehttp://example.com/",                # 11 invalid_encoding
    b"# a comment",                                # 12 skipped
    b"",                                           # 13 skipped
    b"http://127.1:8080/x",                        # 14 published as http://127.0.0.1:8080/x
    b"http://127.0.0.1:8080/x",                    # 15 duplicate of 14
    b"http://example.com/a",                       # 16 duplicate of 1
]) + b"\n"
MIXED_VALID = ["http://example.com/a", "http://example.com/b?utm_source=x", "http://127.1:8080/x"]


async def test_counts_are_exact_across_runs_and_force(applied, settings, tmp_path):
    path = tmp_path / "urls.txt"
    path.write_bytes(MIXED)
    published: list[str] = []
    rejected: list[inputs.Rejection] = []
    async with Dispatcher(applied, settings, DEFAULTS, on_published=published.append,
                          on_rejected=rejected.append) as dispatcher:
        first = await dispatcher.dispatch(path)
    assert (first.read, first.invalid, first.duplicate_in_input, first.already_seen, first.published,
            first.failed, first.unconfirmed) == (14, 8, 3, 0, 3, 0, 0)
    assert first.invalid_by_reason == {reason: 1 for reason in (
        "invalid_characters", "invalid_encoding", "invalid_host", "invalid_idna", "invalid_url",
        "missing_host", "too_long", "unsupported_scheme")}
    assert [(r.line, r.reason) for r in rejected] == [
        (4, "unsupported_scheme"), (5, "missing_host"), (6, "too_long"), (7, "invalid_idna"), (8, "invalid_host"),
        (9, "invalid_url"), (10, "invalid_characters"), (11, "invalid_encoding")]
    assert len(rejected[2].text) <= inputs.TEXT_PREVIEW + 1
    expected = {task_id_of(u) for u in MIXED_VALID}
    assert set(published) == expected and len(published) == 3
    assert first.exit_code() == 0 and first.exit_code(strict=True) == 1
    await settled(applied.js)
    assert await tasks_by_id(applied.js) == {t: 1 for t in expected}

    again = await dispatch(applied, settings, path)
    assert (again.read, again.invalid, again.duplicate_in_input, again.already_seen, again.published) == (
        14, 8, 3, 3, 0)

    forced = await dispatch(applied, settings, path, force=True)
    assert (forced.duplicate_in_input, forced.already_seen, forced.published) == (3, 0, 3)
    await settled(applied.js)
    assert await tasks_by_id(applied.js) == {t: 2 for t in expected}


async def test_a_task_carries_identity_urls_options_labels_and_trace_context(applied, settings):
    before = datetime.now(UTC)
    await dispatch(applied, settings, ["HTTP://Example.COM:80/page#top"])
    await settled(applied.js)
    msg = await applied.js.get_msg(names.TASKS_STREAM, 1)
    task = decode(ScrapeTask, msg.data)
    assert msg.subject == names.task_subject(task.task_id)
    assert task.task_id == task_id_of("http://example.com/page")
    assert (task.url, task.original_url) == ("http://example.com/page", "HTTP://Example.COM:80/page#top")
    assert (task.steps, task.options, task.labels) == (DEFAULTS.steps, DEFAULTS.options, DEFAULTS.labels)
    assert before - timedelta(seconds=1) <= task.dispatched_at <= datetime.now(UTC)
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", msg.headers[names.TRACEPARENT])
    assert msg.headers[names.MSG_TTL] == str(7 * 86400)
    # A create is idempotent by itself: no de-duplication id (each cost SEEN and TASKS an entry
    # for their duplicate windows, issue #19). Only a --force put carries one.
    assert names.MSG_ID not in msg.headers


async def test_tasks_spread_over_a_bounded_set_of_subjects(applied, settings):
    # One subject per task cost nats-server an index entry per queued task (issue #19).
    await dispatch(applied, settings, [f"http://example.com/spread/{i}" for i in range(300)])
    assert await settled(applied.js) == 300
    by_id = await tasks_by_id(applied.js)  # also checks each subject is names.task_subject(id)
    assert len(by_id) == 300 and set(by_id.values()) == {1}
    subjects = (await applied.js.stream_info(names.TASKS_STREAM, subjects_filter=">")).state.subjects
    assert 1 < len(subjects) <= names.TASK_PARTITIONS and sum(subjects.values()) == 300


async def test_a_forced_put_carries_its_run_s_de_duplication_id(applied, settings):
    async with Dispatcher(applied, settings, DEFAULTS, force=True) as dispatcher:
        await dispatcher.dispatch(["http://example.com/forced"])
    await settled(applied.js)
    msg = await applied.js.get_msg(names.TASKS_STREAM, 1)
    assert msg.headers[names.MSG_ID] == names.dispatch_msg_id(orjson.loads(msg.data)["task_id"], dispatcher.run_id)


async def test_jsonl_lines_with_their_own_options_are_their_own_tasks(applied, settings, tmp_path):
    path = tmp_path / "specs.jsonl.gz"
    lines = [{"url": "http://example.com/p"}, {"url": "http://example.com/p", "artifacts": ["html"]},
             {"url": "http://example.com/p", "labels": {"other": "label"}},  # labels are not identity
             {"url": "http://example.com/p", "steps": [{"action": "scroll"}]}, {"url": 42}, {"url": "ftp://x/"}]
    path.write_bytes(gzip.compress(b"\n".join(orjson.dumps(x) for x in lines) + b"\n{oops\n"))
    summary = await dispatch(applied, settings, path)
    assert (summary.read, summary.published, summary.duplicate_in_input) == (7, 3, 1)
    assert summary.invalid_by_reason == {"invalid_json": 1, "invalid_task": 1, "unsupported_scheme": 1}
    url = "http://example.com/p"
    await settled(applied.js)
    assert set(await tasks_by_id(applied.js)) == {
        task_key(url, DEFAULTS.steps, DEFAULTS.options),
        task_key(url, DEFAULTS.steps, DEFAULTS.options.model_copy(update={"artifacts": ("html",)})),
        task_key(url, (Scroll(),), DEFAULTS.options)}


async def test_the_recrawl_window_expires(applied, settings):
    short = settings.with_overrides(dispatch={"recrawl_after": "1s"})
    source = ["http://example.com/1", "http://example.com/2"]
    assert (await dispatch(applied, short, source)).published == 2
    assert (await dispatch(applied, short, source)).already_seen == 2
    for _ in range(100):  # the keys expire after their 1s TTL
        if (await applied.js.stream_info(names.SEEN_STREAM)).state.messages == 0:
            break
        await asyncio.sleep(0.1)
    again = await dispatch(applied, short, source)
    assert (again.published, again.already_seen) == (2, 0)
    await settled(applied.js)
    assert set((await tasks_by_id(applied.js)).values()) == {2}  # queued again, not swallowed


async def test_recrawl_after_must_fit_the_bucket_and_whole_seconds(applied, settings):
    with pytest.raises(ConfigurationError, match="RECRAWL_WINDOW"):
        await dispatch(applied, settings.with_overrides(dispatch={"recrawl_after": "31d"}), [])
    with pytest.raises(ConfigurationError, match="at least 1s"):
        await dispatch(applied, settings.with_overrides(dispatch={"recrawl_after": "500ms"}), [])


async def test_missing_streams_say_how_to_fix_it(bus, settings):
    with pytest.raises(StreamsMissing, match="streams apply"):
        await dispatch(bus, settings, ["http://example.com/"])


def watch_paths(dispatcher: Dispatcher) -> Counter:
    """Count the publishes settled after a retry and the keys read back to settle one, so that a
    test of those paths fails when they never ran."""
    seen: Counter = Counter()
    settled, resolve = dispatcher._settled, dispatcher._resolve

    def counting_settled(pub):
        seen["retried"] += pub.attempts > 1
        settled(pub)

    async def counting_resolve(pub):
        seen["read_back"] += 1
        await resolve(pub)

    dispatcher._settled, dispatcher._resolve = counting_settled, counting_resolve
    return seen


def _in_flight(dispatcher: Dispatcher) -> list:
    publisher = dispatcher._publisher
    return [*publisher._pending.values(), *publisher._resting.values()]


@pytest.mark.parametrize("force", [False, True], ids=["create", "force"])
async def test_retries_after_timeouts_publish_each_task_once(applied, settings, nats_server, force):
    # --force puts without the expected-sequence header: there the Nats-Msg-Id alone keeps a
    # retried put from landing (and being queued) twice.
    s = settings.with_overrides(nats={"request_timeout": "300ms"}, dispatch={"publish_retries": 6})
    source = [f"http://example.com/{i}" for i in range(300)]
    async with Dispatcher(applied, s, DEFAULTS, force=force) as dispatcher:
        paths = watch_paths(dispatcher)
        os.kill(nats_server.process.pid, signal.SIGSTOP)  # every PubAck is now late
        try:
            running = asyncio.create_task(dispatcher.dispatch(source))
            # frozen past request_timeout: the first attempts time out and are sent again
            await wait_until(lambda: asyncio.sleep(0, dispatcher._publisher is not None
                                                   and any(p.attempts > 1 for p in _in_flight(dispatcher))),
                             timeout=30, every=0.05)
        finally:
            os.kill(nats_server.process.pid, signal.SIGCONT)
        summary = await asyncio.wait_for(running, 60)
    assert (summary.published, summary.already_seen, summary.failed) == (300, 0, 0)
    assert paths["retried"] > 0  # the retry path ran (and each retry still queued its task once)
    assert (await applied.js.stream_info(names.SEEN_STREAM)).state.messages == 300
    assert set((await tasks_by_id(applied.js)).values()) == {1}
    assert await settled(applied.js) == 300


async def test_a_cut_connection_loses_no_task_and_queues_none_twice(applied, settings, nats_server, tmp_path):
    host, port = nats_server.url.rsplit("//", 1)[1].split(":")
    proxy = TcpProxy(host, int(port))
    proxy.up()
    s = make_settings(tmp_path, f"nats://{proxy.host}:{proxy.port}",
                      nats={"request_timeout": "500ms"}, dispatch={"publish_retries": 8, "window": 512})
    source = [f"http://example.com/cut/{i}" for i in range(20_000)]
    bus = await Bus.connect(s, name="cut")
    try:
        async with Dispatcher(bus, s, DEFAULTS) as dispatcher:
            # Counted from the start: a publish takes its settle callback when it is sent, so one
            # attached at the cut missed every retry of a publish already in flight (seen in CI).
            paths = watch_paths(dispatcher)
            running = asyncio.create_task(dispatcher.dispatch(source))
            for _ in range(3000):
                if dispatcher.counts.published >= 2000 or running.done():
                    break
                await asyncio.sleep(0.01)
            assert not running.done()  # the cut comes mid-run, with publishes in flight
            # PubAcks in flight are lost, some after the server stored the task: their retries hear
            # "wrong last sequence" and are settled by reading the key back.
            proxy.down()
            # down until publishes in flight have timed out and been sent again (request_timeout 500ms)
            await wait_until(lambda: asyncio.sleep(0, any(p.attempts > 1 for p in _in_flight(dispatcher))),
                             timeout=30, every=0.05)
            proxy.up()
            summary = await asyncio.wait_for(running, 120)
    finally:
        await bus.close()
        proxy.close()
    assert (summary.published, summary.already_seen, summary.failed, summary.unconfirmed) == (20_000, 0, 0, 0)
    # Publishes in flight at the cut were sent again. (Whether one of them had been stored before
    # its PubAck was lost, so that its retry is settled by reading the key back, depends on the
    # moment of the cut: that path is provoked on cue below.)
    assert paths["retried"] > 0
    assert await settled(applied.js) == 20_000
    assert set((await tasks_by_id(applied.js)).values()) == {1}


async def test_lost_pubacks_are_settled_by_reading_the_key_back(applied, settings, nats_server, tmp_path):
    """A relay drops the first 20 PubAcks from SEEN: the server stored those tasks, the
    dispatcher cannot know, retries, hears "wrong last sequence", and reads each key back."""
    dropped, seen_puback = [], f'"stream":"{names.SEEN_STREAM}"'.encode()

    def first_twenty(payload: bytes) -> bool:
        if seen_puback in payload and len(dropped) < 20:
            dropped.append(payload)
            return True
        return False

    async with Relay(nats_server.port) as relay:
        relay.withhold = first_twenty
        s = make_settings(tmp_path, relay.url, nats={"request_timeout": "500ms"}, dispatch={"publish_retries": 6})
        async with await Bus.connect(s, name="lossy") as bus, Dispatcher(bus, s, DEFAULTS) as dispatcher:
            paths = watch_paths(dispatcher)
            summary = await dispatcher.dispatch([f"http://example.com/lost/{i}" for i in range(100)])
    assert len(dropped) == 20 and paths["read_back"] == 20
    assert (summary.published, summary.already_seen, summary.failed, summary.unconfirmed) == (100, 0, 0, 0)
    assert await settled(applied.js) == 100 and set((await tasks_by_id(applied.js)).values()) == {1}


async def test_an_ambiguous_refusal_is_resolved_by_reading_the_key_back(applied, settings):
    # "wrong last sequence" on a retry: our lost first attempt, or someone else's key? The stored
    # value decides. (A lost PubAck cannot be provoked on cue, so the outcome is built by hand.)
    ours, theirs = b'{"by":"us"}', b'{"by":"them"}'
    await applied.js.publish(names.seen_key_subject("a" * 32), ours)
    await applied.js.publish(names.seen_key_subject("b" * 32), theirs)
    published: list[str] = []
    refusal = PublishFailed("wrong last sequence: 1", code=400, err_code=WRONG_LAST_SEQUENCE)
    async with Dispatcher(applied, settings, on_published=published.append) as dispatcher:
        for key in ("a" * 32, "b" * 32, "c" * 32):
            pub = Publication(names.seen_key_subject(key), ours, None, None, key, attempts=2, error=refusal)
            await dispatcher._resolve(pub)
    assert published == ["a" * 32]
    assert (dispatcher.counts.published, dispatcher.counts.already_seen) == (1, 2)


async def test_a_read_back_that_meets_an_outage_waits_it_out_within_publish_outage_wait(applied, settings,
                                                                                          nats_server):
    # The read-back that settles an ambiguous refusal met a frozen server (a lookup timeout, as
    # under heavy load or a leader election): before, it counted the task `unconfirmed` at once.
    ours = b'{"by":"us"}'
    await applied.js.publish(names.seen_key_subject("d" * 32), ours)
    published: list[str] = []
    refusal = PublishFailed("wrong last sequence: 1", code=400, err_code=WRONG_LAST_SEQUENCE)
    s = settings.with_overrides(nats={"request_timeout": "1s"}, dispatch={"publish_outage_wait": "60s"})
    async with await Bus.connect(s, name="resolve") as bus, \
            Dispatcher(bus, s, on_published=published.append) as dispatcher:
        pub = Publication(names.seen_key_subject("d" * 32), ours, None, None, "d" * 32, attempts=2, error=refusal,
                          first_sent=time.monotonic())
        os.kill(nats_server.process.pid, signal.SIGSTOP)
        try:
            resolving = asyncio.create_task(dispatcher._resolve(pub))
            await asyncio.sleep(4)  # lookups time out meanwhile (1 s each)
        finally:
            os.kill(nats_server.process.pid, signal.SIGCONT)
        await asyncio.wait_for(resolving, 30)
    assert published == ["d" * 32]
    assert (dispatcher.counts.published, dispatcher.counts.unconfirmed) == (1, 0)


def test_the_template_writes_what_the_models_write():
    template = TaskTemplate(DEFAULTS)
    url = "http://example.com/ü?q=\"quoted\""
    task_id = template.key(url)
    assert task_id == task_key(url, DEFAULTS.steps, DEFAULTS.options)
    payload = template.payload(task_id, url, "original")
    task = decode(ScrapeTask, payload)
    assert (task.steps, task.options, task.labels, task.original_url) == (
        DEFAULTS.steps, DEFAULTS.options, DEFAULTS.labels, "original")
    assert payload == encode(task)  # byte for byte, field order included


def test_fingerprints_remember_what_they_saw_through_growth():
    seen = FingerprintSet(capacity=4)
    keys = [int.from_bytes(os.urandom(8), "big") for _ in range(5000)] + [0]
    assert all(seen.add(k) for k in keys)
    assert not any(seen.add(k) for k in keys)
    assert len(seen) == 5001


# -- the command line, in real processes --------------------------------------------------------


def cli(settings, *args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return busscrape("dispatch", *args, env=env_for(settings), stdin=stdin, timeout=timeout, text=False)


async def test_killed_halfway_then_run_again_queues_every_url_exactly_once(applied, settings, tmp_path):
    count = 30_000
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"http://example.com/kill/{i}\n" for i in range(count)))
    proc = spawn(["dispatch", str(path), "--json"], env_for(settings), tmp_path / "first.log")
    try:
        while (await applied.js.stream_info(names.SEEN_STREAM)).state.messages < 3000:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()
            await asyncio.sleep(0.01)
    finally:
        kill9(proc)
    await asyncio.sleep(0.5)
    landed = await settled(applied.js)
    assert 0 < landed < count  # really killed halfway

    second = await asyncio.to_thread(cli, settings, str(path), "--json")
    assert second.returncode == 0, second.stderr.decode()
    summary = orjson.loads(second.stdout)
    assert (summary["read"], summary["already_seen"], summary["published"]) == (count, landed, count - landed)
    assert await settled(applied.js) == count
    by_id = await tasks_by_id(applied.js)
    defaults = TaskDefaults()
    assert by_id == {task_id_of(f"http://example.com/kill/{i}", defaults): 1 for i in range(count)}


async def test_cli_exit_codes_summary_and_rejects_file(applied, settings, tmp_path):
    path = tmp_path / "urls.txt"
    path.write_bytes(MIXED)
    rejects = tmp_path / "rejects.jsonl"
    strict = await asyncio.to_thread(cli, settings, str(path), "--json", "--strict", "--rejects", str(rejects),
                                     "--label", "job=cli", "--artifacts", "html,har")
    assert strict.returncode == 1
    summary = orjson.loads(strict.stdout)
    assert (summary["read"], summary["invalid"], summary["published"]) == (14, 8, 3)
    lines = [orjson.loads(x) for x in rejects.read_bytes().splitlines()]
    assert [x["line"] for x in lines] == [4, 5, 6, 7, 8, 9, 10, 11]
    assert {"line", "reason", "detail", "text"} <= set(lines[0])
    logged = [orjson.loads(x) for x in strict.stderr.splitlines() if x.startswith(b"{")]
    assert sum(x["event"] == "dispatch.rejected" for x in logged) == 8

    table = await asyncio.to_thread(cli, settings, str(path))
    assert table.returncode == 0
    assert b"already seen" in table.stdout and b"unsupported_scheme" in table.stdout

    bad_option = await asyncio.to_thread(cli, settings, str(path), "--viewport", "wide")
    assert bad_option.returncode == 2 and b"--viewport" in bad_option.stderr


async def test_cli_without_streams_or_server_exits_2_with_the_fix(bus, settings, tmp_path):
    path = tmp_path / "urls.txt"
    path.write_text("http://example.com/\n")
    missing = await asyncio.to_thread(cli, settings, str(path))
    assert missing.returncode == 2 and b"streams apply" in missing.stderr
    nowhere = make_settings(tmp_path, "nats://127.0.0.1:1", nats={"connect_timeout": 1})
    unreachable = await asyncio.to_thread(cli, nowhere, str(path))
    assert unreachable.returncode == 2 and b"cannot connect to NATS" in unreachable.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_cli_interrupted_prints_the_summary_and_exits_130(applied, settings, tmp_path, sig):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busscrape", "dispatch", "-", "--json", env=env_for(settings),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"http://example.com/1\nhttp://example.com/2\n")
        await proc.stdin.drain()  # stdin stays open: the dispatcher waits for more input
        for _ in range(300):
            if (await applied.js.stream_info(names.SEEN_STREAM)).state.messages == 2:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(sig)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    summary = orjson.loads(out)
    assert summary["interrupted"] is True and (summary["read"], summary["published"]) == (2, 2)


# -- fuzz: whatever the bytes, every line is accounted for ---------------------------------------

_LINE = st.one_of(
    st.binary(max_size=30),
    st.text(max_size=30).map(str.encode),
    st.sampled_from([b"http://example.com/a", b"HTTP://EXAMPLE.COM/a", b"# comment", b"", b"http://127.1/",
                     b"ftp://x", b'{"url": "http://example.com/j"}', b"\xff", b"http://[::1"]),
)


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=30), jsonl=st.booleans())
def test_fuzz_bad_input_never_crashes_and_every_line_is_classified(settings, tmp_path, lines, jsonl):
    body = b"\n".join(line.replace(b"\n", b"") for line in lines)
    path = tmp_path / ("in.jsonl" if jsonl else "in.txt")
    path.write_bytes(body)
    counted = len(content_lines(body))

    async def run():
        async with await Bus.connect(settings, name="fuzz") as bus:
            await wipe(bus)
            from busscrape.bus import provision, topology

            await provision.apply(bus.js, topology.load(settings))
            return await dispatch(bus, settings, path, defaults=TaskDefaults())

    summary = asyncio.run(run())
    assert summary.read == counted
    assert summary.read == (summary.invalid + summary.duplicate_in_input + summary.already_seen
                            + summary.published + summary.failed + summary.unconfirmed)
    assert set(summary.invalid_by_reason) <= set(inputs.REASONS) | set(urls.REASONS)
    assert summary.failed == summary.unconfirmed == summary.already_seen == 0


async def frozen(pid: int) -> None:
    """Until the kernel shows ``pid`` stopped (``T``). In one whole-suite run the dispatch that
    follows had every PubAck back within 3 ms, as if the server were not frozen; cause not found.
    A freeze that never takes now fails here, by name, instead of in the summary's counts."""
    stat = Path(f"/proc/{pid}/stat")
    await wait_until(lambda: asyncio.sleep(0, stat.read_text().rsplit(")", 1)[1].split()[0] == "T"),
                     timeout=10, every=0.01)


async def interrupted_while_frozen(applied, settings, nats_server, *, drain: str, stops: int):
    """Dispatch 50 URLs to a frozen server (no PubAck can come), then stop the dispatcher
    ``stops`` times once it has read them all; its summary."""
    s = settings.with_overrides(nats={"request_timeout": "60s"}, dispatch={"drain_timeout": drain})
    async with Dispatcher(applied, s, DEFAULTS) as dispatcher:
        os.kill(nats_server.process.pid, signal.SIGSTOP)
        try:
            await frozen(nats_server.process.pid)
            running = asyncio.create_task(dispatcher.dispatch([f"http://example.com/frozen/{i}" for i in range(50)]))
            await wait_until(lambda: asyncio.sleep(0, dispatcher.counts.read == 50), timeout=30, every=0.05)
            for _ in range(stops):
                dispatcher.stop()
            summary = await asyncio.wait_for(running, 30)  # the 60 s request_timeout is not waited for
        finally:
            os.kill(nats_server.process.pid, signal.SIGCONT)
    return summary


async def test_a_stop_waits_the_drain_timeout_then_counts_what_is_unconfirmed(applied, settings, nats_server):
    summary = await interrupted_while_frozen(applied, settings, nats_server, drain="1s", stops=1)
    assert summary.interrupted and (summary.read, summary.published, summary.unconfirmed) == (50, 0, 50)
    assert summary.exit_code() == 130


async def test_a_second_stop_cuts_the_drain_short(applied, settings, nats_server):
    summary = await interrupted_while_frozen(applied, settings, nats_server, drain="10m", stops=2)
    assert summary.interrupted and summary.unconfirmed == 50
