"""A TCP relay that holds back every byte the server sends for a fixed time: a distant store on loopback.

    .venv/bin/python bench/rtt_proxy.py --upstream 127.0.0.1:9000 --delay-ms 20

Prints the port it listens on (127.0.0.1) once it accepts connections, then relays until killed.
Each response reaches the client ``delay`` after the server sent it, so every request/response
exchange takes one round trip longer, as it does against a cloud store (tens of milliseconds to
a region's S3) and not against a server on the same loopback. Requests are not delayed: the
round trip is counted once. Bandwidth is not shaped. Its own process, so the benchmark can tell
its CPU apart (it copies every byte both ways, for both sides of a comparison alike).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def _delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """What ``reader`` gives, written to ``writer`` ``delay`` after it came, in order."""
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def take() -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                due.put_nowait((loop.time() + delay, data))
        due.put_nowait((loop.time() + delay, b""))

    taking = asyncio.create_task(take())
    try:
        while True:
            at, data = await due.get()
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()
    except ConnectionError:
        pass
    finally:
        taking.cancel()


async def main(upstream: tuple[str, int], delay: float) -> None:
    # asyncio keeps only weak references to tasks: a connection's relay must not be collected
    # while it waits on both directions.
    relaying: set[asyncio.Task[None]] = set()

    async def accept(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        if this is not None:
            relaying.add(this)
            this.add_done_callback(relaying.discard)
        try:
            server_r, server_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_forward(client_r, server_w), _delayed(server_r, client_w, delay))
        finally:
            for w in (client_w, server_w):
                w.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="host:port of the server")
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(main((host, int(port)), args.delay_ms / 1000))
