"""Cancel and wait, bounded: a shutdown never waits for ever on work that ignores its cancel.

On Python 3.11 ``asyncio.wait_for`` swallows a cancel that lands in the loop iteration where its
inner work completes (cpython gh-86296), and nats-py waits for every reply, fetch and watch
entry that way. A task whose cancel is lost goes on as if nothing had happened: a loop around
such a call (a pull fetch, a consumer-info poll, a heartbeat) runs on, and a shutdown that
cancels it and then awaits it waits for ever — the worker, the ingester or ``busscrape run``
never exits, holding its slots and leases.

So every loop that must end checks a flag as well as being cancelled, and every cancel-and-wait
on the way out goes through ``stop``: cancelled, given ``grace`` seconds, and what has not ended
by then is left behind (logged, kept referenced until it ends) while the caller goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger("busscrape.cancelling")

_left_behind: set[asyncio.Future[Any]] = set()


def abandoned() -> int:
    """Work cancelled that has not ended yet, past its grace (in this process)."""
    return len(_left_behind)


async def stop(doing: asyncio.Future[Any] | Iterable[asyncio.Future[Any]], *, grace: float, what: str) -> bool:
    """Cancel ``doing`` (one future or several) and wait at most ``grace`` seconds for it to end:
    True when all of it did."""
    futures = {doing} if isinstance(doing, asyncio.Future) else set(doing)
    if not futures:
        return True
    for future in futures:
        future.cancel()
    done, pending = await asyncio.wait(futures, timeout=grace)
    for future in done:  # retrieved: the caller wanted it ended, not its outcome
        future.cancelled() or future.exception()
    for future in pending:
        _left_behind.add(future)
        future.add_done_callback(_left_behind.discard)
        future.add_done_callback(lambda d: d.cancelled() or d.exception())  # its outcome is nobody's now
    if pending:
        log.error("task.cleanup_abandoned", what=what, grace=grace, pending=len(pending),
                  left_behind=len(_left_behind))
    return not pending
