"""The bus at a glance (``busscrape status``): streams, consumers, buckets, dead letters, lag, rates.

One refresh reads, concurrently: every stream and bucket of ``streams/`` (JetStream's stream
info), every consumer (consumer info), the dead letters' subjects (counted by stage on the
server), the newest dead letters (their reasons, a bounded sample) and the workers' lag.

**Lag** is the number KEDA's ``nats-jetstream`` scaler scales the workers on: for the durable
consumer ``TASKS/workers``, ``num_pending + num_ack_pending`` as the server's monitoring
endpoint reports it in ``/jsz?acc=<account>&consumers=true&config=true`` (kedacore/keda,
``pkg/scalers/nats_jetstream_scaler.go``, ``getMaxMsgLag``). With ``BUSSCRAPE_NATS__MONITOR_URL``
set it is read from there, as KEDA does; otherwise, or when the endpoint fails, from the
JetStream API's consumer info (the same two counters), and ``lag.source`` says which.

**Rates** are differences between two reads ``seconds`` apart: messages into a stream is the
growth of its last sequence; a consumer's acks are the messages that left its backlog,
``Δ last_seq − Δ(num_pending + num_ack_pending)`` (on the work-queue TASKS that also counts the
few tasks the reaper deletes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import nats.errors
import nats.js.errors
import orjson
import structlog

from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.topology import Definition
from busscrape.crawl.spec import CrawlSpec
from busscrape.crawl.state import CrawlState
from busscrape.deadletters.queue import DeadLetterQueue, LetterFilter
from busscrape.errors import StreamsMissing, said
from busscrape.model.messages import decode, utcnow
from busscrape.net.checked import read_up_to
from busscrape.ops.nats_server import MAX_JSZ_BYTES, within_jsz_bound
from busscrape.worker.backpressure import HIGH_WATER, fill_of
from busscrape.worker.fleet_gate import Cooling, cooling_hosts, slots_by_worker

log = structlog.get_logger("busscrape.overview")

_FLOW = {name: rank for rank, name in enumerate((
    names.SEEN_STREAM, names.TASKS_STREAM, names.ATTEMPTS_STREAM, names.ARTIFACTS_STREAM,
    names.RESULTS_STREAM, names.DEADLETTER_STREAM, names.ADVISORIES_STREAM, names.STATUS_STREAM,
    names.kv_stream(names.FOLDERS_BUCKET)))}
MAX_CRAWLS = 20  # crawls shown by `busscrape status`, newest first
MAX_CRAWLS_READ = 200  # crawls read to find those
REASON_SAMPLE = 1000  # newest dead letters read for the reason counts
RATE_STREAMS = (names.TASKS_STREAM, names.RESULTS_STREAM, names.DEADLETTER_STREAM)
LAG_CONSUMER = (names.TASKS_STREAM, names.WORKERS_CONSUMER)
MISSING_HINT = ("Run `busscrape streams apply` against the same server (BUSSCRAPE_NATS__URL) to create every "
                "stream, consumer and bucket busscrape needs")


@dataclass(frozen=True)
class Counters:
    """The numbers rates are computed from, and when they were read (monotonic seconds)."""

    at: float
    last_seq: dict[str, int]
    backlog: dict[str, int]
    """``num_pending + num_ack_pending`` per ``stream/consumer``."""
    stream_of: dict[str, str]


def rates(before: Counters, after: Counters) -> dict[str, Any]:
    """Messages/s into each stream of ``RATE_STREAMS`` and acks/s per consumer between two reads."""
    seconds = after.at - before.at
    if seconds <= 0:
        return {"seconds": 0.0, "messages_in": {}, "acks": {}}

    def grown(stream: str) -> int:
        # A stream deleted and created again restarts its sequence: no rate rather than a negative one.
        return max(after.last_seq.get(stream, 0) - before.last_seq.get(stream, 0), 0)

    acks = {}
    for key, backlog in after.backlog.items():
        if key in before.backlog:
            left = grown(after.stream_of[key]) - (backlog - before.backlog[key])
            acks[key] = round(max(left, 0) / seconds, 3)
    return {"seconds": round(seconds, 3),
            "messages_in": {s: round(grown(s) / seconds, 3) for s in RATE_STREAMS if s in after.last_seq},
            "acks": acks}


def monitor_base(url: str) -> str:
    """``nats:8222`` or ``http://nats:8222/`` -> ``http://nats:8222`` (KEDA takes a bare host:port)."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def lag_from_jsz(doc: dict[str, Any], account: str, stream: str, consumer: str) -> tuple[int, int]:
    """``(num_pending, num_ack_pending)`` of one consumer in a ``/jsz`` document, found the way
    KEDA finds it: account by name (or id), then stream, then consumer, by name."""
    for acc in doc.get("account_details") or []:
        if account not in (acc.get("name"), acc.get("id")):
            continue
        for detail in acc.get("stream_detail") or []:
            if detail.get("name") != stream:
                continue
            for cons in detail.get("consumer_detail") or []:
                if cons.get("name") == consumer:
                    return int(cons.get("num_pending", 0)), int(cons.get("num_ack_pending", 0))
    raise LookupError(f"/jsz of account {account} lists no consumer {stream}/{consumer}")


