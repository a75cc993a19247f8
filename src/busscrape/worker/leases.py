"""A worker's leases (host slots, session logins: ``bus.leases`` on HOSTS) and what a task that
may not go on now raises: ``Deferred`` (the task is handed back for later, spending no attempt),
``LeaseLost`` when the lease guarding its render was lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from busscrape.bus import leases

take = leases.take


@dataclass(frozen=True)
class Wait:
    """Not now: come back after ``seconds``; ``why`` is ``cooling``, ``busy``, ``delay``,
    ``session_login`` or ``lease_lost``."""

    seconds: float
    why: str


class Deferred(Exception):
    """Raised from inside a render that may not go on now (its host's start was taken by another
    worker meanwhile, its lease was lost): the task is handed back for later, spending no attempt."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"host busy ({wait.why}); back in {wait.seconds:.2f}s")
        self.wait = wait


class LeaseLost(Deferred):
    """The lease guarding the work is another worker's now (or expired): the work stops."""


class Lease(leases.Lease):
    """A worker's lease: lost, it defers the task it guards."""

    def lost_error(self) -> Exception:
        return LeaseLost(Wait(self.ttl / 3, "lease_lost"))
