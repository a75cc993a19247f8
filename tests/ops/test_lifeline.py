"""Pid files of ``busscrape run``: a second run on a state dir whose run is alive is refused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

from tests.support.cli import busscrape, clean_env

RECORD_AND_WAIT = """
import subprocess, sys, time
from pathlib import Path
from busscrape.ops.lifeline import PidFiles
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
PidFiles(Path(sys.argv[1])).record("worker-1", child.pid)
print("recorded", flush=True)
time.sleep(120)
"""


def test_a_run_is_refused_while_the_run_that_owns_the_state_dir_is_alive(tmp_path):
    state = tmp_path / "state"
    owner = subprocess.Popen([sys.executable, "-c", RECORD_AND_WAIT, str(state)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "recorded\n"
        urls = tmp_path / "urls.txt"
        urls.write_text("https://example.com/\n")
        result = busscrape("run", str(urls), env=clean_env(BUSSCRAPE_STATE_DIR=str(state)))
        assert result.returncode == 2, result.stderr
        assert f"another busscrape run (pid {owner.pid}) is using {state}" in result.stderr
        assert list((state / "pids").glob("*.json")), "the live run's pid file was left alone"
        assert not (state / "nats").exists()  # refused before any server was started
    finally:
        owner.kill()
        owner.wait(10)
        for path in (state / "pids").glob("*.json"):  # the owner's own child
            with contextlib.suppress(ProcessLookupError):
                os.kill(json.loads(path.read_text())["pid"], signal.SIGKILL)
