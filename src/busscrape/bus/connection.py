"""The connection to NATS: credentials, TLS, reconnects, and clear errors when it fails.

Every service gets its ``Bus`` from ``Bus.connect(settings, name=…)``. Once connected the
client reconnects forever (a nats-server restart costs time, never the process); the first
connection is bounded by ``connect_timeout`` and fails with ``NatsUnavailable`` (exit 2) or,
when the server refuses the credentials, ``AuthenticationFailed`` (exit 3).

Credentials come from the settings only, that is from ``BUSSCRAPE_NATS__*`` variables and the
files they name: user and password, a token, an nkey seed file, a ``.creds`` file (user JWT +
seed, decentralised auth), and TLS (a CA to verify the server; a client certificate and key for
mutual TLS). Failures are told apart, each with the setting to fix and never the secret:

- the server refuses the user, password, token, nkey or JWT, or the client certificate: exit 3;
- our side cannot verify the server's certificate (wrong CA, wrong name): exit 2, a TLS message;
- TLS was asked for (``tls://``, a TLS file) and the server offers none: exit 2, nothing sent;
- a credential file that is missing or does not hold what it should: exit 2, before connecting.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from busscrape.bus.compat import TlsNotOffered
from busscrape.bus.payloads import BusClient
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import AuthenticationFailed, ConfigurationError, NatsUnavailable
from busscrape.net import tls
from busscrape.settings import NatsSettings, Settings
from busscrape.telemetry.logs import redact_text

log = structlog.get_logger("busscrape.bus")

_AUTH_WORDS = ("authorization", "authentication", "user authentication", "permissions violation")
# TLS alerts a server sends when it refuses our client certificate (or the lack of one).
_CLIENT_CERT_ALERTS = ("certificate required", "unknown ca", "bad certificate", "certificate unknown",
                       "certificate revoked", "certificate expired", "unsupported certificate", "access denied")


def _is_auth_error(exc: BaseException) -> bool:
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    return any(word in str(exc).lower() for word in _AUTH_WORDS)


def _tls_failure(exc: BaseException) -> str | None:
    """``server`` when we could not verify the server, ``client`` when it refused our
    certificate, ``other`` for any other TLS failure, None when ``exc`` is not about TLS."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "server"
    if isinstance(exc, ssl.SSLError):
        text = str(exc).lower().replace("_", " ")
        return "client" if "alert" in text and any(a in text for a in _CLIENT_CERT_ALERTS) else "other"
    return None


def _credential_hint(cfg: NatsSettings) -> str:
    """Which settings hold the credentials in use (the ones to fix), or which to set."""
    used = []
    if cfg.user or cfg.password:  # (credentials in the URL were moved here by the settings)
        used.append("BUSSCRAPE_NATS__USER and BUSSCRAPE_NATS__PASSWORD")
    if cfg.token:
        used.append("BUSSCRAPE_NATS__TOKEN")
    if cfg.nkey_seed_file:
        used.append(f"BUSSCRAPE_NATS__NKEY_SEED_FILE ({cfg.nkey_seed_file})")
    if cfg.creds_file:
        used.append(f"BUSSCRAPE_NATS__CREDS_FILE ({cfg.creds_file})")
    if not used:
        return ("no credentials are configured: set BUSSCRAPE_NATS__USER and __PASSWORD, __TOKEN, "
                "__NKEY_SEED_FILE or __CREDS_FILE")
    return "check " + ", ".join(used)


def tls_context(cfg: NatsSettings) -> ssl.SSLContext | None:
    """An SSL context when any TLS file is configured (or the URL says tls://)."""
    wants_tls = any((cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file)) or any(
        u.startswith("tls://") for u in cfg.server_urls()
    )
    if not wants_tls:
        return None
    ctx = tls.client_context(cfg.tls_ca_file, "BUSSCRAPE_NATS__TLS_CA_FILE")
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        given, missing = ("CERT", "KEY") if cfg.tls_cert_file else ("KEY", "CERT")
        raise ConfigurationError(
            f"BUSSCRAPE_NATS__TLS_{given}_FILE is set but BUSSCRAPE_NATS__TLS_{missing}_FILE is not: mutual "
            "TLS needs both"
        )
    if cfg.tls_cert_file and cfg.tls_key_file:
        try:
            ctx.load_cert_chain(str(cfg.tls_cert_file), str(cfg.tls_key_file))
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"BUSSCRAPE_NATS__TLS_CERT_FILE ({cfg.tls_cert_file}) and BUSSCRAPE_NATS__TLS_KEY_FILE "
                f"({cfg.tls_key_file}) are not a PEM certificate and its key ({tls.reason(exc)})"
            ) from None
    return ctx


