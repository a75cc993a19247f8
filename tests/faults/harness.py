"""A fleet of real busscrape processes on loopback, and the faults to throw at it.

``Fleet`` runs a nats-server (file storage) or a three-node cluster, an S3-protocol server behind
a proxy, and either worker processes (through a relay that can withhold PubAcks, on one server)
and an ingester process of its own, or ``busscrape run --with-daemons`` whose daemons they are
(``start_run``: run supervises them, and replaces one that dies) — all the real binaries and
CLI — and knows how to kill, freeze and restart each of them, fill RESULTS up and lose PubAcks.
``Audit`` reads what the run left behind (the archive, DEADLETTER, TASKS, RESULTS, ARTIFACTS)
and counts every task.

RESULTS itself is no record of what was published: the ingesters trim it below their ack floor,
at once when it is short of room (as the harness makes it). So before the run the harness adds a
mirror of RESULTS with no limits (``witness_results``), and the audit counts results there.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from nats.js import api

from busscrape.archive.storage import open_storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.errors import StorageUnavailable
from busscrape.model.messages import DeadLetter, decode
from busscrape.ops.lifeline import PidFiles
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from tests.support.bus import stream_messages
from tests.support.cluster import NatsCluster
from tests.support.procs import env_for, kill9, spawn
from tests.support.relay import Relay, results_puback
from tests.support.s3 import S3Server

log = structlog.get_logger("faults")

RESULTS_WITNESS = "FAULTS_RESULTS_WITNESS"
"""A mirror of RESULTS the harness adds before the run: every result ever published, kept."""
# Room left in RESULTS when the fault fills it: more results than this between reading its count and
# lowering its limit (milliseconds) would be deleted by the server, so a comfortable margin.
FILL_SLACK = 20


async def witness_results(bus: Bus, replicas: int) -> None:
    """Mirror RESULTS into a stream nothing trims, before any result is published: the audit's
    record of every result, whatever the ingesters' trim removes from RESULTS. (A mirror reads
    RESULTS through an ephemeral consumer, which holds no trim back.)"""
    await bus.js.add_stream(api.StreamConfig(
        name=RESULTS_WITNESS, mirror=api.StreamSource(name=names.RESULTS_STREAM),
        storage=api.StorageType.FILE, num_replicas=replicas))


@dataclass
class Fleet:
    workdir: Path
    settings: Settings
    nats: EmbeddedNatsServer | NatsCluster
    s3: S3Server
    relay: Relay | None = None
    """Between the workers and nats-server (one server only): can withhold RESULTS PubAcks."""
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ingester: subprocess.Popen[bytes] | None = None
    run: subprocess.Popen[bytes] | None = None
    """``busscrape run --with-daemons`` (``start_run``): then the workers and the ingester are its children."""
    faults: Counter[str] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=random.Random)
    """Every choice the faults make (which worker, how long): seeded, a schedule replays."""

    def env(self, nats_url: str | None = None) -> dict[str, str]:
        # The settings the test chose (retry delays, the stray-chunk sweep, RESULTS' trim …).
        chosen = {}
        for section in ("worker", "ingester", "streams", "nats"):
            model = getattr(self.settings, section)
            values = model.model_dump(mode="json", include=model.model_fields_set)
            chosen.update({f"BUSSCRAPE_{section.upper()}__{key.upper()}": v if isinstance(v, str) else json.dumps(v)
                           for key, v in values.items()})
        chosen.pop("BUSSCRAPE_NATS__URL", None)
        env = env_for(self.settings, BUSSCRAPE_S3=json.dumps({**self.s3.settings(self.settings.s3.bucket)}),
                      **chosen)
        if nats_url:
            env["BUSSCRAPE_NATS__URL"] = nats_url
        return env

    def start_worker(self, name: str) -> None:
        url = self.relay.url if self.relay is not None else None
        self.workers[name] = spawn(["worker"], {**self.env(url), "BUSSCRAPE_WORKER__NAME": name},
                                   self.workdir / f"{name}.log")

    def start_ingester(self) -> None:
        self.ingester = spawn(["ingester"], {**self.env(), "BUSSCRAPE_INGESTER__NAME": "ingester"},
                              self.workdir / "ingester.log")

    def start_run(self, args: list[str], workers: int) -> subprocess.Popen[bytes]:
        """``busscrape run - --with-daemons`` reading its URLs from a pipe (``feed``, then
        ``close_input``), its summary (``--json``) on stdout, its progress in ``run.log``."""
        env = {**self.env(), "BUSSCRAPE_TELEMETRY__LOG_LEVEL": "info"}  # the daemons too: their logs tell the story
        with open(self.workdir / "run.log", "ab") as err:
            self.run = subprocess.Popen(
                [sys.executable, "-m", "busscrape", "run", "-", "--with-daemons", "--workers", str(workers), "--json",
                 *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        return self.run

    async def daemons_started(self, workers: int, timeout: float = 180) -> None:
        """Until ``run`` has started its workers and its ingester (their pid files are there)."""
        deadline = time.monotonic() + timeout
        while len(self._names("worker")) < workers or not self._names("ingester"):
            assert self.run is not None and self.run.poll() is None, f"busscrape run exited: {self.run_log()}"
            assert time.monotonic() < deadline, f"busscrape run started no daemons in {timeout:.0f}s: {self.run_log()}"
            await asyncio.sleep(0.5)

    async def archiving(self, timeout: float = 300) -> None:
        """Until ``run``'s ingester has archived a page (its browsers are up, pages render)."""
        deadline = time.monotonic() + timeout
        while not any('"result.archived"' in path.read_text(errors="replace")
                      for path in self.log_dir.glob("ingester-*.log")):
            assert self.run is not None and self.run.poll() is None, f"busscrape run exited: {self.run_log()}"
            assert time.monotonic() < deadline, f"nothing archived in {timeout:.0f}s: {self.run_log()}"
            await asyncio.sleep(0.5)

    def run_log(self) -> str:
        """The end of what ``run`` wrote to standard error (its progress and warnings)."""
        return (self.workdir / "run.log").read_text(errors="replace")[-3000:]

    def feed(self, lines: list[str]) -> None:
        assert self.run is not None and self.run.stdin is not None
        self.run.stdin.write("".join(lines).encode())
        self.run.stdin.flush()

    def close_input(self) -> None:
        assert self.run is not None and self.run.stdin is not None
        self.run.stdin.close()

    @property
    def log_dir(self) -> Path:
        """Where the daemons write their logs (``run``'s go under its state dir)."""
        return self.settings.state_dir / "logs" if self.run is not None else self.workdir

    def _names(self, kind: str) -> list[str]:
        if self.run is None:
            return sorted(self.workers) if kind == "worker" else ["ingester"]
        return sorted(path.stem for path in PidFiles(self.settings.state_dir).dir.glob(f"{kind}-*.json"))

    def _pid(self, name: str) -> int:
        if self.run is None:
            proc = self.workers[name] if name in self.workers else self.ingester
            assert proc is not None
            return proc.pid
        doc = json.loads((PidFiles(self.settings.state_dir).dir / f"{name}.json").read_bytes())
        return int(doc["pid"])

    async def _crash(self, name: str) -> None:
        """SIGKILL one daemon. Ours is started again here; ``run``'s must be replaced by ``run``
        itself (as an operator expects of the command that started it): waited for, up to 60 s."""
        if self.run is None:
            proc = self.workers[name] if name in self.workers else self.ingester
            assert proc is not None
            kill9(proc)
            await asyncio.sleep(0.5)
            self.start_worker(name) if name in self.workers else self.start_ingester()
            return
        pid = self._pid(name)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while self._pid(name) == pid:
            assert time.monotonic() < deadline, f"busscrape run did not replace its {name} (SIGKILLed)"
            await asyncio.sleep(0.2)
        log.warning("fault.replaced_by_run", daemon=name, pid=self._pid(name))

    # -- faults -----------------------------------------------------------------------------

    async def kill_a_worker(self) -> None:
        name = self.rng.choice(self._names("worker"))
        self.faults["worker_sigkill"] += 1
        log.warning("fault.worker_killed", worker=name)
        await self._crash(name)

    async def freeze_a_worker(self, seconds: float) -> None:
        """SIGSTOP a worker (its heartbeats stop: past ack_wait its tasks go to another), then
        SIGCONT it: it wakes up holding deliveries that are no longer its own."""
        name = self.rng.choice(self._names("worker"))
        pid = self._pid(name)
        os.kill(pid, signal.SIGSTOP)
        self.faults["worker_sigstop"] += 1
        log.warning("fault.worker_frozen", worker=name, seconds=seconds)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    async def restart_node(self, index: int) -> None:
        """One step of a rolling restart (a nats-server upgrade): SIGTERM one node, start it again
        on its store, and wait until the cluster has a meta leader every node knows."""
        assert isinstance(self.nats, NatsCluster)
        node = self.nats.nodes[index]
        await asyncio.to_thread(node.stop)
        self.faults["node_restart"] += 1
        log.warning("fault.node_restarted", node=node.name)
        await asyncio.to_thread(node.start)
        await asyncio.to_thread(self.nats.wait_for_meta_leader)

    async def kill_nats(self, down_for: float) -> None:
        assert isinstance(self.nats, EmbeddedNatsServer)
        await asyncio.to_thread(self.nats.kill)
        self.faults["nats_sigkill"] += 1
        log.warning("fault.nats_killed", down_for=down_for)
        await asyncio.sleep(down_for)
        await asyncio.to_thread(self.nats.start)

    async def kill_node(self, index: int, down_for: float) -> None:
        """SIGKILL one node of the cluster; start it again on its store after ``down_for``."""
        assert isinstance(self.nats, NatsCluster)
        node = self.nats.nodes[index]
        await asyncio.to_thread(node.kill)
        self.faults["node_sigkill"] += 1
        log.warning("fault.node_killed", node=node.name, down_for=down_for)
        await asyncio.sleep(down_for)
        await asyncio.to_thread(node.start)

    async def lose_pubacks(self, seconds: float) -> None:
        """Every PubAck of a result withheld for a while: the server stores, the worker never hears."""
        assert self.relay is not None
        self.relay.withhold = results_puback
        await asyncio.sleep(seconds)
        self.relay.withhold = None
        self.faults["pubacks_lost"] += self.relay.withheld
        log.warning("fault.pubacks_lost", withheld=self.relay.withheld)

    async def fill_results(self, bus: Bus, seconds: float) -> None:
        """RESULTS full (a message limit it reaches) for a while: back-pressure.

        The limit is a little above what it holds, then the fault waits for the workers to fill
        it: a limit of exactly what it held would race the results published meanwhile, and the
        server enforces a lowered limit by deleting the oldest messages (a fault run once lost 8
        archived results that way, and its audit rightly failed)."""
        info = await bus.js.stream_info(names.RESULTS_STREAM)
        limit = info.state.messages + FILL_SLACK
        await bus.js.update_stream(info.config.evolve(max_msgs=limit))
        deadline = time.monotonic() + 60
        while (await bus.js.stream_info(names.RESULTS_STREAM)).state.messages < limit:
            if time.monotonic() > deadline:  # no work left to fill it: nothing to hold back
                break
            await asyncio.sleep(0.2)
        self.faults["results_full"] += 1
        log.warning("fault.results_full", seconds=seconds, messages=limit)
        await asyncio.sleep(seconds)
        await bus.js.update_stream(info.config)

    async def s3_outage(self, seconds: float) -> None:
        self.s3.outage()
        self.faults["s3_outage"] += 1
        log.warning("fault.s3_down", seconds=seconds)
        await asyncio.sleep(seconds)
        self.s3.restore()

    async def kill_ingester(self) -> None:
        self.faults["ingester_sigkill"] += 1
        log.warning("fault.ingester_killed")
        await self._crash(self._names("ingester")[0])

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
        """Everything still running, killed (``run`` first: its daemons die with it)."""
        for proc in [self.run, *self.workers.values(), self.ingester]:
            if proc is not None:
                kill9(proc)


