"""Every stream, subject, consumer, bucket, header and message id busscrape uses. Nowhere else.

The flow on the wire::

    dispatcher ─ create $KV.SEEN.<task_key> ─► KV_SEEN ══ sourced by the server ══► TASKS
               (atomic: first writer wins)       ($KV.SEEN.* → busscrape.tasks.<partition>)
    worker ─ $O.ARTIFACTS.{C,M}.… ─► OBJ_ARTIFACTS ─► ingester (claim checks)
    worker ─ busscrape.results.<task_key> ─► RESULTS ─► ingester
    anyone ─ busscrape.deadletter.<stage>.<task_key> ─► DEADLETTER ─► archivist
    server ─ $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TASKS.workers ─► TASK_ADVISORIES ─► reaper

The dispatcher never publishes to TASKS itself: a task enters TASKS only because its key was
newly created in SEEN, so "marked seen" and "queued" cannot come apart when it crashes.

TASKS has a bounded set of subjects, ``busscrape.tasks.<0..TASK_PARTITIONS-1>`` (the task id's
hash picks one), not one per task: nothing finds a task by its subject (workers pull the whole
stream, the reaper and dead letters go by sequence), and nats-server keeps an index entry per
subject per stream (the subject trees of SEEN and TASKS took ~440 B a queued task at 1M on 2.15,
SEEN's alone ~178 B: issue #19).

``Nats-Msg-Id`` values are built here too: every stream de-duplicates by them for its duplicate
window, so two places that must agree on one (the worker and the reaper filing the same dead
letter) take it from the same function. Each id costs the stream a de-duplication entry for
that window, so a publish that something else already makes idempotent carries none (the
dispatcher's SEEN creates).
"""

from __future__ import annotations

import base64

PREFIX = "busscrape"

# -- streams, consumers, buckets -----------------------------------------------------------

TASKS_STREAM = "TASKS"
RESULTS_STREAM = "RESULTS"
DEADLETTER_STREAM = "DEADLETTER"
ADVISORIES_STREAM = "TASK_ADVISORIES"

WORKERS_CONSUMER = "workers"
INGESTERS_CONSUMER = "ingesters"
REAPER_CONSUMER = "reaper"
ARCHIVIST_CONSUMER = "archivist"  # on DEADLETTER: the ingester archives every dead letter

SEEN_BUCKET = "SEEN"
ATTEMPTS_BUCKET = "ATTEMPTS"
STATUS_BUCKET = "STATUS"
ARTIFACTS_BUCKET = "ARTIFACTS"
FOLDERS_BUCKET = "FOLDERS"  # leases on archive folders while an ingester writes one
CRAWLS_BUCKET = "CRAWLS"  # crawl rules, page budgets, per-page link outcomes, cached robots.txt
HOSTS_BUCKET = "HOSTS"  # fleet-wide per-host slots and next start times (worker.fleet_gate)
COOLING_BUCKET = "COOLING"  # hosts cooling after a 429/503, for the whole fleet
SESSIONS_BUCKET = "SESSIONS"  # sessions' cookies and storage (worker.sessions)


def kv_stream(bucket: str) -> str:
    """The stream under a key-value bucket."""
    return f"KV_{bucket}"


def object_stream(bucket: str) -> str:
    """The stream under an object store."""
    return f"OBJ_{bucket}"


SEEN_STREAM = kv_stream(SEEN_BUCKET)
ATTEMPTS_STREAM = kv_stream(ATTEMPTS_BUCKET)
STATUS_STREAM = kv_stream(STATUS_BUCKET)
CRAWLS_STREAM = kv_stream(CRAWLS_BUCKET)
ARTIFACTS_STREAM = object_stream(ARTIFACTS_BUCKET)

# -- what each role needs on the server (``provision.require`` checks it at start) ----------------

Need = tuple[str, str]  # (kind, name) as in streams/*.toml: stream, consumer, kv, object_store

DISPATCH_NEEDS: frozenset[Need] = frozenset({("kv", SEEN_BUCKET), ("stream", TASKS_STREAM)})
WORKER_NEEDS: frozenset[Need] = frozenset({
    ("stream", TASKS_STREAM), ("consumer", WORKERS_CONSUMER), ("stream", RESULTS_STREAM),
    ("stream", DEADLETTER_STREAM), ("object_store", ARTIFACTS_BUCKET), ("kv", ATTEMPTS_BUCKET),
    ("kv", STATUS_BUCKET), ("stream", ADVISORIES_STREAM), ("consumer", REAPER_CONSUMER),
    ("kv", HOSTS_BUCKET), ("kv", COOLING_BUCKET), ("kv", SESSIONS_BUCKET)})
