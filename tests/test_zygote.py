"""The test zygote (tests/support/zygote.py): what it forks behaves as the fresh process it stands for."""

from __future__ import annotations

import os
import signal

from tests.support import environment
from tests.support.cli import clean_env
from tests.support.procs import kill9, spawn
from tests.support.zygote import ZYGOTE, Forked

# Nothing listens on the discard port: a daemon retries its connection for 5 s, then exits 2. The
# ingester, whose start launches no Chromium.
UNREACHABLE = {"BUSSCRAPE_NATS__URL": "nats://127.0.0.1:9", "BUSSCRAPE_NATS__CONNECT_TIMEOUT": "5s"}


def test_a_spawned_daemon_has_its_own_session_its_log_and_its_exit_status(tmp_path):
    log = tmp_path / "i.log"
    log.write_text("before\n")
    proc = spawn(["ingester", "--archive", str(tmp_path / "a")], clean_env(**UNREACHABLE), log)
    assert isinstance(proc, Forked)  # forked, not a fresh interpreter
    assert proc.poll() is None
    assert os.getsid(proc.pid) == proc.pid  # start_new_session: signals to its group reach it alone
    assert proc.wait(60) == 2
    assert proc.poll() == proc.returncode == 2
    text = log.read_text()
    assert text.startswith("before\n")  # appended, as "ab" does
    assert "cannot connect to NATS at nats://127.0.0.1:9" in text  # stderr into the same log


def test_a_signal_ends_a_forked_daemon_and_wait_reports_it_as_popen_does(tmp_path):
    proc = spawn(["ingester", "--archive", str(tmp_path / "a")], clean_env(**UNREACHABLE), tmp_path / "i.log")
    kill9(proc)
    assert proc.returncode == -signal.SIGKILL
    proc.send_signal(signal.SIGTERM)  # once its end is known, a no-op (its pid may be someone else's)


def test_communicate_returns_the_output_of_a_command_left_running(tmp_path):
    proc = ZYGOTE.popen(["ingester", "--archive", "a"], clean_env(**UNREACHABLE), cwd=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err is None
    assert "cannot connect to NATS" in out


def test_fresh_commands_asked_for_at_the_start_of_the_run_are_fresh(monkeypatch, tmp_path):
    # The suite takes BUSSCRAPE_* out of its environment before the tests run: the escape hatch
    # is read from what the run was started with.
    assert ZYGOTE.can_run(clean_env())
    monkeypatch.setitem(environment.AT_START, "BUSSCRAPE_TEST_FRESH_COMMANDS", "1")
    assert not ZYGOTE.can_run(clean_env())
    proc = spawn(["--version"], clean_env(), tmp_path / "version.log")
    assert not isinstance(proc, Forked) and proc.wait(60) == 0
