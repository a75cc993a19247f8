"""``busscrape streams apply`` against a real nats-server."""

import asyncio
import shutil
import subprocess
import sys

import pytest

from busscrape.bus import names, provision, topology
from busscrape.errors import StreamConflict, StreamsMissing
from tests.support.bus import enqueue, wait_until


async def test_apply_creates_everything_with_the_configured_values(bus, settings):
    s = settings.with_overrides(streams={"results_max_age": "5d", "worker_max_deliver": 4, "worker_max_deferrals": 0,
                                         "worker_ack_wait": "15s", "recrawl_window": "9d"})
    changes = await provision.apply(bus.js, topology.load(s))
    assert {c.action for c in changes} == {"create"}

    results = await bus.js.stream_info(names.RESULTS_STREAM)
    assert results.config.retention == "limits"
    assert results.config.max_age == pytest.approx(5 * 86400)
    assert results.config.discard == "new"
    tasks = await bus.js.stream_info(names.TASKS_STREAM)
    assert tasks.config.retention == "workqueue"
    assert tasks.config.storage == "file"
    assert tasks.config.duplicate_window == pytest.approx(600)
    assert tasks.config.sources[0].name == names.SEEN_STREAM
    workers = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    assert workers.config.max_deliver == 4
    assert workers.config.ack_wait == pytest.approx(15)
    assert not workers.config.backoff
    assert workers.config.max_ack_pending == s.streams.worker_max_ack_pending
    ingesters = await bus.js.consumer_info(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
    assert ingesters.config.max_deliver == -1
    seen = await bus.js.key_value(names.SEEN_BUCKET)
    assert (await seen.status()).ttl == pytest.approx(9 * 86400)
    artifacts = await bus.js.stream_info(names.ARTIFACTS_STREAM)
    assert artifacts.config.max_age == pytest.approx(s.streams.artifacts_ttl)
    advisories = await bus.js.stream_info(names.ADVISORIES_STREAM)
    assert advisories.config.subjects == [names.MAX_DELIVERIES_ADVISORY]


async def test_buckets_and_tasks_are_compressed_from_the_first_apply(bus, settings):
    # A bucket's create API has no compression: apply makes the bucket's stream again with it
    # (the file store takes compression when a stream is made), so a second apply finds nothing
    # to do; ``none`` changes the configuration in place.
    await provision.apply(bus.js, topology.load(settings))
    compressed = (names.SEEN_STREAM, names.TASKS_STREAM, names.STATUS_STREAM)
    assert [(await bus.js.stream_info(n)).config.compression for n in compressed] == ["s2"] * 3
    assert {c.action for c in await provision.plan(bus.js, topology.load(settings))} == {"unchanged"}
    plain = settings.with_overrides(streams={"compression": "none"})
    changes = await provision.apply(bus.js, topology.load(plain))
    assert {c.definition.stream for c in changes if c.action == "update"} == set(compressed)
    assert [(await bus.js.stream_info(n)).config.compression for n in compressed] == ["none"] * 3


async def test_a_first_apply_deletes_no_stream_so_a_record_written_while_it_runs_stays(bus, settings):
    """Each bucket's stream is made once, compressed from the start. It used to be made by the
    bucket API, then deleted and made again: an ingester waiting for STATUS could write its
    ``archived`` record in between and lose it (the result acked, the record gone, ``run``
    waiting for ever). JetStream announces every stream deletion; a first apply makes none."""
    deleted: list[str] = []

    async def note(msg) -> None:
        deleted.append(msg.subject)

    sub = await bus.nc.subscribe("$JS.EVENT.ADVISORY.STREAM.DELETED.>", cb=note)
    await provision.apply(bus.js, topology.load(settings))
    await bus.nc.flush()
    await asyncio.sleep(0.5)  # advisories are sent after the API's reply
    await sub.unsubscribe()
    assert deleted == []
    kv = await bus.js.key_value(names.STATUS_BUCKET)  # and the bucket behaves as nats-py's own
    assert await kv.create("k", b"1") == 1 and (await kv.get("k")).value == b"1"


async def test_apply_twice_changes_nothing(bus, settings):
    defs = topology.load(settings)
    await provision.apply(bus.js, defs)
    again = await provision.apply(bus.js, defs)
    assert [c.action for c in again] == ["unchanged"] * len(defs)


async def test_a_changed_max_age_is_updated_and_shown_as_a_diff(bus, settings):
    await provision.apply(bus.js, topology.load(settings))
    changed = settings.with_overrides(streams={"results_max_age": "2d", "worker_ack_wait": "20s"})
    dry = await provision.apply(bus.js, topology.load(changed), dry_run=True)
    assert (await bus.js.stream_info(names.RESULTS_STREAM)).config.max_age == pytest.approx(7 * 86400)
    updates = {c.definition.name: c for c in dry if c.action == "update"}
    assert set(updates) == {names.RESULTS_STREAM, names.WORKERS_CONSUMER}
    assert updates[names.RESULTS_STREAM].fields[0].describe() == "max_age: 7d -> 2d"

    await provision.apply(bus.js, topology.load(changed))
    assert (await bus.js.stream_info(names.RESULTS_STREAM)).config.max_age == pytest.approx(2 * 86400)
    workers = await bus.js.consumer_info(names.TASKS_STREAM, names.WORKERS_CONSUMER)
    assert workers.config.ack_wait == pytest.approx(20)


def conflicting_definitions(tmp_path, settings):
    folder = tmp_path / "defs"
    shutil.copytree(topology.definitions_dir(settings), folder)
    path = folder / "results.toml"
    path.write_text(path.read_text().replace('retention = "limits"', 'retention = "interest"'))
    return folder


async def test_a_retention_change_is_refused_and_nothing_changes(bus, settings, tmp_path):
    await provision.apply(bus.js, topology.load(settings))
    folder = conflicting_definitions(tmp_path, settings)
    with pytest.raises(StreamConflict) as info:
        await provision.apply(bus.js, topology.load(settings, folder))
    message = str(info.value)
    assert "stream RESULTS" in message and "retention" in message and "limits -> interest" in message
    assert "--recreate RESULTS" in message
    assert (await bus.js.stream_info(names.RESULTS_STREAM)).config.retention == "limits"


async def test_recreate_makes_the_refused_change(bus, settings, tmp_path):
    await provision.apply(bus.js, topology.load(settings))
    folder = conflicting_definitions(tmp_path, settings)
    await provision.apply(bus.js, topology.load(settings, folder), recreate=frozenset({"RESULTS"}))
    assert (await bus.js.stream_info(names.RESULTS_STREAM)).config.retention == "interest"


async def test_cli_exits_non_zero_with_the_message_on_a_conflict(bus, settings, tmp_path):
    await provision.apply(bus.js, topology.load(settings))
    folder = conflicting_definitions(tmp_path, settings)
    env = {"PATH": "/usr/bin:/bin", "BUSSCRAPE_NATS__URL": settings.nats.url,
           "BUSSCRAPE_STREAMS__DEFINITIONS_DIR": str(folder)}
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "busscrape", "streams", "apply"],
                                   capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "retention" in proc.stderr and "RESULTS" in proc.stderr


