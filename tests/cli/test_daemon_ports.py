"""Two daemons on one host: the default telemetry port gives way, a chosen one that is taken is exit 2."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.support.cli import busscrape, clean_env

DEFAULT_PORT = 9464


@pytest.fixture
def default_port_taken() -> Iterator[None]:
    """Port 9464 held by someone else (this test, or another process already on it)."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", DEFAULT_PORT))
        sock.listen()
    except OSError:
        pass  # already taken by another process: the condition holds all the same
    try:
        yield
    finally:
        sock.close()


def ingester_env(tmp_path, nats_url: str, **extra: str) -> dict[str, str]:
    return clean_env(BUSSCRAPE_NATS__URL=nats_url, BUSSCRAPE_STATE_DIR=str(tmp_path / "state"),
                     BUSSCRAPE_TELEMETRY__LOG_FORMAT="json", **extra)


def events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


async def test_a_daemon_moves_off_the_default_port_when_another_holds_it(applied, nats_url, tmp_path,
                                                                          default_port_taken):
    result = busscrape("ingester", "--exit-when-idle", "1s", "--archive", str(tmp_path / "archive"),
                       env=ingester_env(tmp_path, nats_url))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = events(result.stderr)
    [listening] = [e for e in logged if e["event"] == "health.listening"]
    [taken] = [e for e in logged if e["event"] == "health.port_taken"]
    assert taken["port"] == DEFAULT_PORT and taken["chosen"] == listening["port"] != DEFAULT_PORT


async def test_a_chosen_port_that_is_taken_is_a_clear_configuration_error(applied, nats_url, tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = busscrape("ingester", "--exit-when-idle", "1s", "--archive", str(tmp_path / "archive"),
                           env=ingester_env(tmp_path, nats_url, BUSSCRAPE_TELEMETRY__HTTP_HOST="127.0.0.1",
                                            BUSSCRAPE_TELEMETRY__HTTP_PORT=str(port)))
    finally:
        holder.close()
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"127.0.0.1:{port}" in result.stderr and "BUSSCRAPE_TELEMETRY__HTTP_PORT" in result.stderr
    assert "Traceback" not in result.stderr
