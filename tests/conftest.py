"""Shared fixtures: real servers on loopback, fresh state per test.

- ``nats_server``: a real nats-server with JetStream, one per test module (fresh store).
- ``nats_url`` / ``settings`` / ``bus``: per test, on a server wiped clean of every stream, so
  tests never see each other's messages even though stream names are fixed.
- ``applied``: the same, with ``streams apply`` done.
- ``wsettings`` / ``wbus``: a worker's settings for the ``site`` (its addresses allowed, short
  waits, three deliveries), and the bus provisioned from them; ``short_ack``: the same with a
  2 s ack_wait.
- ``s3``: a real S3-protocol server (MinIO in Docker, else moto_server) for the session.
- ``azurite`` / ``gcs``: Azure's and Google's storage emulators for the session (tests/support/clouds.py).
- ``site``: a website served on 127.0.0.2 and 127.0.0.3 (distinct origins).
- ``postgres`` / ``pg_dsn``: a real PostgreSQL for the session, a fresh database per test.
- ``chromium``: one Playwright Chromium for the session, for tests that drive a page directly
  (each opens its own context); such a module runs on the session's event loop
  (``pytest.mark.asyncio(loop_scope="session")``), the loop the browser lives on.

In a parallel run (``make test``: pytest-xdist, ``--dist loadgroup``) every xdist worker is its own
process with its own session: its own servers, on ports the kernel picks, in its own temporary
folders. ``pytest_collection_modifyitems`` below says which tests share a worker and which start
first.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from busscrape.bus import provision, topology
from busscrape.bus.connection import Bus
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from tests.support import environment
from tests.support.chromium import launched
from tests.support.clouds import Azurite, GcsEmulator, azurite_binary
from tests.support.clouds import unavailable as emulator_unavailable
from tests.support.postgres import PostgresServer
from tests.support.postgres import skip_reason as postgres_skip_reason
from tests.support.postgres import unavailable as postgres_unavailable
from tests.support.s3 import S3Server
from tests.support.site import Site
from tests.support.xdist import arrange

if TYPE_CHECKING:
    from playwright.async_api import Browser

pytest_plugins = ["tests.support.timeline", "tests.support.netns"]

# Read before the environment is cleaned: whether PostgreSQL, emulators or containers may be skipped.
ENV_AT_START = environment.AT_START
environment.clean()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    arrange(items)


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


def make_settings(tmp_path: Path, nats_url: str, **sections: dict) -> Settings:
    """Settings for a test: its own state folder, no health port, short waits."""
    base: dict = {
        "state_dir": tmp_path / "state",
        "nats": {"url": nats_url, "connect_timeout": 3},
        "telemetry": {"http_port": None, "log_format": "json"},
        "streams": {"worker_ack_wait": "10s"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return Settings(**base)


async def wipe(bus: Bus) -> None:
    """Delete every stream (and so every consumer and bucket) on the server."""
    names = [info.config.name for info in await bus.js.streams_info()]
    for name in names:
        await bus.js.delete_stream(name)


@pytest.fixture
def nats_url(nats_server: EmbeddedNatsServer) -> str:
    return nats_server.url


@pytest.fixture
def settings(tmp_path: Path, nats_url: str) -> Settings:
    return make_settings(tmp_path, nats_url)


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    b = await Bus.connect(settings, name=f"test-{uuid.uuid4().hex[:6]}")
    await wipe(b)
    yield b
    await b.close()


@pytest.fixture
async def applied(bus: Bus, settings: Settings) -> Bus:
    """A clean server with every stream, consumer and bucket created from streams/."""
    await provision.apply(bus.js, topology.load(settings))
    return bus


@pytest.fixture
def wsettings(tmp_path: Path, nats_url: str, site: Site) -> Settings:
    """A worker's settings for a test: the site's addresses allowed, short waits, three deliveries."""
    return make_settings(
        tmp_path, nats_url,
        network={"allow": [f"{h}/32" for h in site.hosts]},
        worker={"concurrency": 2, "navigation_timeout": "5s", "retry_base_delay": "200ms",
                "retry_max_delay": "1s", "exit_when_idle": "1.5s"},
        streams={"worker_max_deliver": 3},
    )


@pytest.fixture
async def wbus(bus: Bus, wsettings: Settings) -> Bus:
    """A clean server with every stream, consumer and bucket of ``wsettings``."""
    await provision.apply(bus.js, topology.load(wsettings))
    return bus


@pytest.fixture
async def short_ack(wbus: Bus, wsettings: Settings) -> Settings:
    """``wsettings`` with a 2s ack_wait, so a killed attempt's task comes back quickly."""
    short = wsettings.with_overrides(streams={"worker_ack_wait": "2s"})
    await provision.apply(wbus.js, topology.load(short))
    return short


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service (Azure), for the session; skipped only where it is not installed and
    no run requires it (``unavailable``)."""
    if azurite_binary() is None:
        emulator_unavailable("Azurite (npm azurite)", ENV_AT_START)
    server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """gcp-storage-emulator (Google Cloud Storage), for the session."""
    server = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    yield server
    server.stop()


@pytest.fixture
def site() -> Iterator[Site]:
    with Site() as s:
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium() -> AsyncIterator[Browser]:
    """Launched once per test process (per xdist worker) instead of once per test."""
    async with launched() as browser:
        yield browser


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL for the session (skipped only when none is installed: bootstrap installs
    it; in CI that fails instead)."""
    reason = postgres_skip_reason()
    if reason:
        postgres_unavailable(reason, ENV_AT_START)
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
async def pg_dsn(postgres: PostgresServer) -> str:
    """A fresh, empty database on that server, for one test."""
    import asyncpg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin_conn = await asyncpg.connect(postgres.admin_dsn)
    try:
        await admin_conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin_conn.close()
    return postgres.dsn(name)