class Overview:
    """Reads the whole picture, once or again and again. Async context manager (owns an HTTP session)."""

    def __init__(self, bus: Bus, definitions: list[Definition], *, monitor_url: str | None = None,
                 account: str = "$G") -> None:
        self.bus = bus
        # In the order work flows (TASKS, RESULTS, DEADLETTER, …), not the files' alphabetical one.
        self.definitions = sorted(definitions, key=lambda d: _FLOW.get(d.stream, len(_FLOW)))
        self.monitor_url = monitor_base(monitor_url) if monitor_url else None
        self.account = account
        self.timeout = bus.settings.nats.request_timeout
        self.dlq = DeadLetterQueue(bus.js, request_timeout=self.timeout)
        self._http: aiohttp.ClientSession | None = None
        self._entered = False

    async def __aenter__(self) -> Overview:
        if self._entered:
            raise RuntimeError("an Overview can be entered only once")
        self._entered = True
        if self.monitor_url:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=min(self.timeout, 10)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    # -- reads ------------------------------------------------------------------------------

    async def counters(self) -> Counters:
        """Only what rates need (a cheap first sample)."""
        streams, consumers = await asyncio.gather(self._streams(), self._consumers())
        return self._counters(streams, consumers)

    async def snapshot(self, before: Counters | None = None) -> tuple[dict[str, Any], Counters]:
        """The status document (docs/status.md has its keys) and the counters of this read."""
        (streams, consumers, by_stage, lag, cooling, crawls), slots = await asyncio.gather(asyncio.gather(
            self._streams(), self._consumers(), self._stage_counts(), self._jsz_lag(), cooling_hosts(self.bus.js),
            self._crawls()), slots_by_worker(self.bus.js))
        counters = self._counters(streams, consumers)
        # After the stream reads, so that the scan's own consumer is not counted on DEADLETTER.
        reasons, sampled = await self._reasons(streams[names.DEADLETTER_STREAM]["state"])
        stream_defs = [d for d in self.definitions if d.kind == "stream"]
        bucket_defs = [d for d in self.definitions if d.kind in ("kv", "object_store")]
        letters = streams[names.DEADLETTER_STREAM]["state"]["messages"]
        doc = {
            "at": utcnow().isoformat(),
            "streams": {d.stream: _stream_row(streams[d.stream]) for d in stream_defs},
            "consumers": consumers,
            "buckets": {d.name: _bucket_row(d, streams[d.stream]) for d in bucket_defs},
            "deadletters": {"total": letters, "by_stage": by_stage, "by_reason": reasons,
                            "reasons_sampled": sampled, "reasons_complete": sampled >= letters},
            "lag": self._lag(consumers, lag),
            "results": _results_room(streams[names.RESULTS_STREAM]),
            "rates": rates(before, counters) if before is not None else None,
            "cooling": [_cooling_row(c, time.time()) for c in cooling],
            "workers": [{"worker": name, "slots": sum(hosts.values()), "hosts": dict(sorted(hosts.items()))}
                        for name, hosts in sorted(slots.items())],
            "crawls": crawls,
        }
        return doc, counters

    async def _crawls(self) -> list[dict[str, Any]]:
        """The crawls in CRAWLS (those started within its TTL, the recrawl window), newest first,
        at most ``MAX_CRAWLS``: each with its rules and counts read from subject counts and its
        budget key, never from its page records (a status read stays cheap for a big crawl)."""
        if not any(d.kind == "kv" and d.name == names.CRAWLS_BUCKET for d in self.definitions):
            return []
        stream = names.CRAWLS_STREAM
        prefix = names.kv_subject(names.CRAWLS_BUCKET, "")
        try:
            specs = await self._stream_info(stream, subjects_filter=prefix + "*.spec")
        except StreamsMissing:  # a server provisioned before crawls: no crawl to show
            return []
        ids = [subject.removeprefix(prefix).removesuffix(".spec") for subject in specs["state"].get("subjects") or {}]
        state = CrawlState(self.bus.js)

        async def one(crawl_id: str) -> dict[str, Any]:
            entry = await self.bus.js.get_last_msg(stream, f"{prefix}{crawl_id}.spec")
            spec = decode(CrawlSpec, entry.data or b"")
            # One token after ``page.``: a page's head record, not the ``<page>.<n>`` parts a
            # large one overflows into (``CrawlState.record_page``).
            pages = await self._stream_info(stream, subjects_filter=f"{prefix}{crawl_id}.page.*")
            listed = pages.get("total", len(pages["state"].get("subjects") or {}))
            followed = max(0, listed - 1)  # the seeds' record is not a page
            used, holds = await state.used(crawl_id), await state.holds(crawl_id)
            return {"crawl_id": crawl_id, "started": entry.time.isoformat() if entry.time else None,
                    "seeds": list(spec.seeds[:3]), "seed_count": len(spec.seeds), "scope": spec.scope,
                    "depth": spec.depth, "max_pages": spec.max_pages, "queued": used, "followed": followed,
                    "unfollowed": max(0, used - followed), "holds": len(holds), "seq": entry.seq}

        crawls = await asyncio.gather(*(one(i) for i in ids[:MAX_CRAWLS_READ]))
        return sorted(crawls, key=lambda c: -c.pop("seq"))[:MAX_CRAWLS]

    async def _streams(self) -> dict[str, dict[str, Any]]:
        stream_names = [d.stream for d in self.definitions if d.kind != "consumer"]
        infos = await asyncio.gather(*(self._stream_info(n) for n in stream_names))
        return dict(zip(stream_names, infos, strict=True))

    async def _stream_info(self, name: str, **request: Any) -> dict[str, Any]:
        """JetStream's stream info as the server sends it: nats-py's model drops ``num_subjects``
        and the paging fields of a subject listing."""
        try:
            reply = await self.bus.nc.request(names.stream_info_subject(name),
                                              orjson.dumps(request) if request else b"", timeout=self.timeout)
        except nats.errors.NoRespondersError:
            raise StreamsMissing(f"JetStream does not answer on this NATS server. {MISSING_HINT}") from None
        doc: dict[str, Any] = orjson.loads(reply.data)
        error = doc.get("error")
        if error and error.get("code") == 404:
            raise StreamsMissing(f"missing on the NATS server: stream {name}. {MISSING_HINT}")
        if error:
            raise nats.js.errors.APIError(code=error.get("code"), err_code=error.get("err_code"),
                                          description=error.get("description"))
        return doc

    async def _consumers(self) -> dict[str, dict[str, Any]]:
        defs = [d for d in self.definitions if d.kind == "consumer"]
        infos = await asyncio.gather(*(self._consumer_info(d.stream, d.name) for d in defs))
        return {f"{d.stream}/{d.name}": info for d, info in zip(defs, infos, strict=True)}

    async def _consumer_info(self, stream: str, name: str) -> dict[str, Any]:
        try:
            info = await self.bus.js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            raise StreamsMissing(f"missing on the NATS server: consumer {stream}/{name}. {MISSING_HINT}") from None
        return {"stream": stream, "name": name, "num_pending": info.num_pending or 0,
                "num_ack_pending": info.num_ack_pending or 0, "num_redelivered": info.num_redelivered or 0,
                "num_waiting": info.num_waiting or 0}

    async def _stage_counts(self) -> dict[str, int]:
        """Letters per stage from the subject counts (``busscrape.deadletter.<stage>.<task>``),
        page by page: the server lists at most 100,000 subjects per reply."""
        counts: Counter[str] = Counter({stage: 0 for stage in names.DEADLETTER_STAGES})
        offset = 0
        while True:
            doc = await self._stream_info(names.DEADLETTER_STREAM, subjects_filter=names.DEADLETTER_SUBJECTS,
                                          offset=offset)
            page = doc.get("state", {}).get("subjects") or {}
            for subject, count in page.items():
                counts[names.deadletter_stage_of(subject) or "?"] += count
            offset += len(page)
            if not page or offset >= doc.get("total", 0):
                return dict(counts)

    async def _reasons(self, state: dict[str, Any]) -> tuple[dict[str, dict[str, int]], int]:
        """``{stage: {reason: count}}`` over the newest ``REASON_SAMPLE`` letters, and how many were read."""
        if not state.get("messages"):
            return {}, 0
        start = None if state["messages"] <= REASON_SAMPLE else max(state["last_seq"] - REASON_SAMPLE + 1, 1)
        found: dict[str, Counter[str]] = {}
        read = 0
        async with contextlib.aclosing(self.dlq.scan(LetterFilter(), start_seq=start)) as entries:
            async for entry in entries:
                found.setdefault(entry.stage, Counter())[entry.reason] += 1
                read += 1
        return {stage: dict(c.most_common()) for stage, c in sorted(found.items())}, read

    async def _jsz_lag(self) -> tuple[int, int] | str | None:
        """``(num_pending, num_ack_pending)`` from ``/jsz``, the error text when that failed, or
        ``None`` without a monitoring URL."""
        if self._http is None or self.monitor_url is None:
            return None
        url = f"{self.monitor_url}/jsz"
        params = {"acc": self.account, "consumers": "true", "config": "true"}
        try:
            async with self._http.get(url, params=params) as resp:
                resp.raise_for_status()
                body = await read_up_to(resp.content, MAX_JSZ_BYTES + 1)
            return lag_from_jsz(orjson.loads(within_jsz_bound(body)), self.account, *LAG_CONSUMER)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, LookupError, ValueError) as exc:
            log.warning("status.jsz_failed", url=url, account=self.account, error=said(exc))
            return said(exc)

    def _lag(self, consumers: dict[str, dict[str, Any]], jsz: tuple[int, int] | str | None) -> dict[str, Any]:
        key = "/".join(LAG_CONSUMER)
        doc: dict[str, Any] = {"consumer": key, "formula": "num_pending + num_ack_pending",
                               "monitor_url": self.monitor_url, "note": None}
        if isinstance(jsz, tuple):
            pending, ack_pending = jsz
            doc.update(source="jsz")
        else:
            pending, ack_pending = consumers[key]["num_pending"], consumers[key]["num_ack_pending"]
            doc.update(source="jetstream_api")
            if isinstance(jsz, str):
                doc["note"] = f"the monitoring endpoint failed ({jsz}); read from the JetStream API instead"
        doc.update(value=pending + ack_pending, num_pending=pending, num_ack_pending=ack_pending)
        return doc

    @staticmethod
    def _counters(streams: dict[str, dict[str, Any]], consumers: dict[str, dict[str, Any]]) -> Counters:
        return Counters(
            at=time.monotonic(),
            last_seq={name: info["state"]["last_seq"] for name, info in streams.items()},
            backlog={key: c["num_pending"] + c["num_ack_pending"] for key, c in consumers.items()},
            stream_of={key: c["stream"] for key, c in consumers.items()},
        )


