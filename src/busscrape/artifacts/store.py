"""The ARTIFACTS object store: page bytes between worker and ingester (the claim check).

Objects use NATS's own object-store layout (``$O.ARTIFACTS.C.<nuid>`` chunks, a rolled-up
``$O.ARTIFACTS.M.<name>`` meta message), so ``nats object get ARTIFACTS …`` reads them too.
This module writes it directly rather than through nats-py's ``ObjectStore`` because that one
publishes chunk after chunk, each waiting for its ack, and reads whole objects into memory:
here chunks are pipelined and reads are streamed, chunk by chunk, with the digest checked
at the end. Chunks go through ``publisher.Publisher`` rather than ``js.publish_async``, whose
future never settles when the server refuses a message (nats-py raises inside its reply
handler instead), which would hang the upload.

Pipelining and re-sends must not change what a reader sees: every message of a put carries a
``Nats-Msg-Id`` (a re-send after a lost PubAck is not stored twice), and a put whose PubAcks show
its messages stored out of the order sent (one lost on the way, re-sent behind later ones) is
purged and written again under a new NUID.

Object names are ``<task_id>/<task_seq>/<attempt>/<file>``: a retry never overwrites the bytes
another attempt's result may point to. Before its chunks, a put rolls a placeholder meta (marked
deleted, so no reader takes it for the object) onto the name: whatever a killed writer leaves is
then found by name alone, which is how ``leftovers`` clears the objects of attempts that died.
Deletions purge the chunks before the meta for the same reason; the few chunks that still end up
with no meta naming them (``nameless_chunks``) are swept by ``leftovers.StrayChunks``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
from collections.abc import AsyncGenerator, Iterator
from datetime import UTC, datetime
from typing import IO, Any

import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext, api

from busscrape.bus import names
from busscrape.bus.compat import connection_of, next_nuid
from busscrape.bus.names import ARTIFACTS_BUCKET, ARTIFACTS_STREAM
from busscrape.bus.publisher import Publication, Publisher, PublishFailed, resend_span
from busscrape.bus.retry import TRANSIENT, transient_or
from busscrape.bus.scan import scan, scan_config
from busscrape.errors import ArtifactUnusable, StorageUnavailable
from busscrape.model.messages import ArtifactRef

log = structlog.get_logger("busscrape.artifacts")

CHUNK_SIZE = 256 * 1024
_WINDOW = 64  # chunks in flight when writing (all objects of this store together)
_READ_BATCH = 8  # chunks per batched direct get when reading (2 MiB)
_PUT_RETRIES = 2  # re-sends of a chunk or meta whose PubAck did not come in time
_LAYOUT_TRIES = 3  # puts of one object whose messages landed out of order, before the task is retried
_META_BATCH = 1000  # metas per batched direct get when looking for stray chunks
_READ_TIMEOUT = 30.0
_ALL_METAS = names.object_metas(ARTIFACTS_BUCKET)


def object_name(task_id: str, task_seq: int, attempt: int, file: str) -> str:
    return f"{task_id}/{task_seq}/{attempt}/{file}"


def _meta_subject(name: str) -> str:
    return names.object_meta_subject(ARTIFACTS_BUCKET, name)


def _chunk_subject(nuid: str) -> str:
    return names.object_chunk_subject(ARTIFACTS_BUCKET, nuid)


class ArtifactStore:
    """Put, stream and delete artifacts in the ARTIFACTS bucket."""

    def __init__(self, js: JetStreamContext, *, timeout: float = 10.0) -> None:
        self._js = js
        self._nc = connection_of(js)  # for NUIDs and direct gets
        self.timeout = timeout
        self._publisher: Publisher | None = None
        self._opening = asyncio.Lock()
        self.leader_reads = 0
        """Chunks a direct get did not return and the stream's leader did (a lagging replica)."""
        self.reordered = 0
        """Puts written again because their messages had landed out of the order they were sent."""

    async def close(self) -> None:
        """Stop the publisher behind ``put`` (if one was started)."""
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None

    async def _writer(self) -> Publisher:
        async with self._opening:
            if self._publisher is None:
                publisher = Publisher(self._nc, window=_WINDOW, timeout=self.timeout, retries=_PUT_RETRIES)
                await publisher.__aenter__()
                self._publisher = publisher
        return self._publisher

    async def put(self, name: str, data: bytes | IO[bytes], content_type: str, *, kind: str,
                  file: str) -> ArtifactRef:
        """Store ``data`` (bytes, or a seekable file read chunk by chunk from where it stands)
        under ``name`` and return its claim check.

        Raises ``StorageUnavailable`` when NATS does not take it (the task is retried).
        """
        start = None if isinstance(data, bytes) else data.tell()
        for _ in range(_LAYOUT_TRIES):
            if start is not None:
                data.seek(start)  # type: ignore[union-attr]
            ref = await self._put_once(name, data, content_type, kind=kind, file=file)
            if ref is not None:
                return ref
        raise StorageUnavailable(f"cannot store artifact {name} in {ARTIFACTS_BUCKET}: its messages landed "
                                 f"out of order {_LAYOUT_TRIES} times", what=ARTIFACTS_BUCKET)

    async def _put_once(self, name: str, data: bytes | IO[bytes], content_type: str, *, kind: str,
                        file: str) -> ArtifactRef | None:
        """One try of ``put`` under a NUID of its own; None when its messages did not land in the
        order they were sent (purged again: ``put`` writes the object anew)."""
        nuid = next_nuid(self._nc)
        chunk_subject = _chunk_subject(nuid)
        acks: list[asyncio.Future[Publication]] = []
        try:
            writer = await self._writer()
            # Same connection, so the server has it before any chunk: chunks are never nameless.
            acks.append(await writer.send(_meta_subject(name), orjson.dumps(_placeholder(name, nuid)),
                                          _headers(nuid, "p", rollup=True)))
            chunks = 0
            size = 0
            hashing = hashlib.sha256()
            for chunk in _chunks(data):
                acks.append(await writer.send(chunk_subject, chunk, _headers(nuid, chunks)))
                chunks += 1
                size += len(chunk)
                if not isinstance(data, bytes):
                    hashing.update(chunk)
            if isinstance(data, bytes):
                # Hashed while the chunks travel: let the flusher hand them to the socket first.
                await asyncio.sleep(0)
                hashing.update(data)
            digest = hashing.digest()
            info = {
                "name": name,
                "bucket": ARTIFACTS_BUCKET,
                "nuid": nuid,
                "size": size,
                "chunks": chunks,
                "mtime": datetime.now(UTC).isoformat(),
                "digest": "SHA-256=" + base64.urlsafe_b64encode(digest).decode(),
                "headers": {"Content-Type": [content_type]},
                "options": {"max_chunk_size": CHUNK_SIZE},
            }
            # The meta goes out right behind the chunks, not after their PubAcks: one round trip per
            # artifact instead of two. Nothing points at the object before every PubAck is in (the
            # result is published after), and a failure purges chunks and meta alike.
            acks.append(await writer.send(_meta_subject(name), orjson.dumps(info), _headers(nuid, "m", rollup=True)))
            settled = await asyncio.gather(*acks)
            for pub in settled:
                if pub.error is not None:
                    raise pub.error
        except transient_or(PublishFailed) as exc:
            await self._discard(name, chunk_subject)
            raise StorageUnavailable(f"cannot store artifact {name} in {ARTIFACTS_BUCKET}: {exc}",
                                     what=ARTIFACTS_BUCKET) from None
        # Readers take chunks in stream order, and a finished meta must be the last one rolled onto
        # the name. Pipelined messages can land out of send order: one lost on the way (a reconnect,
        # a stream leader going down) is re-sent after the ones behind it have landed. A re-send
        # of one that did land is no second copy (its Nats-Msg-Id), and its PubAck names the
        # first copy's sequence; so the sequences say exactly whether the layout is the one sent.
        seqs = [pub.ack.seq for pub in settled if pub.ack is not None]
        if any(later <= earlier for earlier, later in itertools.pairwise(seqs)):
            self.reordered += 1
            log.warning("artifact.out_of_order", object=name, seqs=seqs[:8])
            await self._discard(name, chunk_subject)
            return None
        return ArtifactRef(name=file, kind=kind, object=name, size=size, sha256=digest.hex(),  # type: ignore[arg-type]
                           content_type=content_type, nuid=nuid)

    async def _discard(self, name: str, chunk_subject: str) -> None:
        """What a put that did not finish may have stored: the meta only once its chunks are gone
        (while it stays, it names them: see ``delete``)."""
        if await self._purge_quietly(chunk_subject):
            await self._purge_quietly(_meta_subject(name))

    async def _info(self, name: str) -> dict[str, Any] | None:
        try:
            msg = await self._js.get_last_msg(ARTIFACTS_STREAM, _meta_subject(name))
        except nats.js.errors.NotFoundError:
            return None
        info = orjson.loads(msg.data or b"")  # nats-py gives an empty body as None
        return None if info.get("deleted") else info

    async def exists(self, ref: ArtifactRef) -> bool:
        return await self._info(ref.object) is not None

    async def stream(self, ref: ArtifactRef) -> AsyncGenerator[bytes, None]:
        """Yield the object's bytes chunk by chunk; the sha256 and size are checked at the end.

        Chunks come by batched direct gets (a few requests per object, no consumer to create):
        up to ``_READ_BATCH`` chunks in flight, so memory stays bounded whatever the size. Where
        a batch comes back short, the stream's leader is asked for the next chunk before the
        object counts as gone: any replica may answer a direct get, also one still catching up.
        Raises ``ArtifactUnusable`` when the object is gone or does not match its claim check
        (dead-letter), ``StorageUnavailable`` when NATS does not answer (retry).
        """
        nuid = ref.nuid
        if nuid is None:
            try:
                info = await self._info(ref.object)
            except TRANSIENT as exc:
                raise StorageUnavailable(f"cannot read artifact {ref.object}: {exc!r}") from None
            nuid = info["nuid"] if info else None
        if nuid is None:
            raise _missing(ref)
        digest = hashlib.sha256()
        size = 0
        seq = 1
        while size < ref.size:
            before = size
            batch_of = self._batch(_chunk_subject(nuid), seq, _READ_BATCH, f"artifact {ref.object}")
            async with contextlib.aclosing(batch_of) as batch:
                async for next_seq, data in batch:
                    seq = next_seq + 1
                    digest.update(data)
                    size += len(data)
                    yield data
            if size == before:
                # A direct get may be answered by a replica that has not caught up (a cluster node
                # back from a restart): only the stream's leader may say the chunk is not there.
                try:
                    chunk = await self._js.get_msg(ARTIFACTS_STREAM, seq, subject=_chunk_subject(nuid), next=True)
                except nats.js.errors.NotFoundError:
                    raise _missing(ref) if size == 0 else ArtifactUnusable(
                        f"artifact {ref.object} ends after {size} of {ref.size} bytes",
                        reason="artifact_truncated") from None
                except TRANSIENT as exc:
                    raise StorageUnavailable(f"cannot read artifact {ref.object}: {exc!r}") from None
                seq = (chunk.seq or seq) + 1
                data = chunk.data or b""
                digest.update(data)
                size += len(data)
                self.leader_reads += 1
                yield data
        if size != ref.size or digest.hexdigest() != ref.sha256:
            raise ArtifactUnusable(
                f"artifact {ref.object} fails its checksum: {size} bytes sha256 {digest.hexdigest()[:16]}…, "
                f"expected {ref.size} bytes sha256 {ref.sha256[:16]}…",
                reason="artifact_checksum_mismatch",
            )

    async def _batch(self, subject: str, seq: int, size: int, what: str) -> AsyncGenerator[tuple[int, bytes], None]:
        """One batched direct get (ADR-31): up to ``size`` messages on ``subject`` from ``seq`` on,
        each passed on as it arrives, so the caller writes the first while the next ones travel."""
        inbox = self._nc.new_inbox()
        got: asyncio.Queue[Any] = asyncio.Queue()

        async def collect(msg: Any) -> None:
            got.put_nowait(msg)

        sub = await self._nc.subscribe(inbox, cb=collect)
        try:
            request = orjson.dumps({"seq": seq, "next_by_subj": subject, "batch": size})
            await self._nc.publish(names.direct_get_subject(ARTIFACTS_STREAM), request, reply=inbox)
            for _ in range(size):
                try:
                    msg = await asyncio.wait_for(got.get(), _READ_TIMEOUT)
                except TimeoutError:
                    raise StorageUnavailable(f"{what}: messages stopped arriving") from None
                if (msg.headers or {}).get("Status"):  # 204 end of batch, 404 nothing there
                    return
                yield int(msg.headers["Nats-Sequence"]), msg.data
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def read(self, ref: ArtifactRef) -> bytes:
        """The whole object (for small artifacts and tests)."""
        return b"".join([chunk async for chunk in self.stream(ref)])

    async def release(self, ref: ArtifactRef) -> None:
        """Delete an archived artifact: its chunks, then its meta, two requests (idempotent).

        Chunks first, everywhere: a request that fails half-way leaves a meta that still names
        its chunks, never chunks that nothing names.
        """
        if ref.nuid is None:
            await self.delete(ref.object)
            return
        await self.purge_chunks(ref.nuid)
        await self._js.purge_stream(ARTIFACTS_STREAM, subject=_meta_subject(ref.object))

    async def delete(self, name: str) -> bool:
        """Purge whatever is stored under ``name``, finished or cut short (idempotent).

        A put cut short leaves its placeholder meta, which names its chunks: ``leftovers`` finds
        the objects of attempts that died this way. True when there was something.
        """
        try:
            msg = await self._js.get_last_msg(ARTIFACTS_STREAM, _meta_subject(name))
        except nats.js.errors.NotFoundError:
            return False
        nuid = orjson.loads(msg.data or b"").get("nuid")
        if nuid:
            await self.purge_chunks(nuid)
        await self._js.purge_stream(ARTIFACTS_STREAM, subject=_meta_subject(name))
        return True

    async def nameless_chunks(self) -> set[str]:
        """The NUIDs of chunks that no meta names (see ``leftovers.StrayChunks``).

        The metas are read before the chunks are listed, so a put that starts in between shows
        up here too (its placeholder came after the reading): only a NUID found nameless twice,
        some time apart, is a stray.
        """
        named = await self._named_nuids()
        chunks = await self._js.stream_info(ARTIFACTS_STREAM, subjects_filter=_chunk_subject(">"))
        nuids = {subject.rsplit(".", 1)[-1] for subject in chunks.state.subjects or {}}
        return nuids - named

    async def _named_nuids(self) -> set[str]:
        """The NUID in the meta of every name (placeholders included), read through a consumer
        the stream's leader serves (``bus.scan``): a name a lagging replica missed would make its
        chunks look like strays. Metas are rolled up, so the last per subject is each name's meta.
        Raises ``StorageUnavailable`` when the reading could not finish."""
        named: set[str] = set()
        config = scan_config(filter_subject=_ALL_METAS, deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
        try:
            async with contextlib.aclosing(scan(self._js, ARTIFACTS_STREAM, config, batch=_META_BATCH,
                                                timeout=_READ_TIMEOUT)) as metas:
                async for msg in metas:
                    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                        named.add(orjson.loads(msg.data).get("nuid"))
        except TRANSIENT as exc:
            raise StorageUnavailable(f"cannot read the names in {ARTIFACTS_BUCKET}: {exc!r}") from None
        return named

    @property
    def resend_span(self) -> float:
        """The longest a put's message may go on being re-sent after its first send. ARTIFACTS'
        duplicate window must be longer (``streams/artifacts.toml``)."""
        return resend_span(self.timeout, _PUT_RETRIES)

    @property
    def placeholder_lag(self) -> float:
        """How long after a put's first chunks its placeholder meta may still land: it was lost
        in a reconnect and every re-send went out, plus one timeout's margin."""
        return self.resend_span + self.timeout

    async def purge_chunks(self, nuid: str) -> None:
        await self._js.purge_stream(ARTIFACTS_STREAM, subject=_chunk_subject(nuid))

    async def _purge_quietly(self, subject: str) -> bool:
        try:
            await self._js.purge_stream(ARTIFACTS_STREAM, subject=subject)
        except TRANSIENT:
            return False  # the bucket's TTL collects what is left
        return True


def _chunks(data: bytes | IO[bytes]) -> Iterator[bytes]:
    """``data`` in chunks of ``CHUNK_SIZE``: sliced from bytes, read from a file (one chunk in memory)."""
    if isinstance(data, bytes):
        view = memoryview(data)
        for offset in range(0, len(data), CHUNK_SIZE):
            yield bytes(view[offset:offset + CHUNK_SIZE])
        return
    while chunk := data.read(CHUNK_SIZE):
        yield chunk


def _headers(nuid: str, part: int | str, *, rollup: bool = False) -> dict[str, str]:
    """A put's message id (``names.object_part_msg_id``), and on a meta the roll-up of the name."""
    headers = {names.MSG_ID: names.object_part_msg_id(nuid, part)}
    if rollup:
        headers[names.ROLLUP] = "sub"
    return headers


def _placeholder(name: str, nuid: str) -> dict[str, Any]:
    """The meta a put starts with: where its chunks go, and "deleted" until the real meta lands."""
    return {"name": name, "bucket": ARTIFACTS_BUCKET, "nuid": nuid, "size": 0, "chunks": 0, "deleted": True}


def _missing(ref: ArtifactRef) -> ArtifactUnusable:
    return ArtifactUnusable(f"artifact {ref.object} is not in {ARTIFACTS_BUCKET} (expired or deleted)",
                            reason="artifact_missing")
