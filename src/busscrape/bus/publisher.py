"""Pipelined JetStream publishing: many publishes in flight, each one confirmed by its PubAck.

nats-py's ``js.publish_async`` allocates a future, a NUID token and a done-callback per message
and never gives up on a lost ack. ``Publisher`` keeps the same idea with less per message:

- ONE wildcard inbox subscription (``<inbox>.*``); each publish carries ``reply=<inbox>.<n>``
  and a table maps ``n`` to the pending ``Publication``;
- a bounded window (``window`` publishes awaiting their PubAck), so memory and the server's
  backlog stay bounded whatever the input size;
- a deadline per attempt (``timeout``), checked by one sweeper task in deadline order, and a
  bounded number of retries with exponential backoff for what can succeed later: no PubAck
  in time, ``503 no responders`` (stream leader moving, server restarting) and 5xx answers —
  ``retries`` of them, and as many more as fit in ``outage_wait`` seconds from the first send
  (an election on a cluster outlasts a few quick retries: waited out, it costs time, not the
  message);
- nothing counts as done until the PubAck (or a final error) arrived.

A retry reuses the reply token, so a late PubAck of an earlier attempt still settles the
publication: the first answer wins. A retried publish may therefore have landed twice unless
the caller makes it idempotent (``Nats-Msg-Id`` or an expected-sequence header); the outcome
reports ``attempts`` so the caller can tell a first answer from a possibly-ambiguous one.

Two ways in: ``submit`` (returns once the message is sent; a callback receives the outcome,
which is what a million-message dispatch wants) and ``publish`` (awaits the PubAck, which is
what a worker publishing one result wants).

Headers are a dict, or a header block the caller encoded itself (``bytes``: ``NATS/1.0\r\n``,
``Name: value\r\n`` lines, a blank line). nats-py validates and encodes a headers dict on every
publish, about 11 µs for the dispatcher's four headers, as much as the rest of the send; a caller
whose headers are mostly fixed can build the block from a prepared prefix for a fraction of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import orjson
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import PubAck

from busscrape.bus.compat import publish_encoded
from busscrape.bus.payloads import MESSAGE_TOO_LARGE
from busscrape.bus.retry import TRANSIENT, backoff
from busscrape.errors import PayloadTooLarge, RetryableError, said

log = structlog.get_logger("busscrape.publisher")

WRONG_LAST_SEQUENCE = 10071
"""JetStream's err_code when ``Nats-Expected-Last-Subject-Sequence`` does not hold."""
STREAM_FULL = frozenset({10077, 10047})
"""JetStream's err_codes when a stream with ``discard: new`` is at its limits ("maximum bytes / messages
exceeded") or the server is out of resources: retrying at once cannot help; the publisher gives up
at once and the caller waits for room (back-pressure)."""

_NO_RESPONDERS = "503"
NO_ANSWER = 408
"""``PublishFailed.code`` when no PubAck came in time (after every retry)."""
ABANDONED = 499
"""``PublishFailed.code`` when the publisher closed first: the message may or may not have landed."""


BACKOFF = 0.25
"""Seconds before the first re-send (doubling for each next one, up to ``MAX_BACKOFF``)."""
MAX_BACKOFF = 5.0


def resend_span(timeout: float, retries: int, base: float = BACKOFF, cap: float = MAX_BACKOFF) -> float:
    """The longest a publication may go on being re-sent after its first send: every attempt
    timed out and each re-send waited its longest backoff (a de-duplication window must outlast it)."""
    waits: float = sum(min(cap, base * 2 ** (attempt - 1)) for attempt in range(1, retries + 1))
    return timeout * (retries + 1) + waits


class PublishFailed(RetryableError):
    """JetStream refused a publish, or no PubAck came within the retries.

    ``code`` is the HTTP-like status (400, 503 …; 408 for "no answer"), ``err_code`` the
    JetStream error code when the server sent one (10071 = wrong last sequence).
    """

    reason = "publish_failed"

    def __init__(self, description: str, *, code: int, err_code: int | None = None, retryable: bool = False):
        super().__init__(description)
        self.description = description
        self.code = code
        self.err_code = err_code
        self.retryable = retryable

    @property
    def full(self) -> bool:
        """The stream is at its limits (back-pressure, not a failure of the message)."""
        return self.err_code in STREAM_FULL

    @property
    def answered(self) -> bool:
        """JetStream answered with an error: the message was not stored. Otherwise (no PubAck in
        time, the connection lost, no responders) the outcome is unknown: it may be stored."""
        return self.err_code is not None or (self.code < 500 and self.code not in (NO_ANSWER, ABANDONED))


