"""``busscrape streams apply|show``: make the server hold what ``streams/`` declares.

``plan`` compares each definition with the live configuration, field by field (only the
fields the definition names: everything else is left as the server has it). ``apply``
creates what is missing, updates what differs and leaves the rest, so a second run changes
nothing. Changes JetStream cannot make (a stream's retention or storage, a consumer's
deliver or ack policy) are conflicts: nothing is touched and the message says what to do.
Services call ``require`` at start to say the same when something is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Set
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, cast

import nats.js.errors
from nats.js import JetStreamContext, api

from busscrape.bus import compat
from busscrape.bus.resuming import Resumed, drop_twice_sourced
from busscrape.bus.retry import patiently
from busscrape.bus.topology import Definition
from busscrape.errors import StreamConflict, StreamsMissing
from busscrape.units import format_duration

Action = Literal["create", "update", "unchanged", "conflict", "recreate"]

# Fields JetStream refuses to change in place.
IMMUTABLE_STREAM = {"retention", "storage", "name"}
IMMUTABLE_CONSUMER = {"deliver_policy", "ack_policy", "replay_policy", "opt_start_seq", "opt_start_time",
                      "durable_name", "deliver_subject", "flow_control", "headers_only"}
_DURATION_FIELDS = {"max_age", "duplicate_window", "ack_wait", "inactive_threshold", "idle_heartbeat"}


@dataclass
class FieldChange:
    field: str
    live: Any
    desired: Any

    def describe(self) -> str:
        return f"{self.field}: {_show(self.field, self.live)} -> {_show(self.field, self.desired)}"


@dataclass
class Change:
    definition: Definition
    action: Action
    fields: list[FieldChange] = field(default_factory=list)
    message: str = ""


def _show(name: str, value: Any) -> str:
    if value is None:
        return "unset"
    if name in _DURATION_FIELDS and isinstance(value, int | float):
        return format_duration(value)
    if name == "backoff" and isinstance(value, list):
        return "[" + ", ".join(format_duration(v) for v in value) + "]"
    return str(value)


def _normal(value: Any) -> Any:
    """Comparable form of a config value (enums as strings, sources as plain dicts)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, api.StreamSource):
        transforms = [{"src": t.src, "dest": t.dest} for t in (value.subject_transforms or [])]
        return {"name": value.name, "filter_subject": value.filter_subject or None,
                "subject_transforms": transforms}
    if isinstance(value, dict) and "name" in value and ("subject_transforms" in value or "filter_subject" in value):
        return {"name": value["name"], "filter_subject": value.get("filter_subject") or None,
                "subject_transforms": [dict(t) for t in value.get("subject_transforms", [])]}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def _same(name: str, live: Any, desired: Any) -> bool:
    live, desired = _normal(live), _normal(desired)
    if name == "backoff":
        live, desired = live or [], desired or []
        return len(live) == len(desired) and all(
            math.isclose(a, b, rel_tol=1e-6) for a, b in zip(live, desired, strict=True)
        )
    if isinstance(live, int | float) and isinstance(desired, int | float) and not isinstance(live, bool):
        return math.isclose(live, desired, rel_tol=1e-6, abs_tol=1e-6)
    if name == "subjects":
        return sorted(live or []) == sorted(desired or [])
    return bool(live == desired)


def _diff(desired: dict[str, Any], live_config: Any) -> list[FieldChange]:
    changes = []
    for name, want in desired.items():
        have = getattr(live_config, name, None)
        if not _same(name, have, want):
            changes.append(FieldChange(name, _normal(have), _normal(want)))
    return changes


async def _live_stream(js: JetStreamContext, name: str) -> api.StreamInfo | None:
    try:
        return await patiently(lambda: js.stream_info(name), what=f"stream {name}")
    except nats.js.errors.NotFoundError:
        return None


async def _live_consumer(js: JetStreamContext, stream: str, name: str) -> api.ConsumerInfo | None:
    try:
        return await patiently(lambda: js.consumer_info(stream, name), what=f"consumer {stream}/{name}")
    except nats.js.errors.NotFoundError:
        return None


async def plan(js: JetStreamContext, definitions: list[Definition]) -> list[Change]:
    """What ``apply`` would do, without doing it."""
    changes = []
    for d in definitions:
        if d.kind == "consumer":
            info = await _live_consumer(js, d.stream, d.name)
            if info is None:
                changes.append(Change(d, "create"))
                continue
            changes.append(_classify(d, _diff(d.managed, info.config), IMMUTABLE_CONSUMER))
        else:
            stream = await _live_stream(js, d.stream)
            if stream is None:
                changes.append(Change(d, "create"))
                continue
            changes.append(_classify(d, _diff(d.managed, stream.config), IMMUTABLE_STREAM))
    return changes


