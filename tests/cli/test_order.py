"""What is checked first and what the user is told when NATS is not there, through the real CLI."""

from __future__ import annotations

import socket

from tests.support.cli import busscrape, clean_env


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unreachable(tmp_path, **extra: str) -> dict[str, str]:
    return clean_env(BUSSCRAPE_NATS__URL=f"nats://127.0.0.1:{closed_port()}", BUSSCRAPE_NATS__CONNECT_TIMEOUT="1s",
                     BUSSCRAPE_STATE_DIR=str(tmp_path / "state"), **extra)


def test_the_message_says_the_connect_timeout_that_was_set(tmp_path):
    result = busscrape("status", env=unreachable(tmp_path))
    assert result.returncode == 2
    assert "no connection within 1s)" in result.stderr, result.stderr


def test_a_missing_input_file_is_reported_before_nats_is_asked(tmp_path):
    for command in ("dispatch", "run"):
        result = busscrape(command, str(tmp_path / "nofile.txt"), env=unreachable(tmp_path))
        assert result.returncode == 2, result.stderr
        assert f"error: INPUT {tmp_path / 'nofile.txt'}: No such file or directory" in result.stderr
        assert "NATS" not in result.stderr


def test_run_without_a_server_starts_nothing_for_a_missing_input(tmp_path):
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    result = busscrape("run", str(tmp_path / "nofile.txt"), env=env)
    assert result.returncode == 2 and "No such file or directory" in result.stderr
    assert not (tmp_path / "state" / "nats").exists()  # no embedded nats-server was started for it


def test_run_given_a_server_is_not_told_to_use_run(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("https://example.com/\n")
    env = unreachable(tmp_path)
    result = busscrape("run", str(urls), "--nats-url", env["BUSSCRAPE_NATS__URL"], env=env)
    assert result.returncode == 2
    assert "cannot connect to NATS" in result.stderr and "use `busscrape run`" not in result.stderr
    assert "`busscrape run` starts an embedded nats-server itself" in result.stderr
    other = busscrape("dispatch", str(urls), env=env)  # elsewhere the hint stands
    assert other.returncode == 2 and "use `busscrape run`" in other.stderr