@dataclass
class Audit:
    dispatched: set[str]
    archived: Counter[str]
    """task id -> number of archive folders holding it"""
    results: Counter[str]
    """task id -> number of results published to RESULTS for it (counted in the witness mirror)"""
    dead: dict[str, DeadLetter]
    poison_found: set[tuple[str, int]]
    tasks_left: int
    results_pending: int
    witness_lag: int
    """Results the witness mirror has not copied yet (0 before the audit counts them)."""
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
        """Tasks archived in two folders, with two results in RESULTS, or both archived and dead."""
        twice = {t for t, n in self.archived.items() if n > 1} | {t for t, n in self.results.items() if n > 1}
        return len(twice | (set(self.archived) & set(self.dead)))

    def unexpected_dead(self, may_die: set[str]) -> dict[str, str]:
        """Letters for tasks not designed to die (task id -> reason): each one is a loss."""
        return {t: f"{d.reason}: {d.error[:200]}" for t, d in self.dead.items() if t in self.dispatched
                and t not in may_die}

    def line(self, faults: int) -> str:
        archived = len(set(self.archived) & self.dispatched)
        dead = len(set(self.dead) & self.dispatched)
        return (f"tasks={len(self.dispatched)} archived={archived} dead={dead} lost={len(self.lost)} "
                f"duplicates={self.duplicates} faults={faults}")


