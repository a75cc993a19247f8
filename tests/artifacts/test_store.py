import asyncio
import hashlib
import os
import signal

import orjson
import pytest

from busscrape.artifacts import store as artifact_store
from busscrape.artifacts.leftovers import StrayChunks
from busscrape.artifacts.store import ArtifactStore, _chunk_subject, _meta_subject, _placeholder, object_name
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.names import ARTIFACTS_BUCKET, ARTIFACTS_STREAM
from busscrape.errors import ArtifactUnusable, StorageUnavailable
from tests.support.bus import lagging_replica
from tests.support.relay import Relay


async def test_put_stream_and_delete_a_large_object(applied):
    store = ArtifactStore(applied.js)
    data = os.urandom(3 * 1024 * 1024 + 17)
    ref = await store.put(object_name("a" * 32, 5, 1, "page.html"), data, "text/html", kind="html", file="page.html")
    assert ref.size == len(data) and ref.sha256 == hashlib.sha256(data).hexdigest()
    chunks = [c async for c in store.stream(ref)]
    assert len(chunks) > 1 and b"".join(chunks) == data
    # nats-py's own object store reads what we wrote (same layout as `nats object get`)
    native = await applied.js.object_store(ARTIFACTS_BUCKET)
    assert (await native.get(ref.object)).data == data
    await store.delete(ref.object)
    assert not await store.exists(ref)
    with pytest.raises(ArtifactUnusable) as info:
        await store.read(ref)
    assert info.value.reason == "artifact_missing"
    await store.delete(ref.object)  # idempotent


async def test_empty_object(applied):
    store = ArtifactStore(applied.js)
    ref = await store.put("e/1/1/empty.txt", b"", "text/plain", kind="text", file="page.txt")
    assert await store.read(ref) == b""


async def test_a_checksum_mismatch_is_unusable(applied):
    store = ArtifactStore(applied.js)
    ref = await store.put("c/1/1/x.html", b"hello", "text/html", kind="html", file="page.html")
    forged = ref.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(ArtifactUnusable) as info:
        await store.read(forged)
    assert info.value.reason == "artifact_checksum_mismatch"


async def test_a_put_that_nats_refuses_leaves_nothing_behind(applied):
    """The metas go out around the chunks without waiting for them: when a chunk is refused,
    the placeholder and meta that may already have landed are purged with the chunks."""
    config = (await applied.js.stream_info(names.ARTIFACTS_STREAM)).config
    config.max_msg_size = 64 * 1024  # chunks (256 KiB) are refused, the meta (~300 bytes) is not
    await applied.js.update_stream(config)
    with pytest.raises(StorageUnavailable):
        await ArtifactStore(applied.js).put("r/1/1/x.png", os.urandom(300_000), "image/png", kind="screenshot",
                                            file="screenshot.png")
    assert (await applied.js.stream_info(names.ARTIFACTS_STREAM)).state.messages == 0


async def test_a_put_cut_short_is_found_by_its_name_and_discarded(applied):
    """What a writer killed mid-put leaves: its placeholder meta and some chunks, no meta."""
    js, store = applied.js, ArtifactStore(applied.js)
    name = object_name("b" * 32, 3, 1, "screenshot.png")
    await js.publish(_meta_subject(name), orjson.dumps(_placeholder(name, "CUTSHORT1")), stream=ARTIFACTS_STREAM)
    await js.publish(_chunk_subject("CUTSHORT1"), os.urandom(1000), stream=ARTIFACTS_STREAM)
    assert await store._info(name) is None  # no reader takes the placeholder for an object
    assert await store.delete(name) is True
    assert (await js.stream_info(ARTIFACTS_STREAM)).state.messages == 0
    assert await store.delete(name) is False  # idempotent

    # and a finished object, likewise
    ref = await store.put(name, b"<png>", "image/png", kind="screenshot", file="screenshot.png")
    assert await store.exists(ref) and await store.delete(name) is True
    assert (await js.stream_info(ARTIFACTS_STREAM)).state.messages == 0


