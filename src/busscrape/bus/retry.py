"""The two rules every retry in busscrape follows: what counts as a passing NATS failure, and
how long to wait before the next try.

``TRANSIENT`` is what a request to NATS raises while a server restarts, a leader moves or a
connection is re-established: nats-py's own errors, JetStream's API errors, a socket error, a
timeout. Code that retries later catches exactly this, so no call site forgets one of them.

``backoff`` is the one delay curve: ``base`` doubling per attempt up to ``cap``, with jitter
(half to all of it) so that work that failed together does not come back together, and never
shorter than what the other side asked for (``Retry-After``), itself capped.

``patiently`` is how a request a daemon cannot do without (its start-up checks) rides out a
moment without a leader: it retries the ``passing`` failures for a bounded time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
import structlog

log = structlog.get_logger("busscrape.bus")
T = TypeVar("T")

TRANSIENT: tuple[type[BaseException], ...] = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)
"""A NATS request that may succeed when tried again (``except TRANSIENT``). A message too large
for NATS is not one: the connection ``bus.connection`` makes raises ``PayloadTooLarge`` (a
``PermanentError``) instead of nats-py's ``MaxPayloadError`` or JetStream's error 10054
(``bus.payloads``)."""


def transient_or(*errors: type[BaseException]) -> tuple[type[BaseException], ...]:
    """``TRANSIENT`` and ``errors``, for one ``except`` that catches both: written as a tuple
    display with ``*TRANSIENT`` in it, the classes are lost to mypy (python/mypy#21092's kind)."""
    return (*errors, *TRANSIENT)


def backoff(attempt: int, base: float, cap: float, *, at_least: float | None = None) -> float:
    """Seconds to wait after the ``attempt``-th failure (1 = the first)."""
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 30))
    delay = random.uniform(ceiling / 2, ceiling)
    if at_least is not None:
        delay = max(delay, min(at_least, cap))
    return delay


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure that goes away by itself (a timeout, a lost connection, a
    stream with no leader for a moment: 503), as opposed to an answer (not found, bad request)."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return True  # 503: the stream or consumer has no leader this moment
    if isinstance(exc, nats.js.errors.APIError):
        return (exc.code or 0) >= 500
    if isinstance(exc, nats.errors.NoRespondersError):
        return False  # nothing serves JetStream on this server: waiting will not change that
    return isinstance(exc, TRANSIENT)


async def patiently(call: Callable[[], Awaitable[T]], *, within: float = 60.0, what: str = "") -> T:
    """``await call()``, again while it fails in ``passing`` ways, for at most ``within`` seconds.

    For start-up checks and other requests a daemon cannot do without: a JetStream cluster that
    is electing a leader (a node just restarted) answers them a few seconds later, and a daemon
    started in that moment must wait for it, not exit.
    """
    deadline = time.monotonic() + within
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            attempt += 1
            if not passing(exc) or time.monotonic() >= deadline:
                raise
            log.info("nats.waiting", what=what, error=repr(exc), attempt=attempt)
            await asyncio.sleep(min(backoff(attempt, 0.5, 5.0), max(deadline - time.monotonic(), 0.05)))