async def test_cli_apply_and_show(bus, settings):
    env = {"PATH": "/usr/bin:/bin", "BUSSCRAPE_NATS__URL": settings.nats.url, "COLUMNS": "200"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "busscrape", "streams", *args],  # noqa: E731
                                       capture_output=True, text=True, env=env, timeout=60)
    total = len(topology.load(settings))
    first = await asyncio.to_thread(run, "apply")
    assert first.returncode == 0, first.stderr
    assert "create" in first.stdout and f"{total} of {total} changed" in first.stdout
    second = await asyncio.to_thread(run, "apply")
    assert f"0 of {total} changed" in second.stdout
    show = await asyncio.to_thread(run, "show", "--json")
    assert show.returncode == 0
    import orjson

    doc = orjson.loads(show.stdout)
    assert {d["name"] for d in doc if d["exists"]} >= {"TASKS", "RESULTS", "DEADLETTER", "SEEN", "workers"}


async def test_require_names_what_is_missing_and_how_to_fix_it(bus, settings):
    defs = topology.load(settings)
    with pytest.raises(StreamsMissing) as info:
        await provision.require(bus.js, defs, {("stream", "TASKS"), ("consumer", "workers")})
    assert "stream TASKS" in str(info.value) and "consumer TASKS/workers" in str(info.value)
    assert "busscrape streams apply" in str(info.value)
    await provision.apply(bus.js, defs)
    await provision.require(bus.js, defs, names.REQUIRED)