@dataclass(slots=True, eq=False)
class Publication:
    """One message on its way: what was sent, how often, and how it ended."""

    subject: str
    payload: bytes
    headers: dict[str, str] | bytes | None
    """A dict, or an encoded header block (see the module's docstring)."""
    on_done: Callable[[Publication], None] | None
    context: Any = None
    """Whatever the caller wants back in ``on_done`` (a task id, a counter key …)."""
    token: str = ""
    attempts: int = 0
    first_sent: float = 0.0
    """When the first attempt was sent (monotonic clock): ``outage_wait`` counts from there."""
    deadline: float = 0.0
    """When the current attempt times out (monotonic clock)."""
    ack: PubAck | None = None
    error: PublishFailed | None = None

    @property
    def done(self) -> bool:
        return self.ack is not None or self.error is not None


class Publisher:
    """Publishes to JetStream with a bounded window of unacknowledged messages.

    ``async with Publisher(nc, window=4096, timeout=10, retries=3) as pub: ...``; leaving the
    block waits for what is still in flight (each publication ends by itself, at the latest when
    its retries are spent), or at most ``close_timeout`` seconds when that is set.
    """

    def __init__(
        self,
        nc: NATS,
        *,
        window: int = 4096,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        close_timeout: float | None = None,
        outage_wait: float = 0.0,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.nc = nc
        self.window = window
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.close_timeout = close_timeout
        self.outage_wait = outage_wait
        self._slots = asyncio.Semaphore(window)
        # Awaiting an answer, in send order, which is deadline order (one timeout for all): the
        # sweeper reads from the front and stops at the first that is not overdue.
        self._pending: dict[str, Publication] = {}
        # Failed an attempt, waiting out the backoff before the next (a late PubAck still counts).
        self._resting: dict[str, Publication] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._prefix = ""
        self._next = 0
        self._sub: Any = None
        self._sweeper: asyncio.Task[None] | None = None
        self._retrying: set[asyncio.Task[None]] = set()
        self._entered = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Publisher:
        if self._entered:
            raise RuntimeError("a Publisher can be entered only once")
        self._entered = True
        self._prefix = self.nc.new_inbox() + "."
        # Room for every ack of a full window, so a slow consumer of acks never drops one.
        self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_reply,
                                            pending_msgs_limit=max(self.window * 4, 65536))
        self._sweeper = asyncio.create_task(self._sweep(), name="publisher-sweeper")
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.close_timeout):
                    await self.wait()
        await self.close()

    async def close(self) -> None:
        """Stop now: whatever is still unconfirmed fails with ``ABANDONED``; ``submit`` refuses."""
        self._closed = True
        for task in [*self._retrying, *([self._sweeper] if self._sweeper else [])]:
            task.cancel()
        await asyncio.gather(*self._retrying, *([self._sweeper] if self._sweeper else []), return_exceptions=True)
        self._sweeper = None
        for pub in [*self._pending.values(), *self._resting.values()]:
            self._finish(pub, error=PublishFailed("abandoned before its PubAck arrived", code=ABANDONED,
                                                  retryable=True))
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    @property
    def in_flight(self) -> int:
        """Publications sent (or waiting to be re-sent) whose outcome is not known yet."""
        return len(self._pending) + len(self._resting)

    async def wait(self) -> None:
        """Wait until nothing is in flight (every publication ends: PubAck, error, or retries spent)."""
        await self._idle.wait()

    # -- publishing ---------------------------------------------------------------------------

    async def submit(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | bytes | None = None,
        on_done: Callable[[Publication], None] | None = None,
        context: Any = None,
    ) -> Publication:
        """Send once a window slot is free; ``on_done(publication)`` runs when it is settled.

        Raises ``PublishFailed`` with code ``ABANDONED`` (nothing sent) once the publisher is closed,
        also to a caller that was waiting for a slot.
        """
        if self._sub is None and not self._closed:
            raise RuntimeError("the Publisher is not open (use `async with`)")
        await self._slots.acquire()
        if self._closed:
            self._slots.release()
            raise PublishFailed("the publisher is closed", code=ABANDONED)
        self._next += 1
        pub = Publication(subject, payload, headers, on_done, context, token=self._prefix + str(self._next))
        self._idle.clear()
        await self._send(pub)
        return pub

    async def send(self, subject: str, payload: bytes,
                   headers: dict[str, str] | bytes | None = None) -> asyncio.Future[Publication]:
        """Send once a window slot is free; the returned future resolves to the settled
        publication (its ``ack`` or its ``error``), so many can be sent before any is awaited."""
        settled: asyncio.Future[Publication] = asyncio.get_running_loop().create_future()

        def done(pub: Publication) -> None:
            if not settled.done():
                settled.set_result(pub)

        await self.submit(subject, payload, headers, done)
        return settled

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | bytes | None = None) -> PubAck:
        """Publish one message and wait for its PubAck; raises ``PublishFailed``."""
        pub = await (await self.send(subject, payload, headers))
        if pub.error is not None:
            raise pub.error
        assert pub.ack is not None
        return pub.ack

    async def _send(self, pub: Publication) -> None:
        pub.attempts += 1
        now = time.monotonic()
        pub.first_sent = pub.first_sent or now
        pub.deadline = now + self.timeout
        self._resting.pop(pub.token, None)
        self._pending[pub.token] = pub
        try:
            if isinstance(pub.headers, bytes):
                await publish_encoded(self.nc, pub.subject, pub.payload, pub.token, pub.headers)
            else:
                await self.nc.publish(pub.subject, pub.payload, reply=pub.token, headers=pub.headers)
        except nats.errors.ConnectionClosedError:
            self._finish(pub, error=PublishFailed("the NATS connection is closed", code=ABANDONED))
        except PayloadTooLarge as exc:  # never sent: another try is the same size
            self._finish(pub, error=PublishFailed(str(exc), code=413, err_code=MESSAGE_TOO_LARGE))
        except TRANSIENT as exc:
            # Outbound buffer full while reconnecting, and the like: worth another try.
            self._failed_attempt(pub, PublishFailed(f"could not send: {said(exc)}",
                                                    code=503, retryable=True))

    # -- outcomes -----------------------------------------------------------------------------

    async def _on_reply(self, msg: Msg) -> None:
        pub = self._pending.get(msg.subject) or self._resting.get(msg.subject)
        if pub is None:
            return  # a late answer for something already settled
        headers = msg.headers
        if headers and headers.get("Status") == _NO_RESPONDERS:
            self._failed_attempt(pub, PublishFailed(f"no stream answers on {pub.subject} (503 no responders)",
                                                    code=503, retryable=True))
            return
        try:
            doc = orjson.loads(msg.data)
            error = doc.get("error")
        except (orjson.JSONDecodeError, AttributeError):
            self._failed_attempt(pub, PublishFailed(f"unreadable PubAck {msg.data[:80]!r}", code=502, retryable=True))
            return
        if error:
            code = int(error.get("code") or 500)
            failure = PublishFailed(str(error.get("description") or "JetStream error"), code=code,
                                    err_code=error.get("err_code"),
                                    retryable=code >= 500 and error.get("err_code") not in STREAM_FULL)
            self._failed_attempt(pub, failure)
            return
        self._finish(pub, ack=PubAck(stream=doc.get("stream", ""), seq=doc.get("seq", 0),
                                     duplicate=doc.get("duplicate")))

    def _failed_attempt(self, pub: Publication, failure: PublishFailed) -> None:
        if self._pending.pop(pub.token, None) is None:
            return  # not awaiting an answer: this attempt already failed (a late answer after its timeout)
        spent = pub.attempts > self.retries and time.monotonic() - pub.first_sent >= self.outage_wait
        if not failure.retryable or spent:
            if failure.retryable:
                failure.description = failure.message = f"{failure.description} (after {pub.attempts} attempts)"
            self._finish(pub, error=failure)
            return
        self._resting[pub.token] = pub
        delay = backoff(pub.attempts, self.backoff, self.max_backoff)
        task = asyncio.create_task(self._resend(pub, delay))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _resend(self, pub: Publication, delay: float) -> None:
        await asyncio.sleep(delay)
        if not pub.done:
            log.debug("publish.retry", subject=pub.subject, attempt=pub.attempts + 1)
            await self._send(pub)

    def _finish(self, pub: Publication, *, ack: PubAck | None = None, error: PublishFailed | None = None) -> None:
        if pub.done:
            return
        pub.ack, pub.error = ack, error
        self._pending.pop(pub.token, None)
        self._resting.pop(pub.token, None)
        self._slots.release()
        if not self._pending and not self._resting:
            self._idle.set()
        if pub.on_done is not None:
            try:
                pub.on_done(pub)
            except Exception:  # a caller's bug must not take the ack path down with it
                log.exception("publish.callback_failed", subject=pub.subject)

    async def _sweep(self) -> None:
        """Time out attempts whose PubAck is overdue (oldest first; stops at the first not yet due)."""
        tick = min(max(self.timeout / 10, 0.01), 0.25)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            overdue = []
            for pub in self._pending.values():
                if pub.deadline > now:
                    break
                overdue.append(pub)
            for pub in overdue:
                self._failed_attempt(pub, PublishFailed(
                    f"no PubAck within {_seconds(self.timeout)}", code=NO_ANSWER, retryable=True))


def _seconds(value: float) -> str:
    return f"{value:g}s" if math.isfinite(value) else "ever"