async def test_chunks_no_meta_names_are_purged_when_seen_twice_and_nothing_else(applied):
    """``StrayChunks``: chunks whose meta is gone go on the second pass that finds them nameless;
    a finished object, a put cut short (its placeholder names its chunks) and a put that began
    between a pass's two readings are left alone."""
    js, store = applied.js, ArtifactStore(applied.js)
    strays = StrayChunks(store)
    kept = await store.put(object_name("k" * 32, 1, 1, "page.html"), os.urandom(600_000), "text/html",
                           kind="html", file="page.html")
    cut = object_name("c" * 32, 1, 1, "screenshot.png")
    await js.publish(_meta_subject(cut), orjson.dumps(_placeholder(cut, "CUTSHORT2")), stream=ARTIFACTS_STREAM)
    await js.publish(_chunk_subject("CUTSHORT2"), b"x" * 1000, stream=ARTIFACTS_STREAM)
    for _ in range(2):  # an object released meta first, its chunk purge lost
        await js.publish(_chunk_subject("NAMELESS"), b"y" * 1000, stream=ARTIFACTS_STREAM)

    assert await store.nameless_chunks() == {"NAMELESS"}
    assert await strays.sweep() == 0  # first sighting: a suspect only
    assert strays.suspects == {"NAMELESS"}
    # A put whose chunks the next pass lists but whose placeholder it missed (it landed after
    # the reading of the metas; simulated here by publishing it after the pass).
    late = object_name("l" * 32, 1, 1, "page.har")
    await js.publish(_chunk_subject("LATEPUT"), b"z" * 1000, stream=ARTIFACTS_STREAM)
    assert await strays.sweep() == 1
    assert strays.suspects == {"LATEPUT"}
    await js.publish(_meta_subject(late), orjson.dumps(_placeholder(late, "LATEPUT")), stream=ARTIFACTS_STREAM)
    assert await strays.sweep() == 0 and strays.suspects == set()

    chunk_subjects = (await js.stream_info(ARTIFACTS_STREAM, subjects_filter=_chunk_subject(">"))).state.subjects
    assert set(chunk_subjects) == {_chunk_subject(kept.nuid), _chunk_subject("CUTSHORT2"), _chunk_subject("LATEPUT")}
    assert len(await store.read(kept)) == 600_000
    assert await store.delete(cut) is True and await store.delete(late) is True


async def test_an_empty_bucket_has_no_stray_chunks(applied):
    assert await StrayChunks(ArtifactStore(applied.js)).sweep() == 0


async def test_metas_are_read_page_by_page_when_looking_for_stray_chunks(applied, monkeypatch):
    monkeypatch.setattr(artifact_store, "_META_BATCH", 2)  # five names span three pages
    store = ArtifactStore(applied.js)
    refs = [await store.put(object_name("p" * 32, 1, 1, f"f{i}"), b"data %d" % i, "text/plain", kind="text",
                            file="page.txt") for i in range(5)]
    await applied.js.publish(_chunk_subject("NAMELESS2"), b"left", stream=ARTIFACTS_STREAM)
    assert await store.nameless_chunks() == {"NAMELESS2"}
    assert {ref.nuid for ref in refs} <= await store._named_nuids()


async def test_the_stray_sweep_outlives_a_server_that_stops_answering(applied, nats_server, monkeypatch):
    """A pass that times out (nats-server frozen with SIGSTOP) is logged and the next one runs."""
    monkeypatch.setattr(artifact_store, "_READ_TIMEOUT", 0.5)
    store = ArtifactStore(applied.js, timeout=0.1)  # passes at least 0.4 s apart
    await applied.js.publish(_chunk_subject("NAMELESS3"), b"left", stream=ARTIFACTS_STREAM)
    strays, stopping = StrayChunks(store), asyncio.Event()
    os.kill(nats_server.process.pid, signal.SIGSTOP)
    try:
        runner = asyncio.create_task(strays.run(stopping, 0.1))
        await asyncio.sleep(1.5)  # the first pass waits 0.5 s for metas that do not come
    finally:
        os.kill(nats_server.process.pid, signal.SIGCONT)
    for _ in range(50):
        if strays.purged or runner.done():
            break
        await asyncio.sleep(0.2)
    assert not runner.done(), runner.exception()
    assert strays.purged == 1
    stopping.set()
    await runner


async def test_a_replica_behind_the_leader_cannot_make_an_artifact_missing(applied):
    """Only the stream's leader may say a chunk is not there: any replica answers direct gets."""
    store = ArtifactStore(applied.js)
    data = bytes(range(256)) * 4096  # four chunks
    ref = await store.put(object_name("r" * 32, 1, 1, "page.html"), data, "text/html", kind="html", file="page.html")
    gone = await store.put(object_name("g" * 32, 1, 1, "page.html"), b"gone", "text/html", kind="html",
                           file="page.html")
    await store.release(gone)
    await lagging_replica(applied.js, ARTIFACTS_STREAM, keeps=_meta_subject(">"))
    assert await store.read(ref) == data
    assert store.leader_reads > 0  # the direct gets came back empty; the leader had the chunks
    with pytest.raises(ArtifactUnusable) as caught:  # really gone: the leader says so too
        await store.read(gone)
    assert caught.value.reason == "artifact_missing"
    await store.close()