async def test_a_new_key_in_seen_is_queued_in_tasks_once_and_outlives_its_ttl(applied):
    js = applied.js
    headers = {names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0", names.MSG_TTL: "1"}
    await js.publish(names.seen_key_subject("k1"), b"task-1", headers=dict(headers))
    with pytest.raises(Exception, match="wrong last sequence"):
        await js.publish(names.seen_key_subject("k1"), b"task-1", headers=dict(headers))
    await wait_until(lambda: _messages(js, names.TASKS_STREAM, 1), timeout=30)
    msg = await js.get_last_msg(names.TASKS_STREAM, names.task_subject("k1"))
    assert msg.data == b"task-1"
    await wait_until(lambda: _messages(js, names.SEEN_STREAM, 0), timeout=30)  # the SEEN key expires ...
    assert (await js.stream_info(names.TASKS_STREAM)).state.messages == 1  # ... the queued task must not


async def _messages(js, stream: str, n: int) -> bool:
    return (await js.stream_info(stream)).state.messages == n


async def test_tasks_moved_to_partitions_queue_nothing_seen_holds_a_second_time(bus, settings, tmp_path):
    # nats-server keys a source by its transforms: the old per-task one changed to partitions
    # (issue #19) is a new source, which (with tasks still queued, so nothing in TASKS to take a
    # start time from) would start at SEEN's first message and queue every task again.
    folder = tmp_path / "defs"
    shutil.copytree(topology.definitions_dir(settings), folder)
    path = folder / "tasks.toml"
    src, dest = names.SEEN_TO_TASKS
    old = path.read_text().replace(f'src = "{src}", dest = "{dest}"', 'src = "$KV.SEEN.>", dest = "busscrape.tasks.>"')
    assert old != path.read_text()
    path.write_text(old)
    await provision.apply(bus.js, topology.load(settings, folder))
    queued = [await enqueue(bus.js, f"http://example.com/queued/{i}") for i in range(3)]
    await wait_until(lambda: _messages(bus.js, names.TASKS_STREAM, 3), timeout=30)
    assert (await bus.js.get_msg(names.TASKS_STREAM, 1)).subject == f"busscrape.tasks.{queued[0].task_id}"

    changes = await provision.apply(bus.js, topology.load(settings))
    assert [c.action for c in changes if c.definition.name == names.TASKS_STREAM] == ["update"]
    new = await enqueue(bus.js, "http://example.com/new")
    # Sourcing keeps SEEN's order: a restart from SEEN's start would bring the three again first.
    await wait_until(lambda: _at_least(bus.js, names.TASKS_STREAM, 4), timeout=30)
    info = await bus.js.stream_info(names.TASKS_STREAM, subjects_filter=">")
    assert info.state.subjects == {**{f"busscrape.tasks.{t.task_id}": 1 for t in queued},
                                   names.task_subject(new.task_id): 1}
    assert {c.action for c in await provision.plan(bus.js, topology.load(settings))} == {"unchanged"}


async def test_a_task_written_to_seen_while_its_source_changes_form_is_queued_once(bus, settings, tmp_path):
    """The window of the resuming-source change: the old form is checked quiet, then a dispatcher
    writes to SEEN before the update takes effect; the old form sources it, and the new form,
    starting after the check, sources it again. Its second copy is dropped."""
    folder = tmp_path / "defs"
    shutil.copytree(topology.definitions_dir(settings), folder)
    path = folder / "tasks.toml"
    src, dest = names.SEEN_TO_TASKS
    path.write_text(path.read_text().replace(f'src = "{src}", dest = "{dest}"',
                                             'src = "$KV.SEEN.>", dest = "busscrape.tasks.>"'))
    await provision.apply(bus.js, topology.load(settings, folder))
    for i in range(2):
        await enqueue(bus.js, f"http://example.com/queued/{i}")
    await wait_until(lambda: _messages(bus.js, names.TASKS_STREAM, 2), timeout=30)

    js, update, late = bus.js, bus.js.update_stream, []

    async def a_write_in_the_window(config, **kwargs):
        if config.name == names.TASKS_STREAM and not late:
            late.append(await enqueue(js, "http://example.com/in-the-window"))
            await wait_until(lambda: _messages(js, names.TASKS_STREAM, 3), timeout=30)  # the old form took it
        return await update(config, **kwargs)

    js.update_stream = a_write_in_the_window
    try:
        await provision.apply(js, topology.load(settings))
    finally:
        js.update_stream = update
    after = await enqueue(js, "http://example.com/after")
    await wait_until(lambda: _at_least(js, names.TASKS_STREAM, 4), timeout=30)
    await asyncio.sleep(1.0)  # a second copy would be sourced by now
    info = await js.stream_info(names.TASKS_STREAM)
    tasks = [await js.get_msg(names.TASKS_STREAM, seq) for seq in range(info.state.first_seq,
                                                                       info.state.last_seq + 1)
             if await _exists(js, seq)]
    ids = sorted(m.headers[names.STREAM_SOURCE].split(" ")[1] for m in tasks)
    assert len(ids) == len(set(ids)) == 4, ids  # two queued before, the one in the window, one after
    assert after.task_id and late


async def _exists(js, seq: int) -> bool:
    try:
        await js.get_msg(names.TASKS_STREAM, seq)
    except Exception:
        return False
    return True


async def _at_least(js, stream: str, n: int) -> bool:
    return (await js.stream_info(stream)).state.messages >= n


async def test_require_with_wait_waits_for_streams_applied_meanwhile(bus, settings):
    definitions = topology.load(settings)
    with pytest.raises(StreamsMissing):  # a wait that runs out still says what is missing
        await provision.require(bus.js, definitions, names.WORKER_NEEDS, wait=0.2)

    applying = asyncio.Event()

    async def apply_later() -> None:
        await asyncio.sleep(0.3)
        applying.set()
        await provision.apply(bus.js, definitions)

    later = asyncio.create_task(apply_later())
    await provision.require(bus.js, definitions, names.WORKER_NEEDS, wait=60)
    assert applying.is_set()  # it returned only once they were there
    await later