async def nameless_chunks(bus: Bus, within: float = 60) -> list[str]:
    """The artifact store's nameless chunks, read again while the cluster still elects leaders
    after the last restart (the scan raises ``StorageUnavailable`` then: an outage costs time)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return sorted(await ArtifactStore(bus.js).nameless_chunks())
        except StorageUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


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
    results: Counter[str] = Counter()
    info = await bus.js.stream_info(RESULTS_WITNESS, subjects_filter=names.result_subject(">"))
    for subject, n in (info.state.subjects or {}).items():
        results[subject.rsplit(".", 1)[-1]] += n
    witness_lag = (info.mirror.lag or 0) if info.mirror is not None else 0
    tasks = await bus.js.stream_info(names.TASKS_STREAM)
    ingest = await bus.js.consumer_info(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
    # A released object has its chunks purged: live objects are the chunk subjects still there.
    chunks = await bus.js.stream_info(names.ARTIFACTS_STREAM,
                                      subjects_filter=names.object_chunk_subject(names.ARTIFACTS_BUCKET, ">"))
    objects = len(chunks.state.subjects or {})
    metas = await bus.js.stream_info(names.ARTIFACTS_STREAM, subjects_filter=names.object_metas(names.ARTIFACTS_BUCKET))
    stored_names = sorted(names.object_name_of(subject)
                   for subject in metas.state.subjects or {})
    nameless = await nameless_chunks(bus) if objects else []
    return Audit(dispatched=dispatched, archived=archived, results=results, dead=dead, poison_found=poison_found,
                 tasks_left=tasks.state.messages,
                 results_pending=(ingest.num_pending or 0) + (ingest.num_ack_pending or 0), witness_lag=witness_lag,
                 live_artifacts=objects, artifact_names=stored_names,
                 nameless_chunks=nameless)
