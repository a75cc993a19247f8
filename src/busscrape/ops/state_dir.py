"""A finished embedded run's NATS, reachable again: ``busscrape dlq``, ``task`` and ``status`` on
the state dir ``busscrape run`` left.

``busscrape run`` without ``BUSSCRAPE_NATS__URL`` keeps its JetStream store in
``<state_dir>/nats`` and stops its server when it ends. These commands, given no URL either, then
start a server on that store for as long as they run (on free loopback ports, dying with the
command) and read it there; while a run is still going they use that run's own server.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import structlog

from busscrape.errors import ConfigurationError
from busscrape.ops.lifeline import running
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings

log = structlog.get_logger("busscrape.state")


def store_of(settings: Settings) -> Path:
    """Where ``busscrape run`` keeps its embedded server's store."""
    return settings.state_dir / "nats"


def require_writable(settings: Settings) -> None:
    """The state dir exists and this process can write in it, or a ``ConfigurationError`` saying
    how to fix it: in a container, a host folder mounted at /data that the container's user does
    not own is the usual cause."""
    folder = settings.state_dir
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
        return
    uid, gid = os.getuid(), os.getgid()
    raise ConfigurationError(
        f"the state dir {folder} is not writable by uid {uid}: make it writable for that user, or set "
        f"BUSSCRAPE_STATE_DIR. In a container, mount a folder that user owns (`chown {uid}:{gid} out`), or "
        "run as its owner (`docker run --user \"$(id -u):$(id -g)\" -v \"$PWD/out:/data\" …`; rootless "
        "podman: `--userns=keep-id`)")


def _live_url(store: Path) -> str | None:
    """The URL of a server already serving ``store`` (a run in progress), if one is."""
    for ports in (store / "ports").glob("*.ports"):
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            pid = int(ports.stem.rsplit("_", 1)[1])
            if running(pid):
                return str(json.loads(ports.read_text())["nats"][0])
    return None


def reopen(settings: Settings) -> tuple[Settings, Callable[[], None]] | None:
    """Settings that reach the state dir's NATS, and what to call when done; None when NATS is
    configured (``BUSSCRAPE_NATS__URL``) or no embedded run ever kept a store here."""
    store = store_of(settings)
    if settings.nats.url or not (store / "jetstream").is_dir():
        return None
    url = _live_url(store)
    if url is not None:
        return settings.with_overrides(nats={"url": url}), lambda: None
    server = EmbeddedNatsServer(store, binary=settings.nats.server_binary, die_with_parent=True,
                                name="busscrape-state", memory=settings.nats.server_memory)
    server.start()
    log.debug("state.nats_started", store=str(store), url=server.url)
    return settings.with_overrides(nats={"url": server.url}), server.stop
