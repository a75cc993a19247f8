import time

import pytest

from busscrape.bus.connection import Bus
from busscrape.errors import EXIT_AUTH, AuthenticationFailed, NatsUnavailable
from busscrape.ops.nats_server import EmbeddedNatsServer
from tests.conftest import make_settings
from tests.support.net import refused_port


async def test_unreachable_server_fails_fast_with_the_fix(tmp_path):
    settings = make_settings(tmp_path, f"nats://127.0.0.1:{refused_port()}", nats={"connect_timeout": 1})
    started = time.monotonic()
    with pytest.raises(NatsUnavailable) as info:
        await Bus.connect(settings, name="t")
    assert time.monotonic() - started < 10
    assert "cannot connect to NATS" in str(info.value) and "BUSSCRAPE_NATS__URL" in str(info.value)


@pytest.fixture
def password_server(tmp_path):
    conf = tmp_path / "auth.conf"
    conf.write_text('authorization { user: "scraper", password: "right-horse" }\n')
    server = EmbeddedNatsServer(tmp_path / "nats", config_file=conf).start()
    yield server
    server.stop()


async def test_user_password_connects(tmp_path, password_server):
    settings = make_settings(tmp_path, password_server.url, nats={"user": "scraper", "password": "right-horse"})
    bus = await Bus.connect(settings, name="t")
    assert bus.nc.is_connected
    await bus.close()


async def test_wrong_password_is_an_authentication_failure(tmp_path, password_server):
    settings = make_settings(tmp_path, password_server.url, nats={"user": "scraper", "password": "wrong"})
    with pytest.raises(AuthenticationFailed) as info:
        await Bus.connect(settings, name="t")
    assert info.value.exit_code == EXIT_AUTH
    assert "wrong" not in str(info.value)
    assert "refused the credentials" in str(info.value)


async def test_missing_credentials_file_is_named(tmp_path, password_server):
    settings = make_settings(tmp_path, password_server.url, nats={"creds_file": str(tmp_path / "nope.creds")})
    with pytest.raises(Exception, match="CREDS_FILE"):
        await Bus.connect(settings, name="t")


WEBSOCKET_CLIENT = """
import asyncio, sys
import busscrape.bus.connection  # noqa: F401  busscrape first, as a busscrape process does
import nats

async def main() -> None:
    before = "aiohttp" in sys.modules
    nc = await nats.connect(sys.argv[1], connect_timeout=10)
    sub = await nc.subscribe("ws.echo")
    await nc.publish("ws.echo", b"over a websocket")
    msg = await sub.next_msg(timeout=10)
    await nc.close()
    print(before, "aiohttp" in sys.modules, msg.data.decode())

asyncio.run(main())
"""


def test_nats_py_loads_aiohttp_only_for_a_websocket_connection_and_it_works(tmp_path):
    # busscrape.optional_imports: nats-py's transport gets aiohttp on first use, not at import.
    import subprocess
    import sys

    from busscrape.ops.nats_server import EmbeddedNatsServer
    from tests.support.net import free_port

    port = free_port()
    config = tmp_path / "ws.conf"
    config.write_text(f"websocket {{\n  host: 127.0.0.1\n  port: {port}\n  no_tls: true\n}}\n")
    with EmbeddedNatsServer(tmp_path / "nats", config_file=config):
        proc = subprocess.run([sys.executable, "-c", WEBSOCKET_CLIENT, f"ws://127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(maxsplit=2) == ["False", "True", "over a websocket\n"]
