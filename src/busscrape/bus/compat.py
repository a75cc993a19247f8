"""Every use of nats-py's internals, in one place, checked when busscrape starts.

busscrape reaches past nats-py's public API where that API costs too much or cannot say what
is needed:

- ``publish_encoded`` sends an HPUB with a header block encoded once per run (nats-py validates
  and encodes a headers dict on every publish, as much as the rest of the send): it uses the
  client's ``_send_command`` / ``_flush_pending`` and its outbound-buffer counters;
- ``next_nuid`` takes NUIDs from the client's generator (object-store chunk subjects, as nats-py's
  own object store does);
- ``connection_of`` is the client behind a JetStream context;
- ``prefetched`` is the queue of messages a pull subscription received for an expired fetch
  (handed back with a nak at shutdown instead of waiting out ack_wait);
- ``TlsEnforcingClient`` hooks ``_process_info`` to refuse a plaintext fallback;
- ``create_key_value_as`` runs nats-py's ``create_key_value`` with the stream's configuration
  adjusted before the stream is made (what the bucket API cannot say, such as compression).

Each internal is looked for at import; when one is missing this module raises ``ImportError``
naming it and the installed nats-py version, instead of failing later, half-way through a
publish. The fix is then a nats-py release this busscrape was tested with (``pyproject.toml``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, cast

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.protocol.command import hpub_cmd


def _missing() -> list[str]:
    gone = [f"Client.{name}" for name in ("_send_command", "_flush_pending", "_process_info")
            if not callable(getattr(Client, name, None))]
    probe = Client()
    gone += [f"Client().{name}" for name in ("_max_pending_size", "_pending_data_size", "_flush_queue", "_nuid")
             if not hasattr(probe, name)]
    if not hasattr(getattr(probe, "_nuid", None), "next"):
        gone.append("Client()._nuid.next")
    if not hasattr(probe.jetstream(), "_nc"):
        gone.append("JetStreamContext()._nc")
    if "self._sub = sub" not in inspect.getsource(JetStreamContext.PullSubscription.__init__):
        gone.append("JetStreamContext.PullSubscription._sub")
    if "self._pending_queue" not in inspect.getsource(Subscription.__init__):
        gone.append("Subscription._pending_queue")
    if "self.add_stream(" not in inspect.getsource(JetStreamContext.create_key_value):
        gone.append("JetStreamContext.create_key_value through self.add_stream")
    return gone


def _nats_py_version() -> str:
    try:
        return version("nats-py")
    except PackageNotFoundError:
        return "(unknown version)"


_GONE = _missing()
if _GONE:
    raise ImportError(
        f"busscrape relies on nats-py internals that nats-py {_nats_py_version()} does not have: "
        f"{', '.join(_GONE)}. Install the nats-py release pyproject.toml names (pip install 'nats-py>=2.16,<2.17'), "
        "or update busscrape.bus.compat for this one")


class _AdjustedStreams:
    """A JetStream context whose ``add_stream`` adjusts the configuration first."""

    def __init__(self, js: JetStreamContext, adjust: Callable[[api.StreamConfig], api.StreamConfig]) -> None:
        self._js = js
        self._adjust = adjust

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def add_stream(self, config: api.StreamConfig, **params: Any) -> api.StreamInfo:
        return await self._js.add_stream(self._adjust(config), **params)


async def create_key_value_as(js: JetStreamContext, config: api.KeyValueConfig,
                              adjust: Callable[[api.StreamConfig], api.StreamConfig]) -> None:
    """Create a bucket with nats-py's conventions for its stream (subjects, rollups, discard,
    history …) and ``adjust`` applied to that stream's configuration, in one ``add_stream``: no
    moment when the bucket takes writes with a configuration that must then be replaced."""
    await JetStreamContext.create_key_value(cast(JetStreamContext, _AdjustedStreams(js, adjust)), config)


def connection_of(js: JetStreamContext) -> Client:
    """The NATS client a JetStream context publishes through."""
    return js._nc


def next_nuid(nc: Client) -> str:
    """A fresh NUID from the client's own generator."""
    return nc._nuid.next().decode()


def prefetched(sub: Any) -> asyncio.Queue[Any]:
    """Messages a pull subscription has received and not handed out (an expired fetch's)."""
    queue: asyncio.Queue[Any] = sub._sub._pending_queue
    return queue


def encode_headers(headers: dict[str, str]) -> str:
    """A NATS header block as text (``NATS/1.0``, ``Name: value`` lines, a blank line). Values may
    hold ``str.format`` fields to fill in per message (see the dispatcher)."""
    return "NATS/1.0\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"


def decode_headers(header_block: bytes) -> dict[str, str]:
    """The dict an encoded header block stands for."""
    lines = header_block.decode().split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in lines if line)


async def publish_encoded(nc: Client, subject: str, payload: bytes, reply: str, header_block: bytes) -> None:
    """``nc.publish`` with an already encoded header block: the same HPUB, through the client's
    own outbound buffer and flusher, with the same refusals (closed, draining, buffer full while
    reconnecting, payload too large)."""
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if nc.is_draining_pubs:
        raise nats.errors.ConnectionDrainingError
    size = len(payload)
    if not nc.is_connected and (nc._max_pending_size <= 0 or size + nc._pending_data_size > nc._max_pending_size):
        raise nats.errors.OutboundBufferLimitError
    from busscrape.bus.payloads import check  # the size refusal every publish makes (PayloadTooLarge)

    check(subject, payload, len(header_block), nc.max_payload)
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += size
    await nc._send_command(hpub_cmd(subject, reply, header_block, payload))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


class TlsNotOffered(nats.errors.Error):
    """The server offers no TLS although the settings ask for it (raised before CONNECT is sent)."""


class TlsEnforcingClient(Client):
    """nats-py's client, refusing to fall back to plaintext when TLS was asked for.

    nats-py 2.16 upgrades to TLS only when the server's INFO says ``tls_required``: pointed at a
    server without TLS, a ``tls://`` URL or a CA file would send the CONNECT (password, token) in
    the clear. This runs on every (re)connection, after INFO and before CONNECT, as nats.go's
    ``checkForSecure`` does; a server that offers TLS without requiring it gets it.
    """

    wants_tls = False

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and self.wants_tls and not info.get("tls_required"):
            if not info.get("tls_available"):
                raise TlsNotOffered("nats: the server does not offer TLS")
            info["tls_required"] = True  # the same dict decides the upgrade right after this
        await super()._process_info(info, initial_connection)
