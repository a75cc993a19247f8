"""The daemons' HTTP side door: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` answers while the event loop runs (a hung loop fails it: restart the pod).
``/readyz`` asks the service (NATS connected, its consumer bound, the browser up …) and says
503 with the failing checks when it is not ready (take it out of rotation, do not restart).
``/metrics`` is the Prometheus exposition of ``busscrape.telemetry``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.health")

Checks = Callable[[], Awaitable[dict[str, bool]]]


class HealthServer:
    """Serves the three endpoints for one daemon. Async context manager."""

    def __init__(self, host: str, port: int, *, checks: Checks, telemetry: Telemetry) -> None:
        self.host = host
        self.port = port
        self.checks = checks
        self.telemetry = telemetry
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> HealthServer:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("health.listening", host=self.host, port=self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": self.telemetry.service})

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            checks = await asyncio.wait_for(self.checks(), 5)
        except Exception as exc:
            return web.json_response({"ready": False, "error": repr(exc)}, status=503)
        ready = all(checks.values())
        return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        body = await asyncio.to_thread(self.telemetry.exposition)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
