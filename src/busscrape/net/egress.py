"""The egress proxy: every TCP connection the browser opens passes the network policy here.

Chromium is launched with ``--proxy-server=socks5://127.0.0.1:<port>`` and
``--proxy-bypass-list=<-loopback>`` (so even loopback goes through it). With SOCKS5 the browser
hands over the *name* and port; the proxy resolves it once, refuses non-public addresses that
are not allowed, and connects to exactly the address it checked — so redirects,
sub-resources, WebSockets and DNS tricks all meet the same rule, with no window between check
and connect. After the handshake it only copies bytes (TLS stays end to end).

Refusals are remembered per ``host:port`` for a while so the worker can tell a task *why* its
navigation failed (Chromium itself only says ``ERR_SOCKS_CONNECTION_FAILED``).

With an upstream proxy (``upstream``, one egress listener per proxy in use) the checked address is
reached through that proxy instead: the target passes the policy first, and so must the proxy's
own address; each attempt through it is reported to ``on_upstream`` (proxy health).

Every connection is bounded: the SOCKS handshake must finish within ``handshake_timeout``; a
connection that carries no byte either way for ``idle_timeout`` is closed; and once one side has
closed its half, the other has ``linger`` seconds to finish (a peer that never closes cannot keep
a task and two descriptors forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from busscrape.net.addresses import IPAddress
from busscrape.net.policy import NetworkPolicy
from busscrape.net.upstream import Upstream, UpstreamFailed

log = structlog.get_logger("busscrape.egress")

_VERSION = 5
_NO_AUTH = 0
_CONNECT = 1
_ATYP_IPV4, _ATYP_DOMAIN, _ATYP_IPV6 = 1, 3, 4
_OK, _FAILURE, _NOT_ALLOWED, _HOST_UNREACHABLE, _REFUSED, _CMD_UNSUPPORTED = 0, 1, 2, 4, 5, 7
_PIPE_CHUNK = 256 * 1024
_REMEMBER = 4096  # refusals remembered for explanations


@dataclass(frozen=True)
class Refusal:
    host: str
    port: int
    reason: str
    at: float


class EgressProxy:
    """A SOCKS5 server on loopback that enforces a ``NetworkPolicy``. Async context manager."""

    def __init__(self, policy: NetworkPolicy, host: str = "127.0.0.1", connect_timeout: float = 15.0, *,
                 handshake_timeout: float = 15.0, idle_timeout: float = 300.0, linger: float = 30.0,
                 upstream: Upstream | None = None, on_upstream: Callable[[Upstream, bool], None] | None = None) -> None:
        self.policy = policy
        self.upstream = upstream
        self.on_upstream = on_upstream
        self.host = host
        self.port = 0
        self.connect_timeout = connect_timeout
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.linger = linger
        self.refusals: OrderedDict[tuple[str, int], Refusal] = OrderedDict()
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"socks5://{self.host}:{self.port}"

    async def __aenter__(self) -> EgressProxy:
        if self._server is not None:
            raise RuntimeError("the egress proxy is already running")
        self._server = await asyncio.start_server(self._accept, self.host, 0, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def explain(self, host: str, port: int, since: float = 0.0) -> str | None:
        """Why a connection to host:port was refused (at or after ``since``), if it was."""
        refusal = self.refusals.get((host.lower().strip("[]"), port))
        return refusal.reason if refusal and refusal.at >= since else None

    def _remember(self, host: str, port: int, reason: str) -> None:
        key = (host.lower(), port)
        self.refusals[key] = Refusal(host, port, reason, time.monotonic())
        self.refusals.move_to_end(key)
        while len(self.refusals) > _REMEMBER:
            self.refusals.popitem(last=False)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError):
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.handshake_timeout):
            upstream = await self._handshake(reader, writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        self.connections += 1
        try:
            await self._reply(writer, _OK)
            await self._relay(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """SOCKS5 greeting and CONNECT; the checked upstream connection, or None (refused, answered)."""
        version, count = await reader.readexactly(2)
        methods = await reader.readexactly(count)
        if version != _VERSION or _NO_AUTH not in methods:
            writer.write(bytes([_VERSION, 0xFF]))
            return None
        writer.write(bytes([_VERSION, _NO_AUTH]))
        _, command, _, atyp = await reader.readexactly(4)
        if atyp == _ATYP_IPV4:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif atyp == _ATYP_IPV6:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        elif atyp == _ATYP_DOMAIN:
            (length,) = await reader.readexactly(1)
            host = (await reader.readexactly(length)).decode("idna")
        else:
            await self._reply(writer, _FAILURE)
            return None
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        if command != _CONNECT:
            await self._reply(writer, _CMD_UNSUPPORTED)
            return None
        upstream = await self._connect(host, port)
        if isinstance(upstream, int):
            await self._reply(writer, upstream)
            return None
        return upstream

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        """Copy both ways until both ends close, one end has closed for ``linger``, or nothing
        moved either way for ``idle_timeout``."""
        moved = [time.monotonic()]
        pipes = {asyncio.create_task(_pipe(reader, up_writer, moved)),
                 asyncio.create_task(_pipe(up_reader, writer, moved))}
        try:
            pending = pipes
            while pending:
                done, pending = await asyncio.wait(pending, timeout=min(self.idle_timeout, self.linger),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if done and pending:  # one half closed: the other gets `linger` to finish
                    _, pending = await asyncio.wait(pending, timeout=self.linger)
                    break
                if time.monotonic() - moved[0] >= self.idle_timeout:
                    break
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | int:
        """Resolve, check, connect to a checked address; or the SOCKS error code."""
        try:
            allowed, reason = await self.policy.admitted(host, port)
        except (OSError, ValueError):
            return _HOST_UNREACHABLE
        if not allowed:
            reason = reason or "no address"
            self._remember(host, port, reason)
            log.info("egress.refused", host=host, port=port, reason=reason)
            return _NOT_ALLOWED
        if self.upstream is not None:
            return await self._through_upstream(self.upstream, host, port, allowed)
        last_error: OSError | None = None
        for ip in allowed:
            try:
                return await asyncio.wait_for(asyncio.open_connection(str(ip), port, limit=_PIPE_CHUNK),
                                              self.connect_timeout)
            except (OSError, TimeoutError) as exc:
                last_error = exc if isinstance(exc, OSError) else OSError(str(exc))
        return _REFUSED if isinstance(last_error, ConnectionRefusedError) else _HOST_UNREACHABLE

    async def _through_upstream(self, upstream: Upstream, host: str, port: int,
                                allowed: list[IPAddress]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | int:
        """Through the upstream proxy, to the first checked address it connects to."""
        try:
            proxy_ips, refused = await self.policy.admitted(upstream.host, upstream.port)
        except (OSError, ValueError):
            proxy_ips, refused = [], None
        if not proxy_ips:
            reason = f"proxy {upstream.url}: {refused or 'no address'}"
            self._remember(host, port, reason)
            log.info("egress.refused", host=host, port=port, reason=reason)
            return _NOT_ALLOWED
        error: UpstreamFailed | None = None
        # To the proxy's checked addresses only, as to a target's: its name is not resolved again.
        for ip, via in ((ip, via) for via in proxy_ips for ip in allowed):
            try:
                connection = await upstream.tunnel(str(ip), port, self.connect_timeout, via=str(via))
            except UpstreamFailed as exc:
                error = exc
                continue
            self._report(upstream, True)
            return connection
        self._report(upstream, False)
        log.info("egress.upstream_failed", host=host, port=port, proxy=upstream.url, error=str(error)[:300])
        return _HOST_UNREACHABLE

    def _report(self, upstream: Upstream, ok: bool) -> None:
        if self.on_upstream is not None:
            self.on_upstream(upstream, ok)

    async def _reply(self, writer: asyncio.StreamWriter, code: int) -> None:
        # BND.ADDR is unused by Chromium; 0.0.0.0:0 is the usual filler.
        writer.write(bytes([_VERSION, code, 0, _ATYP_IPV4]) + ipaddress.IPv4Address(0).packed + b"\x00\x00")
        await writer.drain()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, moved: list[float]) -> None:
    try:
        while data := await src.read(_PIPE_CHUNK):
            moved[0] = time.monotonic()
            dst.write(data)
            await dst.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if dst.can_write_eof():
                dst.write_eof()
            else:
                dst.close()
