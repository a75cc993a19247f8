"""The worker's egress listeners: the browser's own (direct), and one per upstream proxy in use.

Each is an ``EgressProxy`` with the same network policy; a listener for an upstream proxy is
started the first time a task goes through that proxy and lives as long as the worker. A task's
browser context is pointed at its listener (Playwright's per-context ``proxy``), so every
connection of that page meets the policy first and then goes through the proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack

from busscrape.net.egress import EgressProxy
from busscrape.net.policy import NetworkPolicy
from busscrape.net.upstream import Upstream


class Egresses:
    def __init__(self, policy: NetworkPolicy, stack: AsyncExitStack,
                 on_upstream: Callable[[Upstream, bool], None] | None = None) -> None:
        self.policy = policy
        self._stack = stack
        self.on_upstream = on_upstream
        """Told of each upstream connection's success or failure (``net.proxies`` health)."""
        self.direct: EgressProxy | None = None
        self._through: dict[Upstream, EgressProxy] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> EgressProxy:
        self.direct = await self._stack.enter_async_context(EgressProxy(self.policy))
        return self.direct

    async def listener_for(self, upstream: Upstream) -> str:
        """The SOCKS URL of the listener that goes through ``upstream`` (started on first use)."""
        egress = self._through.get(upstream)
        if egress is None:
            async with self._lock:
                egress = self._through.get(upstream)
                if egress is None:
                    egress = await self._stack.enter_async_context(
                        EgressProxy(self.policy, upstream=upstream, on_upstream=self.on_upstream))
                    self._through[upstream] = egress
        return egress.url

    def explain(self, host: str, port: int, since: float = 0.0) -> str | None:
        """Why any listener refused a connection to host:port (at or after ``since``)."""
        for egress in (self.direct, *self._through.values()):
            if egress is not None and (why := egress.explain(host, port, since)):
                return why
        return None
