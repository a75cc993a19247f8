"""A TCP relay on loopback between a NATS client and its server that can withhold PubAcks.

It speaks just enough of the NATS protocol to see the server's messages to the client (``MSG``
and ``HMSG`` frames) and drops the ones ``withhold`` picks: a PubAck that never arrives, exactly
as a network that loses it would look to the client, while the server has stored the message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


def results_puback(payload: bytes) -> bool:
    """A PubAck of a publish to RESULTS (``{"stream":"RESULTS","seq":…}``)."""
    return payload.startswith(b"{") and b'"stream":"RESULTS"' in payload and b'"seq"' in payload


class Relay:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self.withhold: Callable[[bytes], bool] | None = None
        self.withheld = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_w.close()
            return
        up = asyncio.create_task(self._pipe(client_r, server_w))
        down = asyncio.create_task(self._frames(server_r, client_w))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_w, server_w):
            with contextlib.suppress(Exception):
                writer.close()
        self._tasks -= {up, down}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Server to client, frame by frame, dropping the messages ``withhold`` picks."""
        while line := await reader.readline():
            head = line.split(b" ", 1)[0].upper()
            if head in (b"MSG", b"HMSG"):
                size = int(line.split()[-1])
                body = await reader.readexactly(size + 2)  # payload (and headers) + CRLF
                payload = body[:-2]
                if head == b"HMSG":
                    payload = payload[int(line.split()[-2]):]
                if self.withhold is not None and self.withhold(payload):
                    self.withheld += 1
                    continue
                writer.write(line + body)
            else:
                writer.write(line)
            await writer.drain()
