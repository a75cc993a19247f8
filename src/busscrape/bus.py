"""The connection to NATS: credentials, TLS, reconnects, and clear errors when it fails.

Every service gets its ``Bus`` from ``Bus.connect(settings, name=…)``. Once connected the
client reconnects forever (a nats-server restart costs time, never the process); the first
connection is bounded by ``connect_timeout`` and fails with ``NatsUnavailable`` (exit 2) or,
when the server refuses the credentials, ``AuthenticationFailed`` (exit 3).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from .errors import AuthenticationFailed, ConfigurationError, NatsUnavailable
from .settings import NatsSettings, Settings

log = structlog.get_logger("busscrape.bus")

_AUTH_WORDS = ("authorization", "authentication", "user authentication", "permissions violation")


def _is_auth_error(exc: BaseException) -> bool:
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    return any(word in str(exc).lower() for word in _AUTH_WORDS)


def tls_context(cfg: NatsSettings) -> ssl.SSLContext | None:
    """An SSL context when any TLS file is configured (or the URL says tls://)."""
    wants_tls = any((cfg.tls_ca_file, cfg.tls_cert_file)) or any(
        u.startswith("tls://") for u in cfg.server_urls()
    )
    if not wants_tls:
        return None
    ctx = ssl.create_default_context(cafile=str(cfg.tls_ca_file) if cfg.tls_ca_file else None)
    if cfg.tls_cert_file:
        if not cfg.tls_key_file:
            raise ConfigurationError("BUSSCRAPE_NATS__TLS_CERT_FILE is set but BUSSCRAPE_NATS__TLS_KEY_FILE is not")
        ctx.load_cert_chain(str(cfg.tls_cert_file), str(cfg.tls_key_file))
    return ctx


def connect_options(cfg: NatsSettings) -> dict[str, Any]:
    """nats-py connect options from the settings (credentials only from settings/files)."""
    for label, path in (("CREDS_FILE", cfg.creds_file), ("NKEY_SEED_FILE", cfg.nkey_seed_file),
                        ("TLS_CA_FILE", cfg.tls_ca_file), ("TLS_CERT_FILE", cfg.tls_cert_file),
                        ("TLS_KEY_FILE", cfg.tls_key_file)):
        if path is not None and not path.is_file():
            raise ConfigurationError(f"BUSSCRAPE_NATS__{label}: {path} is not a readable file")
    opts: dict[str, Any] = {
        "servers": cfg.server_urls(),
        "connect_timeout": cfg.connect_timeout,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "pending_size": 64 * 1024 * 1024,
    }
    if cfg.user:
        opts["user"] = cfg.user
        opts["password"] = cfg.password.get_secret_value() if cfg.password else ""
    if cfg.token:
        opts["token"] = cfg.token.get_secret_value()
    if cfg.creds_file:
        opts["user_credentials"] = str(cfg.creds_file)
    if cfg.nkey_seed_file:
        opts["nkeys_seed"] = str(cfg.nkey_seed_file)
    ctx = tls_context(cfg)
    if ctx is not None:
        opts["tls"] = ctx
        if cfg.tls_hostname:
            opts["tls_hostname"] = cfg.tls_hostname
    return opts


class Bus:
    """A NATS connection and its JetStream context, closed on exit."""

    def __init__(self, nc: NATS, js: JetStreamContext, settings: Settings) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        self._entered = False
        self._state: dict[str, bool] = {"closing": False}

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        *,
        name: str,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> Bus:
        """Connect, or raise ``NatsUnavailable`` / ``AuthenticationFailed`` with the fix."""
        cfg = settings.nats
        opts = connect_options(cfg)
        first_error: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        connected = False

        async def error_cb(exc: BaseException) -> None:
            if not connected:
                if not first_error.done() and _is_auth_error(exc):
                    first_error.set_result(exc)
                return
            log.warning("nats.error", error=str(exc) or type(exc).__name__)

        async def disconnected_cb() -> None:
            if connected and not nc.is_closed and not nc.is_draining and not state["closing"]:
                log.warning("nats.disconnected")
                if on_disconnect:
                    await on_disconnect()

        async def reconnected_cb() -> None:
            log.info("nats.reconnected", server=str(nc.connected_url.netloc if nc.connected_url else ""))
            if on_reconnect:
                await on_reconnect()

        nc = NATS()
        state = {"closing": False}
        attempt = asyncio.ensure_future(
            nc.connect(name=name, error_cb=error_cb, disconnected_cb=disconnected_cb,
                       reconnected_cb=reconnected_cb, **opts)
        )
        budget = max(cfg.connect_timeout, 1.0) * 2
        done, _ = await asyncio.wait({attempt, first_error}, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
        servers = ", ".join(opts["servers"])
        if attempt not in done or attempt.exception() is not None:
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
            await _quiet_close(nc)
            cause = first_error.result() if first_error.done() else (
                attempt.exception() if attempt.done() and not attempt.cancelled() else None
            )
            if cause is not None and _is_auth_error(cause):
                raise AuthenticationFailed(
                    f"NATS at {servers} refused the credentials ({cause}); check BUSSCRAPE_NATS__USER/"
                    "PASSWORD, __TOKEN, __CREDS_FILE or __NKEY_SEED_FILE"
                )
            if cause is None:
                cause = f"no answer within {budget:.0f}s"
            raise NatsUnavailable(
                f"cannot connect to NATS at {servers} ({cause}). Start a server, fix BUSSCRAPE_NATS__URL, "
                "or leave it unset and use `busscrape run`, which starts an embedded one"
            )
        connected = True
        js = nc.jetstream(timeout=cfg.request_timeout)
        bus = cls(nc, js, settings)
        bus._state = state
        return bus

    async def close(self) -> None:
        """Flush what is buffered and close (drain is the service's job, before this)."""
        self._state["closing"] = True
        await _quiet_close(self.nc)

    async def __aenter__(self) -> Bus:
        if self._entered:
            raise RuntimeError("a Bus can be entered only once")
        self._entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _quiet_close(nc: NATS) -> None:
    if nc.is_closed:
        return
    try:
        await asyncio.wait_for(nc.close(), 5)
    except (TimeoutError, nats.errors.Error, OSError):
        pass
