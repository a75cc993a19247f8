"""A forward proxy the tests run on a loopback address (HTTP CONNECT, optional Basic auth).

It logs every tunnel it was asked for, as (target, user) — what the assertions read — and can be
told to refuse every tunnel (a dead proxy that still answers: ``refuse=True``). Runs in its own
thread, so worker subprocesses and in-process workers can both use it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading

from tests.support.net import free_port


class ForwardProxy:
    def __init__(self, host: str = "127.0.0.5", *, user: str | None = None, password: str | None = None,
                 refuse: bool = False, port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.user, self.password, self.refuse = user, password, refuse
        self.log: list[tuple[str, str | None]] = []
        """(target host:port, user) of every CONNECT, refused ones too."""
        self.passed: list[str] = []
        """Targets of the tunnels it opened."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="test-proxy")
        self._server: asyncio.base_events.Server | None = None

    def url(self, with_credentials: bool = True) -> str:
        auth = f"{self.user}:{self.password}@" if self.user and with_credentials else ""
        return f"http://{auth}{self.host}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            user = None
            auth = headers.get("Proxy-Authorization", "")
            if auth.startswith("Basic "):
                user, _, given = base64.b64decode(auth[6:]).decode().partition(":")
                if (user, given) != (self.user, self.password):
                    user = f"!{user}"
            self.log.append((target, user))
            if method != "CONNECT" or self.refuse:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                return
            if self.user is not None and user != self.user:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            self.passed.append(target)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def __enter__(self) -> ForwardProxy:
        self._thread.start()

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()
