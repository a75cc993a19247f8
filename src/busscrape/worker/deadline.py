"""A render ends by its deadline, its clean-up included: whatever it holds is let go in bounded time.

``asyncio.timeout`` cancels the work when its time is up, but the work's clean-up (a tab closed or
wiped, a lease released, every ``finally`` on the way out) then runs on the caller's time, without
a bound: one await in it that never returns (a browser call whose answer never comes, a renderer
that hangs, a lease whose guarded work ignores its cancel) and the caller waits for ever. A worker's
task waits there holding its host slot (its lease renewed) while the message's heartbeat keeps the
task in progress: no retry, no dead letter, and every other task for that host is deferred as busy
for ever.

``within`` runs the work as a task of its own. When its time is up, or the caller is cancelled,
the work is cancelled and given ``grace`` seconds to clean up; one that has not ended by then is
left behind (logged, kept referenced until it ends), and the caller goes on at once: its slot is
released, its task retried (``cancelling.stop``). Work left behind is reported by ``abandoned()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from busscrape.cancelling import abandoned, stop

T = TypeVar("T")
__all__ = ["CLEANUP_GRACE", "abandoned", "stop", "within"]

CLEANUP_GRACE = 20.0
"""Seconds a cancelled render has to clean up: its tab closes in 10 at most (``tabs``), a lease's
release is one request."""


async def within(work: Awaitable[T], seconds: float, *, grace: float, what: str) -> T:
    """``work``'s outcome, or ``TimeoutError`` once ``seconds`` have passed, ``grace`` seconds at
    most after that however the work's clean-up goes (``stop``). Cancelling the caller stops the
    work the same way."""
    doing = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({doing}, timeout=seconds)
    except asyncio.CancelledError:
        await stop(doing, grace=grace, what=what)
        raise
    if not done:
        await stop(doing, grace=grace, what=what)
        raise TimeoutError(f"{what} did not finish in {seconds:.0f}s")
    return doing.result()
