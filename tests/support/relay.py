"""A TCP relay on loopback between a NATS client and its server that can withhold PubAcks, or
freeze a client at an exact point of its work.

It speaks just enough of the NATS protocol to see the server's messages to the client (``MSG``
and ``HMSG`` frames) and drops the ones ``withhold`` picks: a PubAck that never arrives, exactly
as a network that loses it would look to the client, while the server has stored the message.
The ones ``lag`` picks it holds for the seconds ``lag`` says (a slow link, one way).

The other way it sees the client's publishes (``PUB`` and ``HPUB``): the first one ``hold``
picks, and everything that client sends after it, never reaches the server, and ``held`` is
set. A test then SIGKILLs the client process, which dies exactly before that publish — say
the ack of its task — with every earlier one done (no hook inside the process needed). The
publishes ``drop`` picks are lost on the way, and only those: the client's next ones go on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from busscrape.bus import names

_RESULTS = names.result_subject("").encode()


def ack_of(stream: str, consumer: str) -> Callable[[bytes, bytes], bool]:
    """An ack of a message of ``stream`` by ``consumer`` (``ack_sync`` sends an empty one; not a
    heartbeat ``+WPI`` nor a nak)."""
    prefix = f"$JS.ACK.{stream}.{consumer}.".encode()
    return lambda subject, payload: subject.startswith(prefix) and payload in (b"", b"+ACK")


task_ack = ack_of(names.TASKS_STREAM, names.WORKERS_CONSUMER)
"""A worker's ack of its task."""
result_ack = ack_of(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
"""An ingester's ack of a result."""


def result_publish(subject: bytes, payload: bytes) -> bool:
    """A worker's publish of a result to RESULTS (its artifacts are all stored by then)."""
    return subject.startswith(_RESULTS)


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
        self.lag: Callable[[bytes], float] | None = None
        self.hold: Callable[[bytes, bytes], bool] | None = None
        self.held = asyncio.Event()
        self.drop: Callable[[bytes, bytes], bool] | None = None
        self.dropped = 0
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
        up = asyncio.create_task(self._publishes(client_r, server_w))
        down = asyncio.create_task(self._frames(server_r, client_w))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_w, server_w):
            with contextlib.suppress(Exception):
                writer.close()
        self._tasks -= {up, down}

    async def _publishes(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to server, frame by frame, until ``hold`` picks a publish: then nothing more."""
        while line := await reader.readline():
            head = line.split(b" ", 1)[0].upper()
            body = b""
            if head in (b"PUB", b"HPUB"):
                parts = line.split()
                body = await reader.readexactly(int(parts[-1]) + 2)
                payload = body[:-2][int(parts[-2]):] if head == b"HPUB" else body[:-2]
                if self.hold is not None and self.hold(parts[1], payload):
                    self.held.set()
                    await asyncio.Event().wait()  # frozen: the test kills the client now
                if self.drop is not None and self.drop(parts[1], payload):
                    self.dropped += 1
                    continue
            writer.write(line + body)
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
                if self.lag is not None and (pause := self.lag(payload)) > 0:
                    await asyncio.sleep(pause)  # and every frame behind it: one connection
                writer.write(line + body)
            else:
                writer.write(line)
            await writer.drain()
