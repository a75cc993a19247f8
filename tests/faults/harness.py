"""A fleet of real busscrape processes on loopback, and the faults to throw at it.

``Fleet`` runs a nats-server (file storage), an S3-protocol server behind a proxy, worker
processes and an ingester process — all the real binaries and CLI — and knows how to kill and
restart each of them. ``Audit`` reads what the run left behind (the archive, DEADLETTER,
TASKS, RESULTS, ARTIFACTS) and counts every task.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from busscrape.archive.storage import open_storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.model.messages import DeadLetter, decode
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from tests.support.bus import stream_messages
from tests.support.procs import env_for, kill9, spawn
from tests.support.s3 import S3Server

log = structlog.get_logger("faults")


@dataclass
class Fleet:
    workdir: Path
    settings: Settings
    nats: EmbeddedNatsServer
    s3: S3Server
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ingester: subprocess.Popen[bytes] | None = None
    faults: Counter[str] = field(default_factory=Counter)

    def env(self) -> dict[str, str]:
        # The worker and ingester settings the test chose (retry delays, the stray-chunk sweep …).
        chosen = {}
        for section in ("worker", "ingester"):
            model = getattr(self.settings, section)
            values = model.model_dump(mode="json", include=model.model_fields_set)
            chosen.update({f"BUSSCRAPE_{section.upper()}__{key.upper()}": v if isinstance(v, str) else json.dumps(v)
                           for key, v in values.items()})
        return env_for(self.settings, BUSSCRAPE_S3=json.dumps({**self.s3.settings(self.settings.s3.bucket)}),
                       **chosen)

    def start_worker(self, name: str) -> None:
        self.workers[name] = spawn(["worker"], {**self.env(), "BUSSCRAPE_WORKER__NAME": name},
                                   self.workdir / f"{name}.log")

    def start_ingester(self) -> None:
        self.ingester = spawn(["ingester"], {**self.env(), "BUSSCRAPE_INGESTER__NAME": "ingester"},
                              self.workdir / "ingester.log")

    # -- faults -----------------------------------------------------------------------------

    async def kill_a_worker(self) -> None:
        name = random.choice(sorted(self.workers))
        kill9(self.workers[name])
        self.faults["worker_sigkill"] += 1
        log.warning("fault.worker_killed", worker=name)
        await asyncio.sleep(0.5)
        self.start_worker(name)

    async def kill_nats(self, down_for: float) -> None:
        await asyncio.to_thread(self.nats.kill)
        self.faults["nats_sigkill"] += 1
        log.warning("fault.nats_killed", down_for=down_for)
        await asyncio.sleep(down_for)
        await asyncio.to_thread(self.nats.start)

    async def s3_outage(self, seconds: float) -> None:
        self.s3.outage()
        self.faults["s3_outage"] += 1
        log.warning("fault.s3_down", seconds=seconds)
        await asyncio.sleep(seconds)
        self.s3.restore()

    async def kill_ingester(self) -> None:
        assert self.ingester is not None
        kill9(self.ingester)
        self.faults["ingester_sigkill"] += 1
        log.warning("fault.ingester_killed")
        await asyncio.sleep(0.5)
        self.start_ingester()

    async def poison(self, bus: Bus) -> list[tuple[str, int]]:
        """Publish malformed messages straight into TASKS and RESULTS; returns (stream, seq) of each."""
        payloads = [b"\x00not json at all", b'{"schema_version": 1, "task_id": "nope"}',
                    b'{"schema_version": 99, "url": "http://127.0.0.2/"}',
                    b'{"junk": "' + b"x" * 900_000 + b'"}']
        sent = []
        for i, payload in enumerate(payloads):
            for stream, subject in ((names.TASKS_STREAM, names.task_subject(f"poison{i}")),
                                    (names.RESULTS_STREAM, names.result_subject(f"poison{i}"))):
                ack = await bus.js.publish(subject, payload, stream=stream)
                sent.append((stream, ack.seq))
        self.faults["poison_messages"] += len(sent)
        return sent

    async def orphan_chunks(self, bus: Bus, count: int = 2) -> None:
        """Chunks with no meta naming them, as a clean-up cut short between its two purges leaves."""
        for i in range(count):
            await bus.js.publish(names.object_chunk_subject(names.ARTIFACTS_BUCKET, f"ORPHAN{i}"), b"left behind" * 100,
                                 stream=names.ARTIFACTS_STREAM)
        self.faults["orphan_chunks"] += count

    def stop(self) -> None:
        for proc in [*self.workers.values(), self.ingester]:
            if proc is not None:
                kill9(proc)


@dataclass
class Audit:
    dispatched: set[str]
    archived: Counter[str]
    """task id -> number of archive folders holding it"""
    dead: dict[str, DeadLetter]
    poison_found: set[tuple[str, int]]
    tasks_left: int
    results_pending: int
    live_artifacts: int
    artifact_names: list[str]
    """Names under which ARTIFACTS still holds a meta (finished or placeholder): to tell which died where."""
    nameless_chunks: list[str]
    """NUIDs of chunks no meta names (what the stray-chunk sweep is there for)."""

    @property
    def lost(self) -> set[str]:
        return self.dispatched - set(self.archived) - set(self.dead)

    @property
    def duplicates(self) -> int:
        twice = sum(1 for n in self.archived.values() if n > 1)
        both = len(set(self.archived) & set(self.dead))
        return twice + both

    def line(self, faults: int) -> str:
        archived = len(set(self.archived) & self.dispatched)
        dead = len(set(self.dead) & self.dispatched)
        return (f"tasks={len(self.dispatched)} archived={archived} dead={dead} lost={len(self.lost)} "
                f"duplicates={self.duplicates} faults={faults}")


async def audit(bus: Bus, settings: Settings, dispatched: set[str]) -> Audit:
    storage = open_storage(settings)
    archived: Counter[str] = Counter()
    async with storage:
        for key in await storage.keys():
            if key.endswith("/meta.json") and "/deadletter/" not in f"/{key}":
                archived[key.rsplit("/", 2)[-2]] += 1
    dead: dict[str, DeadLetter] = {}
    poison_found: set[tuple[str, int]] = set()
    for msg in await stream_messages(bus.js, names.DEADLETTER_STREAM):
        letter = decode(DeadLetter, msg.data)
        if letter.task_id:
            dead[letter.task_id] = letter
        elif letter.source and letter.source.seq is not None:
            poison_found.add((letter.source.stream, letter.source.seq))
    tasks = await bus.js.stream_info(names.TASKS_STREAM)
    ingest = await bus.js.consumer_info(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
    # A released object has its chunks purged: live objects are the chunk subjects still there.
    chunks = await bus.js.stream_info(names.ARTIFACTS_STREAM,
                                      subjects_filter=names.object_chunk_subject(names.ARTIFACTS_BUCKET, ">"))
    objects = len(chunks.state.subjects or {})
    metas = await bus.js.stream_info(names.ARTIFACTS_STREAM, subjects_filter=names.object_metas(names.ARTIFACTS_BUCKET))
    stored_names = sorted(names.object_name_of(subject)
                   for subject in metas.state.subjects or {})
    nameless = sorted(await ArtifactStore(bus.js).nameless_chunks()) if objects else []
    return Audit(dispatched=dispatched, archived=archived, dead=dead, poison_found=poison_found,
                 tasks_left=tasks.state.messages,
                 results_pending=(ingest.num_pending or 0) + (ingest.num_ack_pending or 0),
                 live_artifacts=objects, artifact_names=stored_names,
                 nameless_chunks=nameless)