def _check_credential_files(cfg: NatsSettings) -> None:
    """Refuse, before connecting, a seed or creds file that cannot work (never quoting it)."""
    for label, path in (("CREDS_FILE", cfg.creds_file), ("NKEY_SEED_FILE", cfg.nkey_seed_file),
                        ("TLS_CA_FILE", cfg.tls_ca_file), ("TLS_CERT_FILE", cfg.tls_cert_file),
                        ("TLS_KEY_FILE", cfg.tls_key_file)):
        if path is not None and not path.is_file():
            raise ConfigurationError(f"BUSSCRAPE_NATS__{label}: {path} is not a readable file")
    if not (cfg.creds_file or cfg.nkey_seed_file):
        return
    try:
        import nkeys
    except ImportError:  # nats-py needs it to sign the server's nonce
        raise ConfigurationError(
            "nkey and .creds authentication need the `nkeys` package: pip install nkeys"
        ) from None
    if cfg.nkey_seed_file:
        seed = _read(cfg.nkey_seed_file, "NKEY_SEED_FILE").strip()
        if not _valid_seed(nkeys, seed, prefix=b"SU"):
            raise ConfigurationError(
                f"BUSSCRAPE_NATS__NKEY_SEED_FILE: {cfg.nkey_seed_file} does not hold a user nkey seed "
                "(one line starting with SU)"
            )
    if cfg.creds_file:
        lines = _read(cfg.creds_file, "CREDS_FILE").splitlines()
        jwt = _line_after(lines, b"BEGIN NATS USER JWT")
        seed = _line_after(lines, b"BEGIN USER NKEY SEED")
        if not jwt or jwt.count(b".") != 2 or not _valid_seed(nkeys, seed, prefix=b"SU"):
            raise ConfigurationError(
                f"BUSSCRAPE_NATS__CREDS_FILE: {cfg.creds_file} is not a NATS .creds file (a user JWT and "
                "a user nkey seed between BEGIN/END lines, as `nsc generate creds` writes it)"
            )


def _read(path: Path, label: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"BUSSCRAPE_NATS__{label}: cannot read {path} ({exc.strerror})") from None


def _line_after(lines: list[bytes], marker: bytes) -> bytes:
    for i, line in enumerate(lines[:-1]):
        if marker in line:
            return lines[i + 1].strip()
    return b""


def _valid_seed(nkeys: Any, seed: bytes, *, prefix: bytes) -> bool:
    if not seed.startswith(prefix):
        return False
    try:
        nkeys.from_seed(bytearray(seed)).wipe()
    except Exception:  # nkeys raises its own errors and binascii ones for a bad seed
        return False
    return True


# What to do when no server answers, unless the command knows better (`busscrape run` does).
NO_SERVER_HINT = ("Start a server, fix BUSSCRAPE_NATS__URL, or leave it unset and use `busscrape run`, which "
                  "starts an embedded one")