def _classify(d: Definition, diff: list[FieldChange], immutable: set[str]) -> Change:
    if not diff:
        return Change(d, "unchanged")
    frozen = [c for c in diff if c.field in immutable]
    if frozen:
        what = "; ".join(c.describe() for c in frozen)
        return Change(d, "conflict", diff, (
            f"{d.label}: JetStream cannot change {', '.join(c.field for c in frozen)} in place ({what}). "
            f"Either put the live value back in {d.file.name}, or drain it and run "
            f"`busscrape streams apply --recreate {d.name}` (deletes it and everything in it, then creates it anew)"
        ))
    return Change(d, "update", diff)


async def apply(
    js: JetStreamContext,
    definitions: list[Definition],
    *,
    dry_run: bool = False,
    recreate: frozenset[str] = frozenset(),
) -> list[Change]:
    """Create what is missing, update what differs. Raises ``StreamConflict`` on a conflict.

    Conflicts are found before anything is changed, so a refused apply leaves the server as
    it was. ``recreate`` names definitions to delete and create anew instead.
    """
    changes = await plan(js, definitions)
    for change in changes:
        if change.action == "conflict" and change.definition.name in recreate:
            change.action = "recreate"
    conflicts = [c for c in changes if c.action == "conflict"]
    if conflicts:
        raise StreamConflict("\n".join(c.message for c in conflicts))
    if dry_run:
        return changes
    recreated = any(c.action == "recreate" for c in changes)
    await _execute_all(js, changes)
    if recreated:
        # Deleting a stream deletes its consumers too: create them again.
        await _execute_all(js, [c for c in await plan(js, definitions) if c.action == "create"])
    return changes


async def _execute_all(js: JetStreamContext, changes: list[Change]) -> None:
    for change in changes:
        try:
            await _execute(js, change)
        except nats.js.errors.APIError as exc:
            raise StreamConflict(
                f"{change.definition.label}: the server refused to {change.action} it: {exc.description} "
                f"(err_code {exc.err_code}); see {change.definition.file}"
            ) from None


async def _execute(js: JetStreamContext, change: Change) -> None:
    d = change.definition
    if change.action == "unchanged":
        return
    if change.action == "recreate":
        if d.kind == "consumer":
            await js.delete_consumer(d.stream, d.name)
        else:
            await js.delete_stream(d.stream)
        change.action = "create"
    if d.kind == "consumer":
        config = cast(api.ConsumerConfig, d.create)
        if change.action == "update":
            config = _with_desired((await js.consumer_info(d.stream, d.name)).config, d)
        await js.add_consumer(d.stream, config)
    elif change.action == "create":
        if d.kind == "kv":
            # What the bucket API cannot say (``topology.STREAM_ONLY``: compression) must be there
            # when the stream is made: the file store takes its compression then, and an update
            # only changes the configuration (measured: SEEN stayed uncompressed on disk). So the
            # bucket's stream is made once, with the bucket's conventions and this. (It used to be
            # made, then deleted and made again: a daemon already waiting for the bucket could
            # write in between, and its record went with the deleted stream.)
            await compat.create_key_value_as(js, cast(api.KeyValueConfig, d.create),
                                             lambda made: cast(api.StreamConfig, _with_desired(made, d)))
        elif d.kind == "object_store":
            await js.create_object_store(d.name, config=cast(api.ObjectStoreConfig, d.create))
            # Its duplicate window (``STREAM_ONLY``), which an update can set on the empty stream.
            live = (await js.stream_info(d.stream)).config
            if _diff(d.managed, live):
                await js.update_stream(_with_desired(live, d))
        else:
            await js.add_stream(cast(api.StreamConfig, d.create))
    else:
        info = await js.stream_info(d.stream)
        updated, resumed = await _resuming_sources(js, info, _with_desired(info.config, d))
        await js.update_stream(updated)
        if resumed:
            await drop_twice_sourced(js, d.stream, resumed)


QUIET = 1.0
"""Seconds a source stream must take no message before a changed source may start after its end."""


