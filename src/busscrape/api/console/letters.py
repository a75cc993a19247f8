"""The console's dead letters: listed by reason, one shown whole, replayed (one, or every letter of
a reason) after a confirmation page, with ``busscrape dlq``'s own ``DeadLetterQueue``: the same
selection (``LetterFilter``), the same replay (queue the task again, then delete the letter)."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from busscrape.api.answers import unavailable_as_503
from busscrape.api.console.guard import Refused
from busscrape.api.console.render import CONTEXT, page
from busscrape.deadletters.queue import DeadLetterQueue, Entry, LetterFilter, Outcome
from busscrape.model.messages import utcnow

if TYPE_CHECKING:
    from busscrape.api.server import ApiServer

SCANNED = 1000  # letters read for a listing (oldest first), as `busscrape status` samples its reasons
SHOWN = 200  # letters of the chosen reason listed
REPLAY_MAX = 10_000  # letters one "replay all of a reason" takes; the next click takes the rest


def _seq(text: str) -> int:
    if not text.isdigit() or len(text) > 18:  # JetStream sequences are 64-bit
        raise Refused(400, f"not a dead letter's sequence: {text[:40]!r}")
    return int(text)


class Letters:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.dlq = DeadLetterQueue(server.bus.js, request_timeout=server.settings.nats.request_timeout)

    async def _scan(self, flt: LetterFilter) -> list[Entry]:
        with unavailable_as_503("DEADLETTER"):
            async with contextlib.aclosing(self.dlq.scan(flt)) as entries:
                return [e async for e in entries]

    async def listing(self, request: web.Request) -> web.Response:
        reason = request.query.get("reason", "")
        sampled = await self._scan(LetterFilter(limit=SCANNED))
        reasons = Counter(e.reason for e in sampled)
        if reason:
            letters = [e for e in sampled if e.reason == reason][:SHOWN]
            if len(sampled) >= SCANNED and len(letters) < SHOWN:
                letters = await self._scan(LetterFilter(reasons=(_exact(reason),), limit=SHOWN))
        else:
            letters = sampled[:SHOWN]
        now = utcnow()
        rows = [e.summary(now) for e in letters]
        return page("deadletters.html", reasons=sorted(reasons.items(), key=lambda r: (-r[1], r[0])), reason=reason,
                    rows=rows, sampled=len(sampled), complete=len(sampled) < SCANNED, **request[CONTEXT])

    async def show(self, request: web.Request) -> web.Response:
        seq = _seq(request.match_info["seq"])
        with unavailable_as_503("DEADLETTER"):
            entry = await self.dlq.get(seq)
        if entry is None:
            raise Refused(404, f"no dead letter at seq {seq} (replayed, purged, or past the stream's max age)")
        letter = entry.letter
        body = letter.task or letter.result if letter is not None else None
        return page("deadletter.html", e=entry, summary=entry.summary(utcnow()), letter=letter,
                    why=entry.unreplayable(),
                    body=orjson.dumps(body.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode()
                    if body is not None else None, **request[CONTEXT])

    def _selection(self, params: Any) -> tuple[list[int], LetterFilter, str]:
        """What a replay form names: one ``seq``, or every letter of a ``reason``."""
        seq, reason = str(params.get("seq", "")), str(params.get("reason", ""))
        if seq:
            return [_seq(seq)], LetterFilter(), f"dead letter {_seq(seq)}"
        if reason:
            return [], LetterFilter(reasons=(_exact(reason),), limit=REPLAY_MAX), f"every letter of reason {reason}"
        raise Refused(400, "say which letters to replay: a seq, or a reason")

    async def confirm(self, request: web.Request) -> web.Response:
        seqs, flt, what = self._selection(request.query)
        with unavailable_as_503("DEADLETTER"):
            async with contextlib.aclosing(self.dlq.select(seqs, flt)) as found:
                selected = [(seq, e) for seq, e in [item async for item in found]]
        entries = [e for _, e in selected if e is not None]
        replayable = [e for e in entries if e.unreplayable() is None]
        return page("replay.html", what=what, seq=request.query.get("seq", ""),
                    reason=request.query.get("reason", ""), count=len(entries), replayable=len(replayable),
                    outcomes=None, **request[CONTEXT])

    async def replay(self, request: web.Request) -> web.Response:
        form = await request.post()
        seqs, flt, what = self._selection(form)
        outcomes: list[Outcome] = []
        with unavailable_as_503("DEADLETTER"):
            async with contextlib.aclosing(self.dlq.select(seqs, flt)) as found:
                async for seq, entry in found:
                    outcomes.append(Outcome(seq, "missing", "no dead letter at this sequence") if entry is None
                                    else await self.dlq.replay(entry))
        counts = Counter(o.action for o in outcomes)
        return page("replay.html", what=what, seq="", reason="", count=len(outcomes), replayable=counts["replayed"],
                    outcomes=[o.as_dict() for o in outcomes], counts=dict(counts), **request[CONTEXT])


def _exact(reason: str) -> str:
    """A reason as an exact match (``LetterFilter`` reads globs: ``*?[`` are escaped)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in reason)