INGESTER_NEEDS: frozenset[Need] = frozenset({
    ("stream", RESULTS_STREAM), ("consumer", INGESTERS_CONSUMER), ("object_store", ARTIFACTS_BUCKET),
    ("stream", DEADLETTER_STREAM), ("consumer", ARCHIVIST_CONSUMER), ("kv", STATUS_BUCKET),
    ("kv", FOLDERS_BUCKET)})
HISTORY_NEEDS: frozenset[Need] = frozenset({("kv", STATUS_BUCKET), ("kv", SEEN_BUCKET)})
API_NEEDS: frozenset[Need] = DISPATCH_NEEDS | HISTORY_NEEDS
DLQ_READ_NEEDS: frozenset[Need] = frozenset({("stream", DEADLETTER_STREAM)})
DLQ_REPLAY_NEEDS: frozenset[Need] = DLQ_READ_NEEDS | {
    ("stream", TASKS_STREAM), ("kv", ATTEMPTS_BUCKET), ("kv", STATUS_BUCKET)}
REQUIRED: frozenset[Need] = (
    WORKER_NEEDS | INGESTER_NEEDS | DISPATCH_NEEDS | HISTORY_NEEDS | DLQ_REPLAY_NEEDS)
"""Everything busscrape relies on: a definitions folder must declare all of it."""


def stream_behind(name: str) -> str | None:
    """The stream that serves ``name`` (a stream, a key-value bucket, an object store), or None
    when busscrape has none by that name (``NATS``, ``S3``)."""
    kinds = {kind for kind, what in REQUIRED | {("kv", CRAWLS_BUCKET)} if what == name}
    if "object_store" in kinds:
        return object_stream(name)
    if "kv" in kinds:
        return kv_stream(name)
    return name if "stream" in kinds else None

# -- subjects -------------------------------------------------------------------------------

JS_API = "$JS.API"  # JetStream's API prefix (no domains here); for requests nats-py does not wrap
DEADLETTER_SUBJECTS = f"{PREFIX}.deadletter.>"
MAX_DELIVERIES_ADVISORY = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{TASKS_STREAM}.{WORKERS_CONSUMER}"
DEADLETTER_STAGES = ("dispatch", "worker", "reaper", "ingester")


def kv_subject(bucket: str, key: str) -> str:
    """The subject a key-value entry lives under (``key`` may be a wildcard such as ``<id>.>``)."""
    return f"$KV.{bucket}.{key}"


def seen_key_subject(task_key: str) -> str:
    """Where the dispatcher atomically creates a task (and so enqueues it)."""
    return kv_subject(SEEN_BUCKET, task_key)


TASK_PARTITIONS = 64
"""How many subjects TASKS spreads its tasks over (room for consumers that split the queue by
subject; each costs the server one index entry, not one per task)."""
TASK_SUBJECTS = f"{PREFIX}.tasks.>"
SEEN_TO_TASKS = (kv_subject(SEEN_BUCKET, "*"), f"{PREFIX}.tasks.{{{{partition({TASK_PARTITIONS},1)}}}}")
"""TASKS' source transform from SEEN (``streams/tasks.toml`` must say the same: a test checks)."""


def task_partition(task_key: str) -> int:
    """The partition nats-server's ``partition(n,1)`` transform gives a key: FNV-1a (32 bit) of
    the key's token, modulo n. Written out so a task published straight to TASKS (a dead-letter
    replay) lands where its sourced copy would."""
    h = 0x811C9DC5
    for byte in task_key.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % TASK_PARTITIONS


def task_subject(task_key: str) -> str:
    """The subject of a task in TASKS (what the SEEN source transform produces for it)."""
    return f"{PREFIX}.tasks.{task_partition(task_key)}"


def result_subject(task_key: str) -> str:
    return f"{PREFIX}.results.{task_key}"


def deadletter_subject(stage: str, task_key: str | None) -> str:
    """Dead letters are filed by the stage that gave up, then the task key (or ``unknown``)."""
    if stage not in DEADLETTER_STAGES:
        raise ValueError(f"unknown dead-letter stage {stage!r}")
    return f"{PREFIX}.deadletter.{stage}.{task_key or 'unknown'}"


