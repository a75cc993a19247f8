"""Every stream, subject, consumer, bucket and header name busscrape uses. Nowhere else.

The flow on the wire::

    dispatcher ─ create $KV.SEEN.<task_key> ─► KV_SEEN ══ sourced by the server ══► TASKS
               (atomic: first writer wins)            ($KV.SEEN.* → busscrape.tasks.*)
    worker ─ busscrape.results.<task_key> ─► RESULTS ─► ingester
    anyone ─ busscrape.deadletter.<stage>.<task_key> ─► DEADLETTER
    server ─ $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TASKS.workers ─► TASK_ADVISORIES ─► reaper

The dispatcher never publishes to TASKS itself: a task enters TASKS only because its key was
newly created in SEEN, so "marked seen" and "queued" cannot come apart when it crashes.
"""

from __future__ import annotations

PREFIX = "busscrape"

# Streams
TASKS_STREAM = "TASKS"
RESULTS_STREAM = "RESULTS"
DEADLETTER_STREAM = "DEADLETTER"
ADVISORIES_STREAM = "TASK_ADVISORIES"

# Subjects
TASKS_SUBJECTS = f"{PREFIX}.tasks.>"
RESULTS_SUBJECTS = f"{PREFIX}.results.>"
DEADLETTER_SUBJECTS = f"{PREFIX}.deadletter.>"

# Durable consumers
WORKERS_CONSUMER = "workers"
INGESTERS_CONSUMER = "ingesters"
REAPER_CONSUMER = "reaper"
ARCHIVIST_CONSUMER = "archivist"  # on DEADLETTER: the ingester archives every dead letter

# Key-value and object-store buckets
SEEN_BUCKET = "SEEN"
ATTEMPTS_BUCKET = "ATTEMPTS"
STATUS_BUCKET = "STATUS"
ARTIFACTS_BUCKET = "ARTIFACTS"

SEEN_STREAM = f"KV_{SEEN_BUCKET}"
ATTEMPTS_STREAM = f"KV_{ATTEMPTS_BUCKET}"
STATUS_STREAM = f"KV_{STATUS_BUCKET}"
ARTIFACTS_STREAM = f"OBJ_{ARTIFACTS_BUCKET}"

JS_API = "$JS.API"  # JetStream's API prefix (no domains here); for requests nats-py does not wrap

MAX_DELIVERIES_ADVISORY = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{TASKS_STREAM}.{WORKERS_CONSUMER}"

# Headers
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
MSG_TTL = "Nats-TTL"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SCHEMA = "Busscrape-Schema"  # message kind and version, for tools that peek without decoding

DEADLETTER_STAGES = ("dispatch", "worker", "reaper", "ingester")


def seen_key_subject(task_key: str) -> str:
    """Where the dispatcher atomically creates a task (and so enqueues it)."""
    return f"$KV.{SEEN_BUCKET}.{task_key}"


def kv_subject(bucket: str, key: str) -> str:
    """The subject a key-value entry lives under (``key`` may be a wildcard such as ``<id>.>``)."""
    return f"$KV.{bucket}.{key}"


def task_subject(task_key: str) -> str:
    """The subject of a task in TASKS (what the SEEN source transform produces)."""
    return f"{PREFIX}.tasks.{task_key}"


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
