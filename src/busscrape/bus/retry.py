"""The two rules every retry in busscrape follows: what counts as a passing NATS failure, and
how long to wait before the next try.

``TRANSIENT`` is what a request to NATS raises while a server restarts, a leader moves or a
connection is re-established: nats-py's own errors, JetStream's API errors, a socket error, a
timeout. Code that retries later catches exactly this, so no call site forgets one of them.

``backoff`` is the one delay curve: ``base`` doubling per attempt up to ``cap``, with jitter
(half to all of it) so that work that failed together does not come back together, and never
shorter than what the other side asked for (``Retry-After``), itself capped.
"""

from __future__ import annotations

import random

import nats.errors
import nats.js.errors

TRANSIENT: tuple[type[BaseException], ...] = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)
"""A NATS request that may succeed when tried again (``except TRANSIENT``)."""


def backoff(attempt: int, base: float, cap: float, *, at_least: float | None = None) -> float:
    """Seconds to wait after the ``attempt``-th failure (1 = the first)."""
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 30))
    delay = random.uniform(ceiling / 2, ceiling)
    if at_least is not None:
        delay = max(delay, min(at_least, cap))
    return delay
