"""After a source of a stream changed form (``bus.provision._resuming_sources``): the messages
written to the source while the change took effect, sourced twice, are queued once.

The change is made when the source was quiet, starting the new form right after what the old
one took; a write between that check and the update's taking effect is taken by the old form
and then, again, by the new one. Nothing can stop writers between two requests, so the second
copy is found afterwards and deleted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats.js.errors
import structlog
from nats.js import JetStreamContext

from busscrape.bus import names
from busscrape.bus.scan import remove

log = structlog.get_logger("busscrape.streams")

SOURCED_WAIT = 30.0
"""Seconds ``_drop_twice_sourced`` waits for a resumed source's new form to take the window."""


@dataclass(frozen=True)
class Resumed:
    """A source whose form changed: the target's last sequence and the source's at the check,
    and the transform destination of its new form (how its copies are told from the old's)."""

    stream_last: int
    source_last: int
    dest: str


async def drop_twice_sourced(js: JetStreamContext, stream: str, resumed: dict[str, Resumed]) -> None:
    """Delete the old form's copy of each source message ``stream`` took twice: written to the
    source between the check and the update, it was sourced by the old form and, the new one
    starting after the check, again by the new one.

    nats-server names where a sourced message came from in its ``Nats-Stream-Source`` header
    (``<source>[:<hash>] <seq> <filter> <transform dest> …``). The messages of the window are
    those the source holds now beyond the check: once the new form took each of them (or it
    left the source, or ``SOURCED_WAIT`` passed), the old form's copies of them go."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SOURCED_WAIT
    window = {name: (r.source_last, (await js.stream_info(name)).state.last_seq) for name, r in resumed.items()}
    while True:
        copies = await _copies(js, stream, resumed, window)
        if await _taken(js, resumed, window, copies) or loop.time() > deadline:
            break
        await asyncio.sleep(0.1)
    for (name, seq), forms in copies.items():
        if len(forms) > 1:
            for _, at in [f for f in forms if f[0] != resumed[name].dest][: len(forms) - 1]:
                await remove(js, stream, at)
                log.warning("streams.twice_sourced_dropped", stream=stream, source=name, source_seq=seq, seq=at)


async def _taken(js: JetStreamContext, resumed: dict[str, Resumed], window: dict[str, tuple[int, int]],
                 copies: dict[tuple[str, int], list[tuple[str, int]]]) -> bool:
    """Whether the new form took every message of the window the source still holds."""
    for name, (first, last) in window.items():
        for seq in range(first + 1, last + 1):
            if all(dest != resumed[name].dest for dest, _ in copies.get((name, seq), ())) and \
                    await _holds(js, name, seq):
                return False
    return True


async def _holds(js: JetStreamContext, stream: str, seq: int) -> bool:
    try:
        await js.get_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def _copies(js: JetStreamContext, stream: str, resumed: dict[str, Resumed],
                  window: dict[str, tuple[int, int]]) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """The window's messages found in ``stream`` since the check: (source, seq) → [(dest, seq in stream)]."""
    found: dict[tuple[str, int], list[tuple[str, int]]] = {}
    last = (await js.stream_info(stream)).state.last_seq
    for at in range(min(r.stream_last for r in resumed.values()) + 1, last + 1):
        try:
            msg = await js.get_msg(stream, at)
        except nats.js.errors.NotFoundError:
            continue  # acked (work queue) or deleted
        parts = (msg.headers or {}).get(names.STREAM_SOURCE, "").split(" ")
        name = parts[0].split(":")[0]
        if len(parts) < 4 or name not in window or not parts[1].isdigit():
            continue
        seq = int(parts[1])
        if window[name][0] < seq <= window[name][1]:
            found.setdefault((name, seq), []).append((parts[3], at))
    return found