async def _resuming_sources(js: JetStreamContext, live: api.StreamInfo,
                            config: api.StreamConfig) -> tuple[api.StreamConfig, dict[str, Resumed]]:
    """``config`` with each changed source starting right after what its old form sourced.

    nats-server keys a source's progress by its filter and transforms: one whose transforms
    change (TASKS' from SEEN, issue #19) is a new source to it, and would start again from the
    first message of its stream, queueing every task SEEN remembers a second time. Where the old
    form stopped is exact only while nothing writes the source stream, so the change is refused
    unless the source has been quiet for ``QUIET`` and is fully sourced (lag 0). A source that
    does not change keeps its live start (a start set here must survive later applies).

    A write to the source between that check and the update's taking effect is sourced by the
    old form, then by the new one (it starts right after the check): ``bus.resuming`` removes
    the old form's copy. Also returned: by changed source, where the stream and the source were
    at the check (the copies can only be after it).
    """
    stream = cast(str, live.config.name)  # nats-py's StreamConfig has it optional; a live stream's is set
    old = {s.name: s for s in live.config.sources or ()}
    sources = []
    resumed: dict[str, Resumed] = {}
    for source in config.sources or ():
        before = old.get(source.name)
        if before is None or _normal(before) == _normal(source):
            sources.append(before or source)
            continue
        first = (await js.stream_info(source.name)).state.last_seq
        await asyncio.sleep(QUIET)
        infos = (await js.stream_info(stream)).sources or ()
        lag = next((i.lag for i in infos if i.name == source.name), None)
        last = (await js.stream_info(source.name)).state.last_seq
        if lag != 0 or first != last:
            raise StreamConflict(
                f"stream {live.config.name}: its source {source.name} changes form (filter or transforms), "
                f"which restarts it; it may start only after all {source.name} holds, and that is known only "
                f"while nothing is written to it (lag {lag}, {last - first} new messages in {QUIET:g}s). "
                "Stop dispatchers, crawls and `busscrape run`, then apply again")
        sources.append(dataclasses.replace(source, opt_start_seq=last + 1))
        transforms = source.subject_transforms or ()
        resumed[source.name] = Resumed((await js.stream_info(stream)).state.last_seq, last,
                                        transforms[0].dest if transforms else "")
    return (config.evolve(sources=sources) if sources else config), resumed


def _with_desired(live: Any, d: Definition) -> Any:
    """The live config with the managed fields replaced by their desired values."""
    return live.evolve(**{name: getattr(d.config, name) for name in d.managed})


async def require(js: JetStreamContext, definitions: list[Definition], needed: Set[tuple[str, str]], *,
                  wait: float = 0.0) -> None:
    """Raise ``StreamsMissing`` naming every needed stream/consumer/bucket that is absent.

    ``needed`` holds ``(kind, name)`` pairs, one of the ``*_NEEDS`` sets in ``names``. With
    ``wait``, ask again until they are all there or that many seconds have passed (a daemon
    that ``busscrape run`` started while it was still applying them).
    """
    deadline = time.monotonic() + wait
    while missing := await _missing(js, definitions, needed):
        if time.monotonic() >= deadline:
            raise StreamsMissing(
                f"missing on the NATS server: {', '.join(missing)}. Run `busscrape streams apply` against the "
                "same server (BUSSCRAPE_NATS__URL) to create every stream, consumer and bucket busscrape needs"
            )
        await asyncio.sleep(0.05)


async def _missing(js: JetStreamContext, definitions: list[Definition], needed: Set[tuple[str, str]]) -> list[str]:
    missing = []
    for d in definitions:
        if (d.kind, d.name) not in needed:
            continue
        if d.kind == "consumer":
            present = await _live_consumer(js, d.stream, d.name) is not None
        else:
            present = await _live_stream(js, d.stream) is not None
        if not present:
            missing.append(d.label)
    return missing


@dataclass
class Live:
    """One definition as the server has it now."""

    definition: Definition
    exists: bool
    config: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


async def show(js: JetStreamContext, definitions: list[Definition]) -> list[Live]:
    """Live configuration (the managed fields) and counts of every definition."""
    out = []
    for d in definitions:
        if d.kind == "consumer":
            info = await _live_consumer(js, d.stream, d.name)
            if info is None:
                out.append(Live(d, False))
                continue
            config = {k: _normal(getattr(info.config, k, None)) for k in d.managed}
            counts = {"pending": info.num_pending or 0, "ack_pending": info.num_ack_pending or 0,
                      "redelivered": info.num_redelivered or 0, "waiting": info.num_waiting or 0}
            out.append(Live(d, True, config, counts))
        else:
            sinfo = await _live_stream(js, d.stream)
            if sinfo is None:
                out.append(Live(d, False))
                continue
            config = {k: _normal(getattr(sinfo.config, k, None)) for k in d.managed}
            counts = {"messages": sinfo.state.messages, "bytes": sinfo.state.bytes,
                      "consumers": sinfo.state.consumer_count}
            out.append(Live(d, True, config, counts))
    return out