def _cooling_row(c: Cooling, now: float) -> dict[str, Any]:
    return {"host": c.host, "until": datetime.fromtimestamp(c.until, UTC).isoformat(),
            "seconds_left": round(max(c.until - now, 0.0), 1), "status": c.status, "worker": c.worker}


def _results_room(info: dict[str, Any]) -> dict[str, Any]:
    """How full RESULTS is: at ``HIGH_WATER`` the workers stop fetching (back-pressure)."""
    config, state = info.get("config", {}), info["state"]
    fill = fill_of(config.get("max_bytes"), config.get("max_msgs"), state["bytes"], state["messages"])
    return {"fill": round(fill, 4), "bytes": state["bytes"], "max_bytes": config.get("max_bytes"),
            "paused": fill >= HIGH_WATER}


def _stream_row(info: dict[str, Any]) -> dict[str, Any]:
    state = info["state"]
    return {"messages": state["messages"], "bytes": state["bytes"], "consumers": state.get("consumer_count", 0),
            "first_seq": state["first_seq"], "last_seq": state["last_seq"]}


def _bucket_row(d: Definition, info: dict[str, Any]) -> dict[str, Any]:
    state = info["state"]
    row = {"kind": d.kind, "stream": d.stream, "messages": state["messages"], "bytes": state["bytes"]}
    if d.kind == "kv":
        # Every key is one subject; its history revisions are more messages on that subject.
        row["keys"] = state.get("num_subjects", 0)
    return row
