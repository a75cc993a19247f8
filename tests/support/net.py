"""Loopback networking helpers: free ports and a TCP proxy that can take an endpoint down."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


_HELD: list[socket.socket] = []


def refused_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` where a connection is refused for as long as the test process lives:
    bound here without listening (and without SO_REUSEADDR), so no other process can take it. A
    port that was only free a moment ago (``free_port``) can be taken by a server of a test
    beside it before the connection is tried, and then something answers."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    _HELD.append(sock)
    return int(sock.getsockname()[1])


def wait_port(host: str, port: int, timeout: float = 20.0) -> None:
    """Block until something accepts TCP connections on host:port."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


class TcpProxy:
    """Forwards host:port to an upstream, in a background thread.

    ``down()`` stops listening and cuts open connections (clients see "connection refused");
    ``up()`` listens again on the same port. The upstream keeps its state throughout, which is
    how the tests take an in-memory S3 server "down" without losing what it stored.
    """

    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = free_port(host)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="tcp-proxy")
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread.start()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def up(self) -> None:
        self._call(self._up())

    def down(self) -> None:
        self._call(self._down())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def is_up(self) -> bool:
        return self._server is not None

    async def _up(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)

    async def _down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)


class ProxiedServer:
    """A server process reached through a ``TcpProxy``: ``outage()`` refuses connections while the
    server keeps what it stored, ``restore()`` lets them through again, ``stop()`` ends both."""

    proxy: TcpProxy | None = None
    _process: subprocess.Popen[bytes] | None = None
    stop_grace: float = 10.0  # seconds between SIGTERM and SIGKILL

    def outage(self) -> None:
        assert self.proxy is not None
        self.proxy.down()

    def restore(self) -> None:
        assert self.proxy is not None
        self.proxy.up()

    def stop(self) -> None:
        if self.proxy:
            self.proxy.close()
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)

