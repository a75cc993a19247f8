"""A website the tests serve themselves, on several loopback addresses (distinct origins).

One aiohttp application listens on the same port on every address given (127.0.0.2,
127.0.0.3 …), in a background thread with its own event loop, so worker subprocesses and
in-process code can both reach it. Tests add pages with ``site.page(path, html)`` or
``@site.route(path)`` at any time; ``site.hits`` counts requests per (host, path).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from tests.support.net import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Site:
    def __init__(self, hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3"), port: int | None = None) -> None:
        self.hosts = hosts
        self._fixed_port = port is not None
        self.port = port or free_port(hosts[0])
        self.routes: dict[str, Handler] = {}
        self.hits: Counter[tuple[str, str]] = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="test-site")
        self._runner: web.AppRunner | None = None

    # -- content ---------------------------------------------------------------------------

    def route(self, path: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes[path] = handler
            return handler

        return register

    def page(self, path: str, html: str, status: int = 200, headers: dict[str, str] | None = None) -> str:
        """Serve ``html`` at ``path``; returns the URL on the first host."""

        content_type = None if headers and any(k.lower() == "content-type" for k in headers) else "text/html"

        async def handler(_: web.Request) -> web.Response:
            return web.Response(text=html, status=status, content_type=content_type, headers=headers)

        self.routes[path] = handler
        return self.url(path)

    def url(self, path: str, host: int = 0) -> str:
        return f"http://{self.hosts[host]}:{self.port}{path}"

    def origin(self, host: int = 0) -> str:
        return f"{self.hosts[host]}:{self.port}"

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.hits[(request.host.split(":")[0], request.path)] += 1
        handler = self.routes.get(request.path)
        if handler is None:
            return web.Response(status=404, text=f"no page at {request.path}", content_type="text/html")
        return await handler(request)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Site:
        self._thread.start()
        for _ in range(5):
            try:
                asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(20)
                return self
            except OSError:
                # The port was free on the first host, not on another one (tests run in parallel
                # take ports too): a chosen port is the test's to keep; a picked one, pick again.
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(20)
                if self._fixed_port:
                    raise
                self.port = free_port(self.hosts[0])
        raise OSError(f"no port free on every one of {self.hosts}")

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        for host in self.hosts:
            await web.TCPSite(self._runner, host, self.port).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(20)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Site:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
