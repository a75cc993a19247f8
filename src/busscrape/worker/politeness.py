"""Per-host politeness inside one worker: at most N pages per host, a minimum gap between them.

Hosts are keyed by name. Idle hosts are forgotten so a crawl over millions of hosts does not
grow the table without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

_MAX_HOSTS = 10_000


@dataclass
class _Host:
    slots: asyncio.Semaphore
    next_start: float = 0.0
    users: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class HostGate:
    """``async with gate.enter(host):`` holds one of the host's page slots for a whole visit;
    ``await gate.pace(host)``, right before the navigation, keeps the minimum delay between
    navigation starts (measured there, not at the slot, so page set-up time does not eat it)."""

    def __init__(self, concurrency: int, delay: float) -> None:
        self.concurrency = concurrency
        self.delay = delay
        self._hosts: OrderedDict[str, _Host] = OrderedDict()

    def _host(self, name: str) -> _Host:
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = _Host(asyncio.Semaphore(self.concurrency))
            self._forget_idle()
        self._hosts.move_to_end(name)
        return host

    def _forget_idle(self) -> None:
        while len(self._hosts) > _MAX_HOSTS:
            for name, host in self._hosts.items():
                if host.users == 0 and host.next_start <= time.monotonic():
                    del self._hosts[name]
                    break
            else:
                return

    @contextlib.asynccontextmanager
    async def enter(self, name: str) -> AsyncIterator[None]:
        host = self._host(name.lower())
        host.users += 1
        try:
            async with host.slots:
                yield
        finally:
            host.users -= 1

    async def pace(self, name: str, floor: float | None = None) -> None:
        """Wait until this host may see the next navigation start. ``floor``: a longer gap the
        host itself asks for (robots.txt ``Crawl-delay``, from ``crawl.robots``)."""
        delay = max(self.delay, floor or 0.0)
        if delay <= 0:
            return
        host = self._host(name.lower())
        # Serialise the start times, not the pages: each start reserves the next one.
        async with host.lock:
            now = time.monotonic()
            wait = host.next_start - now
            reserved = host.next_start = max(host.next_start, now) + delay
        if wait > 0:
            try:
                await asyncio.sleep(wait)
            except asyncio.CancelledError:
                # A waiter that gives up (its task stopped) gives its start back, unless a later
                # one has reserved after it: then the gap stays as the later one expects it.
                if host.next_start == reserved:
                    host.next_start -= delay
                raise