def connect_options(cfg: NatsSettings) -> dict[str, Any]:
    """nats-py connect options from the settings (credentials only from settings/files)."""
    _check_credential_files(cfg)
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
        hint: str = NO_SERVER_HINT,
    ) -> Bus:
        """Connect, or raise ``NatsUnavailable`` / ``AuthenticationFailed`` with the fix (``hint``
        ends the message when no server answers: what the command at hand can do about it)."""
        cfg = settings.nats
        opts = connect_options(cfg)
        # A refusal (credentials, client certificate) or a server we cannot verify ends the first
        # connection at once; anything else (refused, reset) is retried until the budget is spent.
        first_error: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        last_error: list[BaseException] = []
        connected = False

        async def error_cb(exc: BaseException) -> None:
            if not connected:
                last_error[:] = [exc]
                decisive = _is_auth_error(exc) or isinstance(exc, TlsNotOffered) or _tls_failure(exc) in {
                    "server", "client"}
                if not first_error.done() and decisive:
                    first_error.set_result(exc)
                return
            log.warning("nats.error", error=redact_text(str(exc)) or type(exc).__name__)

        async def disconnected_cb() -> None:
            if connected and not nc.is_closed and not nc.is_draining and not state["closing"]:
                log.warning("nats.disconnected")
                if on_disconnect:
                    await on_disconnect()

        async def reconnected_cb() -> None:
            log.info("nats.reconnected", server=str(nc.connected_url.netloc if nc.connected_url else ""))
            if on_reconnect:
                await on_reconnect()

        nc = BusClient()
        nc.wants_tls = "tls" in opts
        state = {"closing": False}
        attempt = asyncio.ensure_future(
            nc.connect(name=name, error_cb=error_cb, disconnected_cb=disconnected_cb,
                       reconnected_cb=reconnected_cb, **opts)
        )
        # The whole first connection, refused attempts retried inside it, takes connect_timeout:
        # what the setting says, and what the message then says.
        budget = max(cfg.connect_timeout, 0.1)
        racing: set[asyncio.Future[Any]] = {attempt, first_error}
        done, _ = await asyncio.wait(racing, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
        servers = redact_text(", ".join(opts["servers"]))
        if attempt not in done or attempt.exception() is not None:
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
            await _quiet_close(nc)
            cause = first_error.result() if first_error.done() else (
                attempt.exception() if attempt.done() and not attempt.cancelled() else None
            )
            if cause is None and last_error:
                cause = last_error[0]
            raise _connect_failure(cfg, servers, cause, budget, hint)
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


def _connect_failure(cfg: NatsSettings, servers: str, cause: BaseException | None,
                     budget: float, hint: str = NO_SERVER_HINT) -> ConfigurationError:
    """The error that says why the first connection failed and which setting fixes it."""
    kind = _tls_failure(cause) if cause is not None else None
    if cause is not None and _is_auth_error(cause):
        return AuthenticationFailed(
            f"NATS at {servers} refused the credentials ({redact_text(str(cause))}); {_credential_hint(cfg)}"
        )
    if isinstance(cause, TlsNotOffered):
        return NatsUnavailable(
            f"the NATS server at {servers} does not offer TLS, but the settings ask for it (a tls:// URL or "
            "BUSSCRAPE_NATS__TLS_*): nothing was sent. Enable TLS on the server, or fix BUSSCRAPE_NATS__URL"
        )
    if cause is not None and kind == "client":
        fix = ("check BUSSCRAPE_NATS__TLS_CERT_FILE and BUSSCRAPE_NATS__TLS_KEY_FILE: the certificate must be "
               "signed by a CA the server trusts") if cfg.tls_cert_file else (
               "the server requires a client certificate (mutual TLS): set BUSSCRAPE_NATS__TLS_CERT_FILE and "
               "BUSSCRAPE_NATS__TLS_KEY_FILE")
        return AuthenticationFailed(
            f"NATS at {servers} refused the TLS client certificate ({tls.reason(cause)}); {fix}"
        )
    if cause is not None and kind == "server":
        return NatsUnavailable(
            f"TLS verification of the NATS server at {servers} failed ({tls.reason(cause)}): set "
            "BUSSCRAPE_NATS__TLS_CA_FILE to the CA that signed the server's certificate"
            + (f" (now {cfg.tls_ca_file})" if cfg.tls_ca_file else "")
            + ", or BUSSCRAPE_NATS__TLS_HOSTNAME to the name the certificate was issued for"
        )
    if cause is not None and kind == "other":
        return NatsUnavailable(
            f"TLS with the NATS server at {servers} failed ({tls.reason(cause)}); check that it speaks TLS "
            "on that port and BUSSCRAPE_NATS__TLS_CA_FILE, __TLS_CERT_FILE and __TLS_KEY_FILE"
        )
    detail = f"{redact_text(str(cause)) or type(cause).__name__}; " if cause is not None else ""
    return NatsUnavailable(
        f"cannot connect to NATS at {servers} ({detail}no connection within {budget:g}s). {hint}"
    )


async def _quiet_close(nc: NATS) -> None:
    if nc.is_closed:
        return
    try:
        await asyncio.wait_for(nc.close(), 5)
    except TRANSIENT:
        pass
