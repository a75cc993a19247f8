"""Running busscrape commands as real child processes (for kill -9 and signal tests)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from busscrape.settings import Settings
from tests.support.zygote import ZYGOTE, Forked


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    """The BUSSCRAPE_* environment that reproduces the important parts of ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update({
        "BUSSCRAPE_STATE_DIR": str(settings.state_dir),
        "BUSSCRAPE_NATS__URL": settings.nats.url or "",
        "BUSSCRAPE_NETWORK__ALLOW": json.dumps(settings.network.allow),
        "BUSSCRAPE_TELEMETRY__HTTP_PORT": "none",
        "BUSSCRAPE_TELEMETRY__LOG_FORMAT": "json",
    })
    env.update(extra)
    return env


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes] | Forked:
    """``python -m busscrape ARGS`` in its own process group, output to ``log``: forked from the
    test zygote where it starts the same as a fresh interpreter (tests/support/zygote.py)."""
    if ZYGOTE.can_run(env):
        return ZYGOTE.popen(args, env, log=log, text=False)
    out = open(log, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "busscrape", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def kill9(proc: subprocess.Popen[bytes] | Forked) -> None:
    """SIGKILL the process alone (not its group): a crash, not a tidy shutdown."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def chromium_processes(pool: str = "") -> list[int]:
    """PIDs of running Chromium browser processes started by a busscrape BrowserPool (one pool's,
    when its id is given: other tests may be running browsers of their own)."""
    marker = f"--busscrape-pool={pool}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def pools_in_log(log: Path) -> list[str]:
    """The browser pool ids a worker logged (``browser.launched``)."""
    pools = []
    for line in log.read_text().splitlines():
        if '"browser.launched"' in line:
            pools.append(json.loads(line)["pool"])
    return pools


def leftover_chromium(log: Path, wait: float = 10.0) -> list[int]:
    """Chromium processes of the worker that wrote ``log`` still alive after ``wait`` seconds."""
    pools = pools_in_log(log)
    assert pools, f"no browser.launched line in {log}"
    deadline = time.monotonic() + wait
    while True:
        left = [pid for pool in pools for pid in chromium_processes(pool)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


async def listening_port(log: Path, event: str, proc: subprocess.Popen[bytes] | Forked, timeout: float = 60) -> int:
    """The port a process chose for itself (port 0), from the JSON log line ``event`` it writes
    once it listens (``api.listening``, ``health.listening``). A port picked free by the test and
    handed over can be taken by another test's server before the process binds it, and then that
    server answers the test's requests (or the process gives up the port for another)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else ():
            if f'"{event}"' in line:
                return int(json.loads(line)["port"])
        assert proc.poll() is None, log.read_text()[-3000:]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {event} line within {timeout}s: {log.read_text()[-3000:]}")