def deadletter_stage_subjects(stage: str) -> str:
    """Every dead letter one stage filed (a filter for consumers and subject counts)."""
    if stage not in DEADLETTER_STAGES:
        raise ValueError(f"unknown dead-letter stage {stage!r}")
    return f"{PREFIX}.deadletter.{stage}.>"


def deadletter_stage_of(subject: str) -> str | None:
    """The stage token of a dead letter's subject (``None`` for a subject of another shape)."""
    parts = subject.split(".")
    return parts[2] if len(parts) >= 4 and parts[:2] == [PREFIX, "deadletter"] else None


def object_meta_subject(bucket: str, name: str) -> str:
    """An object's (rolled-up) meta message, in NATS's own object-store layout."""
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def object_metas(bucket: str) -> str:
    """Every meta message of an object store."""
    return f"$O.{bucket}.M.>"


def object_name_of(meta_subject: str) -> str:
    """The object name a meta subject stands for (the inverse of ``object_meta_subject``)."""
    return base64.urlsafe_b64decode(meta_subject.rsplit(".", 1)[-1]).decode()


def object_chunk_subject(bucket: str, nuid: str) -> str:
    """Where an object's chunks are (``nuid`` may be ``>`` for every chunk subject)."""
    return f"$O.{bucket}.C.{nuid}"


def direct_get_subject(stream: str) -> str:
    """JetStream's direct-get API of a stream (answered by any replica: see ``artifacts.store``)."""
    return f"{JS_API}.DIRECT.GET.{stream}"


def stream_info_subject(stream: str) -> str:
    return f"{JS_API}.STREAM.INFO.{stream}"


TASKS_ALL = f"{PREFIX}.tasks.>"


def ack_subject(stream: str, consumer: str, stream_seq: int, consumer_seq: int) -> str:
    """The ack reply subject of a delivery (v1 form), for acting on a delivery whose receiver
    died (``ops.in_flight``). The server checks that ``consumer_seq`` lies between the ack
    floor and the last delivery and that ``stream_seq`` is pending; the counts are advisory."""
    return f"$JS.ACK.{stream}.{consumer}.1.{stream_seq}.{consumer_seq}.0.0"


# -- headers --------------------------------------------------------------------------------

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
MSG_TTL = "Nats-TTL"
STREAM_SOURCE = "Nats-Stream-Source"
"""Set by nats-server on a sourced message: ``<source>[:<hash>] <seq> <filter> <transform> …`` (``bus.provision``)."""
ROLLUP = "Nats-Rollup"
TRACEPARENT = "traceparent"
KV_OPERATION = "KV-Operation"  # DEL / PURGE on a key-value delete marker
MARKER_REASON = "Nats-Marker-Reason"  # on the marker a per-message TTL leaves when a key expires


# -- message ids ----------------------------------------------------------------------------


def dispatch_msg_id(task_id: str, run_id: str) -> str:
    """One ``--force`` dispatch run's put of a task (a create needs none: see ``dispatcher``). Not
    the bare task id: TASKS de-duplicates *sourced* messages by this header for its whole window,
    which would swallow a later ``--force`` after SEEN had accepted it."""
    return f"{task_id}-{run_id}"


def result_msg_id(task_id: str, task_seq: int) -> str:
    """A queued task's result: every delivery of it publishes under the same id, so a redelivery
    after a lost ack finds the first one (a duplicate) instead of storing a second."""
    return f"result-{task_id}-{task_seq}"


def task_letter_id(task_id: str, task_seq: int) -> str:
    """The dead letter of one queued task (worker and reaper agree on it)."""
    return f"dead-task-{task_id}-{task_seq}"


def result_letter_id(task_id: str, task_seq: int, attempt: int) -> str:
    """The dead letter of one result (a redelivery files it only once)."""
    return f"dead-result-{task_id}-{task_seq}-{attempt}"


def poison_letter_id(stream: str, seq: int) -> str:
    """The dead letter of a message that could not be decoded, by where it was."""
    return f"poison-{stream}-{seq}"


def object_part_msg_id(nuid: str, part: int | str) -> str:
    """One message of an object put: ``p`` its placeholder meta, ``0…`` its chunks, ``m`` its
    meta. The put's NUID is its own, so a re-send after a lost PubAck is the only duplicate."""
    return f"obj-{nuid}-{part}"


def replay_msg_id(task_id: str, letter_seq: int) -> str:
    """A dead-letter replay: a replay re-run after a crash between PubAck and delete lands once,
    while replaying a task queued minutes earlier is not swallowed as a duplicate."""
    return f"replay-{task_id}-{letter_seq}"