async def test_a_replica_behind_the_leader_cannot_make_live_chunks_look_like_strays(applied):
    store = ArtifactStore(applied.js)
    refs = [await store.put(object_name("l" * 32, 1, 1, f"f{i}"), b"live %d" % i, "text/plain", kind="text",
                            file=f"f{i}") for i in range(3)]
    await applied.js.publish(_chunk_subject("STRAY1"), b"nobody's", stream=ARTIFACTS_STREAM)
    await lagging_replica(applied.js, ARTIFACTS_STREAM, keeps=_chunk_subject(">"))  # a replica that has no metas yet
    sweep = StrayChunks(store)
    assert await sweep.sweep() == 0 and await sweep.sweep() == 1  # the stray, on its second sighting
    assert all([await store.exists(ref) for ref in refs])
    assert [await store.read(ref) for ref in refs] == [b"live 0", b"live 1", b"live 2"]
    await store.close()


def _nth(n: int, picks):
    """A one-shot predicate: true for the ``n``-th frame ``picks`` matches, never again."""
    seen = 0

    def pick(*frame: bytes) -> bool:
        nonlocal seen
        if picks(*frame):
            seen += 1
            return seen == n
        return False
    return pick


def _artifacts_puback(payload: bytes) -> bool:
    return payload.startswith(b"{") and f'"stream":"{ARTIFACTS_STREAM}"'.encode() in payload


async def _stored_through(relay: Relay, settings, data: bytes, name: str):
    """``data`` put through ``relay`` by a store whose PubAcks time out fast (re-sends within 0.3 s);
    the claim check, and how often the put had to be written anew."""
    async with await Bus.connect(settings.with_overrides(nats={"url": relay.url}), name="store-via-relay") as bus:
        store = ArtifactStore(bus.js, timeout=0.3)
        try:
            return await store.put(name, data, "text/plain", kind="text", file="page.txt"), store.reordered
        finally:
            await store.close()


async def test_a_chunk_resent_after_its_puback_was_lost_is_stored_once(applied, nats_server, settings):
    """The PubAck of a chunk lost (a node killed between storing it and answering): the re-send
    must not store it a second time, or the object reads twice its size (seen in the cluster
    fault test as ``artifact_checksum_mismatch``, 5214 bytes for 2607)."""
    data = os.urandom(2607)
    async with Relay(nats_server.port) as relay:
        relay.withhold = _nth(2, _artifacts_puback)  # the placeholder's comes first, then the chunk's
        ref, reordered = await _stored_through(relay, settings, data, object_name("d" * 32, 1, 1, "page.txt"))
        assert relay.withheld == 1
    assert reordered == 0  # the duplicate's PubAck names the first copy's place: nothing to write again
    chunks = (await applied.js.stream_info(ARTIFACTS_STREAM, subjects_filter=_chunk_subject(">"))).state
    assert chunks.subjects == {_chunk_subject(ref.nuid): 1}
    store = ArtifactStore(applied.js)
    assert await store.read(ref) == data
    native = await applied.js.object_store(ARTIFACTS_BUCKET)
    assert (await native.get(ref.object)).data == data
    await store.close()


@pytest.mark.parametrize("lost", ["placeholder", "first chunk"])
async def test_a_message_lost_on_the_way_and_resent_late_cannot_scramble_the_object(applied, nats_server, settings,
                                                                                   lost):
    """Chunks are pipelined: when one is lost on the way, the ones behind it land first and its
    re-send lands after them. The object must still read as written (and its placeholder must
    not land after its meta, which would make the finished object look deleted)."""
    data = os.urandom(artifact_store.CHUNK_SIZE + 5000)  # two chunks
    name = object_name("o" * 32, 1, 1, "page.txt")
    subject = (_meta_subject(name) if lost == "placeholder" else _chunk_subject("")).encode()
    async with Relay(nats_server.port) as relay:
        relay.drop = _nth(1, lambda subj, payload: subj.startswith(subject))
        ref, reordered = await _stored_through(relay, settings, data, name)
        assert relay.dropped == 1
    assert reordered == 1
    store = ArtifactStore(applied.js)
    assert await store.exists(ref)
    assert await store.read(ref) == data
    native = await applied.js.object_store(ARTIFACTS_BUCKET)
    assert (await native.get(ref.object)).data == data
    await store.close()


async def test_the_bucket_remembers_message_ids_longer_than_a_put_resends(applied):
    """Re-sends are made harmless by ``Nats-Msg-Id``: only within the stream's duplicate window."""
    config = (await applied.js.stream_info(ARTIFACTS_STREAM)).config
    assert config.duplicate_window >= ArtifactStore(applied.js).resend_span
