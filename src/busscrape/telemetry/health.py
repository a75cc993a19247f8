"""The daemons' HTTP side door: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` answers while the event loop runs (a hung loop fails it: restart the pod).
``/readyz`` asks the service (NATS connected, its consumer bound, the browser up …) and says
503 with the failing checks when it is not ready (take it out of rotation, do not restart).
``/metrics`` is the Prometheus exposition of ``busscrape.telemetry``.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from busscrape.errors import ConfigurationError
from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.health")

Checks = Callable[[], Awaitable[dict[str, bool]]]


class HealthServer:
    """Serves the three endpoints for one daemon. Async context manager.

    With ``fallback`` (the port is the default, not chosen by the operator) a port another process
    holds is given up for a free one: a worker and an ingester on one host both default to 9464,
    and the second must not die of it. The port chosen is logged (``health.listening``) and served
    in ``/healthz``. A port the operator set that is taken is a configuration error (exit 2).
    """

    def __init__(self, host: str, port: int, *, checks: Checks, telemetry: Telemetry,
                 fallback: bool = False) -> None:
        self.host = host
        self.port = port
        self.checks = checks
        self.telemetry = telemetry
        self.fallback = fallback
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> HealthServer:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        wanted = self.port
        try:
            site = await self._listen(wanted)
        except OSError as exc:
            if not (self.fallback and exc.errno == errno.EADDRINUSE):
                await self._runner.cleanup()
                raise ConfigurationError(
                    f"cannot serve /healthz and /metrics on {self.host}:{wanted} ({exc.strerror or exc}); "
                    "set another BUSSCRAPE_TELEMETRY__HTTP_PORT (0 picks a free one, none turns it off)") from None
            site = await self._listen(0)
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.port != wanted and wanted != 0:
            log.warning("health.port_taken", host=self.host, port=wanted, chosen=self.port)
        log.info("health.listening", host=self.host, port=self.port)
        return self

    async def _listen(self, port: int) -> web.TCPSite:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, port)
        await site.start()
        return site

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": self.telemetry.service, "port": self.port})

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
